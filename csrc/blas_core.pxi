# The GEMM every CPU kernel calls without the GIL: numpy's ILP64 OpenBLAS, else scipy's LP64 cython_blas, both
# through function pointers that pycaffe_dist/backend/blas.py finds and hands over (`use_blas`) as it loads the
# module. Not cimported from scipy.linalg.cython_blas: loading the module would import scipy.linalg, 0.3-0.5 s of
# every process's start. Included by conv_im2col.pyx and gemm.pyx after the `real` fused type (each module holds
# its own pointers).
from libc.stdint cimport int64_t

# Fortran GEMMs of an ILP64 BLAS (64-bit integers), or of an LP64 one (int).
ctypedef void (*sgemm64_t)(const char*, const char*, const int64_t*, const int64_t*, const int64_t*, const float*,
                           const float*, const int64_t*, const float*, const int64_t*, const float*, float*,
                           const int64_t*) noexcept nogil
ctypedef void (*dgemm64_t)(const char*, const char*, const int64_t*, const int64_t*, const int64_t*, const double*,
                           const double*, const int64_t*, const double*, const int64_t*, const double*, double*,
                           const int64_t*) noexcept nogil
ctypedef void (*sgemm32_t)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                           const int*, const float*, const int*, const float*, float*, const int*) noexcept nogil
ctypedef void (*dgemm32_t)(const char*, const char*, const int*, const int*, const int*, const double*,
                           const double*, const int*, const double*, const int*, const double*, double*,
                           const int*) noexcept nogil
cdef sgemm64_t _sgemm64 = NULL
cdef dgemm64_t _dgemm64 = NULL
cdef sgemm32_t _sgemm32 = NULL
cdef dgemm32_t _dgemm32 = NULL


def use_blas(size_t sgemm_address, size_t dgemm_address, bint ilp64):
    """Use these Fortran sgemm/dgemm: ILP64 (64-bit integers, e.g. numpy's OpenBLAS `scipy_sgemm_64_`) or LP64
    (scipy.linalg.cython_blas's)."""
    global _sgemm64, _dgemm64, _sgemm32, _dgemm32
    if sgemm_address == 0 or dgemm_address == 0:
        raise ValueError("use_blas: both GEMMs are needed")
    _sgemm64, _dgemm64, _sgemm32, _dgemm32 = NULL, NULL, NULL, NULL
    if ilp64:
        _sgemm64, _dgemm64 = <sgemm64_t>sgemm_address, <dgemm64_t>dgemm_address
    else:
        _sgemm32, _dgemm32 = <sgemm32_t>sgemm_address, <dgemm32_t>dgemm_address


def blas_in_use():
    """"ilp64", "lp64", or None before use_blas."""
    return "ilp64" if _sgemm64 != NULL else ("lp64" if _sgemm32 != NULL else None)


cdef void _gemm(char transa, char transb, int m, int n, int k, real alpha, const real* a, int lda,
                const real* b, int ldb, real beta, real* c, int ldc) noexcept nogil:
    # (blas.kernel sets the pointers before handing the module out)
    cdef int64_t m64 = m, n64 = n, k64 = k, lda64 = lda, ldb64 = ldb, ldc64 = ldc
    if real is float:
        if _sgemm64 != NULL:
            _sgemm64(&transa, &transb, &m64, &n64, &k64, &alpha, a, &lda64, b, &ldb64, &beta, c, &ldc64)
        else:
            _sgemm32(&transa, &transb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc)
    else:
        if _dgemm64 != NULL:
            _dgemm64(&transa, &transb, &m64, &n64, &k64, &alpha, a, &lda64, b, &ldb64, &beta, c, &ldc64)
        else:
            _dgemm32(&transa, &transb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc)


cdef enum:
    SPLIT_ALIGN = 16             # block boundaries on whole register tiles of the BLAS kernels
    SPLIT_MIN_FLOPS = 1 << 20    # per block: below this a thread costs more than it saves


cdef void _gemm_split(bint trans_a, bint trans_b, Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, real alpha,
                      const real* a, int lda, const real* b, int ldb, real beta, real* c, int ldc,
                      int threads) noexcept nogil:
    # Row-major C (m x n) = alpha op(A) op(B) + beta C, the rows of C (or its columns, whichever are more) split
    # into one contiguous block per thread, each a single-threaded BLAS call (the split depends only on the
    # shapes and `threads`, so reruns give the same bits). Column-major BLAS sees row-major matrices transposed:
    # C^T = op(B)^T op(A)^T. (The including module cimports prange.)
    cdef bint by_rows = m >= n
    cdef Py_ssize_t length = m if by_rows else n
    cdef Py_ssize_t parts = max(1, min(threads, 2 * m * n * k // SPLIT_MIN_FLOPS))
    cdef Py_ssize_t block = ((length + parts - 1) // parts + SPLIT_ALIGN - 1) // SPLIT_ALIGN * SPLIT_ALIGN
    cdef Py_ssize_t part, start, size
    cdef char ta = c'T' if trans_a else c'N'
    cdef char tb = c'T' if trans_b else c'N'
    parts = (length + block - 1) // block
    for part in prange(parts, schedule="static", num_threads=threads, use_threads_if=parts > 1):
        start = part * block
        size = min(block, length - start)
        if by_rows:     # rows [start, start + size) of C: those rows of op(A)
            _gemm(tb, ta, <int>n, <int>size, <int>k, alpha, b, ldb, a + (start if trans_a else start * lda), lda,
                  beta, c + start * ldc, ldc)
        else:           # columns [start, start + size) of C: those columns of op(B)
            _gemm(tb, ta, <int>size, <int>m, <int>k, alpha, b + (start * ldb if trans_b else start), ldb, a, lda,
                  beta, c + start, ldc)
