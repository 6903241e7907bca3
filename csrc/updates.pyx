# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The SGD solver's step for one float32 parameter in one pass over memory (numpy takes five, with temporaries):
Regularize (L2) then ComputeUpdateValue, as pycaffe_dist/solver/updates.py's regularize and sgd do them, with the
same float32 operations in the same order (built with -ffp-contract=off: no FMA), so the results are the same bits.
"""


cdef extern from *:
    """
    /* One loop per case, over restrict pointers, so that gcc vectorizes it (the operations stay the same: no
       FMA under -ffp-contract=off). applied: NULL, or data itself, read before it is written. */
    static void pcd_sgd_step(const float* data, float* restrict diff, float* restrict history, float* applied,
                             long n, float decay, float rate, float momentum) {
        if (decay != 0 && applied) {
            for (long i = 0; i < n; i++) {
                float h = history[i] * momentum + rate * (diff[i] + decay * data[i]);
                history[i] = h; diff[i] = h; applied[i] = data[i] - h;
            }
        } else if (decay != 0) {
            for (long i = 0; i < n; i++) {
                float h = history[i] * momentum + rate * (diff[i] + decay * data[i]);
                history[i] = h; diff[i] = h;
            }
        } else if (applied) {
            for (long i = 0; i < n; i++) {
                float h = history[i] * momentum + rate * diff[i];
                history[i] = h; diff[i] = h; applied[i] = data[i] - h;
            }
        } else {
            for (long i = 0; i < n; i++) {
                float h = history[i] * momentum + rate * diff[i];
                history[i] = h; diff[i] = h;
            }
        }
    }
    """
    void pcd_sgd_step(const float* data, float* diff, float* history, float* applied, long n, float decay,
                      float rate, float momentum) nogil


def sgd_step(float[::1] data, float[::1] diff, float[::1] history, float decay, float rate, float momentum,
             bint apply=False):
    """diff += decay * data (skipped when decay is 0, as Caffe's Regularize); history = momentum * history +
    rate * diff; diff = history. apply: also Net::Update (data -= diff) in the same pass."""
    cdef Py_ssize_t n = diff.shape[0]
    if data.shape[0] != n or history.shape[0] != n:
        raise ValueError("sgd_step: data, diff and history sizes %d, %d, %d differ"
                         % (data.shape[0], n, history.shape[0]))
    if n == 0:
        return
    if &diff[0] == &history[0] or &diff[0] == &data[0] or &history[0] == &data[0]:
        raise ValueError("sgd_step: data, diff and history must be separate arrays")
    with nogil:
        pcd_sgd_step(&data[0], &diff[0], &history[0], &data[0] if apply else NULL, n, decay, rate, momentum)
