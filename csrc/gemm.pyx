# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Row-major GEMM split across our OpenMP threads (blas_core.pxi's _gemm_split), for InnerProduct.

numpy's OpenBLAS keeps a thread pool of its own whose threads spin for a while after each call: beside our
OpenMP threads (convolution, pooling, element-wise kernels) the two pools fight over the cores, and a net ran
slower on 2 threads than on 1. So BLAS stays at one thread (pycaffe_dist/common.py) and our threads split the
GEMMs. beta = 1 accumulates into C, as Caffe's weight gradients do, without a temporary.

float32 products with alpha = 1 and beta 0 or 1 (all of InnerProduct's) take sgemm.h's GEMM where the build has
it (_sgemm_split): numpy's OpenBLAS runs its 8-float AVX2 kernel on AVX-512 machines too (a Zen 5 is a "Haswell"
to it), ours the 16-float one there (half the time of LeNet's ip1).
"""
from cython.parallel cimport prange
from libc.stdlib cimport free, malloc

ctypedef fused real:
    float
    double

include "blas_core.pxi"
include "sgemm.pxi"


cdef extern from "thread_buffer.h" nogil:
    float* pcd_thread_buffer(int slot, size_t floats)   # slot 0: sgemm.h's packing space


cdef int _sgemm_split(bint trans_a, bint trans_b, Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, const float* a,
                      Py_ssize_t lda, const float* b, Py_ssize_t ldb, bint accumulate, float* c, Py_ssize_t ldc,
                      int threads) except -1 nogil:
    # Row-major C (m x n) = op(A) op(B) (+ C) through sgemm.h's offset tables (element (i, j) of a row-major X
    # is x[i * ld + j], of its transpose x[j * ld + i]); C's rows (or columns, whichever are more) split into one
    # block per thread, as _gemm_split does (the same bits on any number of threads: each element is summed by
    # one thread, in the same order).
    cdef Py_ssize_t longest = max(m, max(n, k)), i, part, start, size
    cdef ptrdiff_t* t = <ptrdiff_t*>malloc(4 * (longest + 1) * sizeof(ptrdiff_t))
    if t == NULL:
        with gil:
            raise MemoryError()
    cdef ptrdiff_t* iota = t
    cdef ptrdiff_t* by_lda = t + longest + 1
    cdef ptrdiff_t* by_ldb = t + 2 * (longest + 1)
    cdef ptrdiff_t* by_ldc = t + 3 * (longest + 1)
    for i in range(longest + 1):
        iota[i], by_lda[i], by_ldb[i], by_ldc[i] = i, i * lda, i * ldb, i * ldc
    cdef const ptrdiff_t* a_row = iota if trans_a else by_lda      # op(A)[i, p]
    cdef const ptrdiff_t* a_col = by_lda if trans_a else iota
    cdef const ptrdiff_t* b_row = iota if trans_b else by_ldb      # op(B)[p, j]
    cdef const ptrdiff_t* b_col = by_ldb if trans_b else iota
    cdef bint by_rows = m >= n
    cdef Py_ssize_t length = m if by_rows else n
    cdef Py_ssize_t parts = max(1, min(threads, 2 * m * n * k // SPLIT_MIN_FLOPS))
    cdef Py_ssize_t block = ((length + parts - 1) // parts + PCD_NR_ALIGN - 1) // PCD_NR_ALIGN * PCD_NR_ALIGN
    parts = (length + block - 1) // block
    for part in prange(parts, schedule="static", num_threads=threads, use_threads_if=parts > 1):
        start = part * block
        size = min(block, length - start)
        if by_rows:
            pcd_sgemm(<int>size, <int>n, <int>k, _operand(a, a_row + start, a_col), NULL,
                      _operand(b, b_row, b_col), _result(c, by_ldc + start, iota, NULL, accumulate),
                      pcd_thread_buffer(0, PCD_SGEMM_PACK_FLOATS))
        else:
            pcd_sgemm(<int>m, <int>size, <int>k, _operand(a, a_row, a_col), NULL,
                      _operand(b, b_row, b_col + start), _result(c, by_ldc, iota + start, NULL, accumulate),
                      pcd_thread_buffer(0, PCD_SGEMM_PACK_FLOATS))
    free(t)
    return 0


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
    if real is float:
        if PCD_SGEMM and alpha == 1.0 and (beta == 0.0 or beta == 1.0):
            with nogil:
                _sgemm_split(trans_a, trans_b, m, n, k, &a[0, 0], a.shape[1], &b[0, 0], b.shape[1], beta == 1.0,
                             &c[0, 0], n, max(1, threads))
            return
    with nogil:
        _gemm_split(trans_a, trans_b, m, n, k, <real>alpha, &a[0, 0], <int>a.shape[1], &b[0, 0], <int>b.shape[1],
                    <real>beta, &c[0, 0], <int>n, max(1, threads))
