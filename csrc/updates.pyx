# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The SGD solver's step for one float32 parameter in one pass over memory (numpy takes five, with temporaries):
Regularize (L2) then ComputeUpdateValue, as pycaffe_dist/solver/updates.py's regularize and sgd do them, with the
same float32 operations in the same order (built with -ffp-contract=off: no FMA), so the results are the same bits.
"""


def sgd_step(const float[::1] data, float[::1] diff, float[::1] history, float decay, float rate, float momentum):
    """diff += decay * data (skipped when decay is 0, as Caffe's Regularize); history = momentum * history +
    rate * diff; diff = history."""
    cdef Py_ssize_t i, n = diff.shape[0]
    cdef float d, h
    if data.shape[0] != n or history.shape[0] != n:
        raise ValueError("sgd_step: data, diff and history sizes %d, %d, %d differ"
                         % (data.shape[0], n, history.shape[0]))
    with nogil:
        if decay != 0:
            for i in range(n):
                d = diff[i] + decay * data[i]
                h = history[i] * momentum + rate * d
                history[i] = h
                diff[i] = h
        else:
            for i in range(n):
                h = history[i] * momentum + rate * diff[i]
                history[i] = h
                diff[i] = h
