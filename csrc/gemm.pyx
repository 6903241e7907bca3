# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Row-major GEMM split across our OpenMP threads (blas_core.pxi's _gemm_split), for InnerProduct.

numpy's OpenBLAS keeps a thread pool of its own whose threads spin for a while after each call: beside our
OpenMP threads (convolution, pooling, element-wise kernels) the two pools fight over the cores, and a net ran
slower on 2 threads than on 1. So BLAS stays at one thread (pycaffe_dist/common.py) and our threads split the
GEMMs. beta = 1 accumulates into C, as Caffe's weight gradients do, without a temporary.
"""
from cython.parallel cimport prange

ctypedef fused real:
    float
    double

include "blas_core.pxi"


def gemm(bint trans_a, bint trans_b, double alpha, const real[:, ::1] a, const real[:, ::1] b, double beta,
         real[:, ::1] c, int threads):
    """c = alpha op(a) op(b) + beta c for C-contiguous 2-D arrays, op(x) = x^T where trans_* is set."""
    cdef Py_ssize_t m = c.shape[0], n = c.shape[1], i, j
    cdef Py_ssize_t k = a.shape[0] if trans_a else a.shape[1]
    if (a.shape[1] if trans_a else a.shape[0]) != m or (b.shape[1] if trans_b else b.shape[0]) != k or \
            (b.shape[0] if trans_b else b.shape[1]) != n:
        raise ValueError("gemm: op(a) %s, op(b) %s and c %s do not fit"
                         % ((a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1]),
                            (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1]), (m, n)))
    if m == 0 or n == 0:
        return
    if k == 0:      # an empty sum: BLAS would not be called with k = 0 by every implementation
        for i in range(m):
            for j in range(n):
                c[i, j] = <real>(beta * c[i, j]) if beta != 0 else 0
        return
    with nogil:
        _gemm_split(trans_a, trans_b, m, n, k, <real>alpha, &a[0, 0], <int>a.shape[1], &b[0, 0], <int>b.shape[1],
                    <real>beta, &c[0, 0], <int>n, max(1, threads))
