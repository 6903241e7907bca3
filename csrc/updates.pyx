# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The SGD solver's step for one float32 parameter in one pass over memory (numpy takes five, with temporaries):
Regularize (L2) then ComputeUpdateValue, as pycaffe_dist/solver/updates.py's regularize and sgd do them, with the
same float32 operations in the same order (built with -ffp-contract=off: no FMA), so the results are the same bits.
"""


cdef extern from "sgd_step.h" nogil:
    # the step in C, one loop per case, which gcc vectorizes (sgd_step.h)
    void pcd_sgd_step(const float* data, float* diff, float* history, float* applied, long n, float decay,
                      float rate, float momentum)


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
