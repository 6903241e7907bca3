# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Convolution GEMMs chunk by chunk, the chunks in parallel, each with a single-threaded BLAS call.

A chunk of images is unrolled into the batch column layout (rows, n, P) and each group takes ONE GEMM over n * P
columns (better BLAS efficiency than Caffe's per-image GEMMs on small maps). Chunks are independent, so OpenMP
threads take whole chunks. The GEMMs go to numpy's OpenBLAS through function pointers that
pycaffe_dist/backend/conv.py finds (`use_blas`): for our shapes it runs 1.5-3x faster than scipy's OpenBLAS
build, whose cython_blas remains the fallback. While several chunks run in parallel the caller keeps BLAS at one
thread, so that the two thread pools never fight over the cores.

Names follow a convolution: the "image side" is what im2col reads, W is (out_channels, rows / group) per
group, the "output side" is (N, out_channels, P). One pass does any of:
    col = im2col(im_in)                      if im_in is given
    yt  = y_in in column layout (out, n*P)    if y_in is given
    dW_partial[thread] += yt col^T           if dw is given      (a convolution's weight gradient)
    out = W col (+ bias)                     if out is given     (a convolution's forward)
    im_out = col2im(W^T yt)                  if im_out is given  (a convolution's backward; a deconvolution's forward)
BLAS is column-major: a row-major (r x c) matrix is a column-major (c x r) one with leading dimension c.
"""
from cython.parallel cimport prange, threadid
from libc.stdint cimport int64_t
from scipy.linalg.cython_blas cimport dgemm, sgemm

include "im2col_core.pxi"

# Fortran GEMMs of an ILP64 BLAS (64-bit integers), or NULL for scipy's LP64 cython_blas.
ctypedef void (*sgemm64_t)(const char*, const char*, const int64_t*, const int64_t*, const int64_t*, const float*,
                           const float*, const int64_t*, const float*, const int64_t*, const float*, float*,
                           const int64_t*) noexcept nogil
ctypedef void (*dgemm64_t)(const char*, const char*, const int64_t*, const int64_t*, const int64_t*, const double*,
                           const double*, const int64_t*, const double*, const int64_t*, const double*, double*,
                           const int64_t*) noexcept nogil
cdef sgemm64_t _sgemm64 = NULL
cdef dgemm64_t _dgemm64 = NULL


def use_blas(size_t sgemm64_address, size_t dgemm64_address):
    """Use these ILP64 Fortran sgemm/dgemm (addresses of e.g. numpy's OpenBLAS `scipy_sgemm_64_`); 0, 0 goes back
    to scipy's cython_blas."""
    global _sgemm64, _dgemm64
    if (sgemm64_address == 0) != (dgemm64_address == 0):
        raise ValueError("use_blas: give both GEMMs or neither")
    _sgemm64 = <sgemm64_t>sgemm64_address
    _dgemm64 = <dgemm64_t>dgemm64_address


cdef void _gemm(char transa, char transb, int m, int n, int k, real alpha, const real* a, int lda,
                const real* b, int ldb, real beta, real* c, int ldc) noexcept nogil:
    cdef int64_t m64 = m, n64 = n, k64 = k, lda64 = lda, ldb64 = ldb, ldc64 = ldc
    if real is float:
        if _sgemm64 != NULL:
            _sgemm64(&transa, &transb, &m64, &n64, &k64, &alpha, a, &lda64, b, &ldb64, &beta, c, &ldc64)
        else:
            sgemm(&transa, &transb, &m, &n, &k, &alpha, <float*>a, &lda, <float*>b, &ldb, &beta, c, &ldc)
    else:
        if _dgemm64 != NULL:
            _dgemm64(&transa, &transb, &m64, &n64, &k64, &alpha, a, &lda64, b, &ldb64, &beta, c, &ldc64)
        else:
            dgemm(&transa, &transb, &m, &n, &k, &alpha, <double*>a, &lda, <double*>b, &ldb, &beta, c, &ldc)


cdef const real* _padded(const real* im, real* padded, int channels, int height, int width, int pad_h,
                         int pad_w) noexcept nogil:
    # The image with its zero border, so that the row copies below need no bounds tests. The border of `padded`
    # is zero from the start and never written here (_fold leaves the buffer zero again).
    cdef Py_ssize_t c, h
    cdef int padded_h = height + 2 * pad_h, padded_w = width + 2 * pad_w
    if not pad_h and not pad_w:
        return im
    for c in range(channels):
        for h in range(height):
            memcpy(padded + (c * padded_h + h + pad_h) * padded_w + pad_w, im + (c * height + h) * width,
                   width * sizeof(real))
    return padded


cdef void _unroll(const real* src, int channels, int height, int width, int kernel_h, int kernel_w,
                  int stride_h, int stride_w, int dilation_h, int dilation_w, int output_h, int output_w,
                  real* col, Py_ssize_t ld) noexcept nogil:
    # im2col of one (already padded) 2-D image: every output row is one run of output_w values, copied by a
    # loop the compiler vectorizes (a memcpy call or an index gather costs more than LeNet's 8-value runs).
    cdef Py_ssize_t c, kh, kw, oh, ow
    cdef const real* row
    cdef real* dst
    for c in range(channels):
        for kh in range(kernel_h):
            for kw in range(kernel_w):
                dst = col
                col += ld
                for oh in range(output_h):
                    row = src + (c * height + oh * stride_h + kh * dilation_h) * width + kw * dilation_w
                    if stride_w == 1:
                        for ow in range(output_w):
                            dst[ow] = row[ow]
                    else:
                        for ow in range(output_w):
                            dst[ow] = row[ow * stride_w]
                    dst += output_w


cdef void _fold(const real* col, real* im, real* padded, int channels, int height, int width, int pad_h, int pad_w,
                int kernel_h, int kernel_w, int stride_h, int stride_w, int dilation_h, int dilation_w,
                int output_h, int output_w, Py_ssize_t ld) noexcept nogil:
    # col2im of one 2-D image: sums into the padded buffer (or straight into the image when there is no pad),
    # then copies the interior out. The buffer may hold an image unrolled in this pass: it is cleared before,
    # and after, since _padded expects zero borders.
    cdef int padded_h = height + 2 * pad_h, padded_w = width + 2 * pad_w
    cdef Py_ssize_t c, h, kh, kw, oh, ow, padded_count = <Py_ssize_t>channels * padded_h * padded_w
    cdef bint has_pad = pad_h or pad_w
    cdef real* acc = padded if has_pad else im
    cdef real* row
    cdef const real* src
    memset(acc, 0, padded_count * sizeof(real))
    for c in range(channels):
        for kh in range(kernel_h):
            for kw in range(kernel_w):
                src = col
                col += ld
                for oh in range(output_h):
                    row = acc + (c * padded_h + oh * stride_h + kh * dilation_h) * padded_w + kw * dilation_w
                    if stride_w == 1:
                        for ow in range(output_w):
                            row[ow] += src[ow]
                    else:
                        for ow in range(output_w):
                            row[ow * stride_w] += src[ow]
                    src += output_w
    if has_pad:
        for c in range(channels):
            for h in range(height):
                memcpy(im + (c * height + h) * width, padded + (c * padded_h + h + pad_h) * padded_w + pad_w,
                       width * sizeof(real))
        memset(padded, 0, padded_count * sizeof(real))


def run(const real[::1] im_in, const real[::1] y_in, const real[::1] w, const real[::1] bias,
        real[::1] out, real[::1] im_out, real[::1] dw_partials, real[::1] scratch,
        Py_ssize_t num, im_shape, kernel, pad, stride, dilation, bint force_nd,
        int group, int out_channels, Py_ssize_t chunk, int threads):
    """One pass over `num` images in chunks of `chunk` (see the module docstring). Empty arrays mean "not given".
    scratch: threads * ((rows + out_channels) * chunk * P + padded image) values, the padded images' part zero;
    2-D geometries (unless force_nd) use the padded row copies above, others Caffe's N-d loops; dw_partials:
    threads * w.size, zeroed by the caller and summed over threads afterwards."""
    cdef int c_im[MAX_AXES]
    cdef int c_col[MAX_AXES]
    cdef int k[MAX_AXES]
    cdef int p[MAX_AXES]
    cdef int s[MAX_AXES]
    cdef int dl[MAX_AXES]
    cdef int nax = _geometry(tuple(im_shape), tuple(kernel), tuple(pad), tuple(stride), tuple(dilation), c_im,
                             c_col, k, p, s, dl)
    cdef Py_ssize_t im_count = _prod(c_im, nax + 1), rows = c_col[0], positions = _prod(c_col + 1, nax)
    cdef int mg = out_channels // group, kg = <int>(rows // group)
    cdef bint want_col = im_in.shape[0] > 0, want_y = y_in.shape[0] > 0, want_dw = dw_partials.shape[0] > 0
    cdef bint want_out = out.shape[0] > 0, want_im = im_out.shape[0] > 0, want_bias = bias.shape[0] > 0
    cdef bint rows2d = nax == 2 and not force_nd
    cdef Py_ssize_t padded_count = c_im[0] * (c_im[1] + 2 * p[0]) * (c_im[2] + 2 * p[1]) if rows2d else 0
    cdef Py_ssize_t per_thread = (rows + out_channels) * chunk * positions + padded_count
    cdef Py_ssize_t out_count = out_channels * positions
    if chunk < 1 or threads < 1 or scratch.shape[0] < threads * per_thread or w.shape[0] != out_channels * kg:
        raise ValueError("convgemm.run: scratch, chunk or weights do not fit the geometry")
    if (want_col and im_in.shape[0] != num * im_count) or (want_y and y_in.shape[0] != num * out_count) or \
            (want_out and out.shape[0] != num * out_count) or (want_im and im_out.shape[0] != num * im_count) or \
            (want_dw and dw_partials.shape[0] < threads * w.shape[0]) or \
            (want_bias and bias.shape[0] != out_channels):
        raise ValueError("convgemm.run: array sizes do not match %d images of %r" % (num, tuple(im_shape)))
    if num and ((want_dw or want_out) and not want_col or (want_dw or want_im) and not want_y):
        raise ValueError("convgemm.run: the requested products need im_in / y_in")
    cdef Py_ssize_t chunks = (num + chunk - 1) // chunk, ci, n0, nb, i, m, q, cols
    if num == 0 or rows == 0 or positions == 0:
        # Empty sums (no channels in the window, or no positions): images get 0, outputs their bias.
        if want_im:
            im_out[:] = 0
        if want_out:
            for i in range(out.shape[0]):
                out[i] = bias[(i // positions) % out_channels] if want_bias else 0
        return
    cdef int g, tid
    cdef real* col
    cdef real* yt
    cdef real* padded
    cdef real* dst
    cdef const real* src
    cdef real b
    for ci in prange(chunks, nogil=True, schedule="dynamic", num_threads=threads,
                     use_threads_if=threads > 1 and chunks > 1):
        tid = threadid()
        col = &scratch[0] + tid * per_thread
        yt = col + rows * chunk * positions
        padded = yt + out_channels * chunk * positions
        n0 = ci * chunk
        nb = min(chunk, num - n0)
        cols = nb * positions
        if want_col:
            for i in range(nb):
                if rows2d:
                    _unroll(_padded(&im_in[0] + (n0 + i) * im_count, padded, c_im[0], c_im[1], c_im[2], p[0], p[1]),
                            c_im[0], c_im[1] + 2 * p[0], c_im[2] + 2 * p[1], k[0], k[1], s[0], s[1], dl[0], dl[1],
                            c_col[1], c_col[2], col + i * positions, cols)
                else:
                    _one(&im_in[0] + (n0 + i) * im_count, col + i * positions, nax, c_im, c_col, k, p, s, dl,
                         True, force_nd, cols)
        if want_y:   # (nb, out, P) -> (out, nb * P)
            for i in range(nb):
                for m in range(out_channels):
                    src = &y_in[0] + ((n0 + i) * out_channels + m) * positions
                    dst = yt + m * cols + i * positions
                    for q in range(positions):
                        dst[q] = src[q]
        for g in range(group):
            if want_dw:     # dW_g (mg x kg) += yt_g (mg x cols) col_g^T
                _gemm(c'T', c'N', kg, mg, <int>cols, 1, col + g * kg * cols, <int>cols,
                      yt + g * mg * cols, <int>cols, 1, &dw_partials[0] + tid * w.shape[0] + g * mg * kg, kg)
            if want_out:    # prod_g (mg x cols) = W_g (mg x kg) col_g, into the yt buffer
                _gemm(c'N', c'N', <int>cols, mg, kg, 1, col + g * kg * cols, <int>cols, &w[0] + g * mg * kg, kg,
                      0, yt + g * mg * cols, <int>cols)
            if want_im:     # dcol_g (kg x cols) = W_g^T yt_g, into the col buffer (its columns are used up)
                _gemm(c'N', c'T', <int>cols, kg, mg, 1, yt + g * mg * cols, <int>cols, &w[0] + g * mg * kg, kg,
                      0, col + g * kg * cols, <int>cols)
        if want_out:        # (out, nb * P) -> (nb, out, P), plus the bias
            for i in range(nb):
                for m in range(out_channels):
                    src = yt + m * cols + i * positions
                    dst = &out[0] + ((n0 + i) * out_channels + m) * positions
                    b = bias[m] if want_bias else 0
                    for q in range(positions):
                        dst[q] = src[q] + b
        if want_im:
            for i in range(nb):
                if rows2d:
                    _fold(col + i * positions, &im_out[0] + (n0 + i) * im_count, padded, c_im[0], c_im[1], c_im[2],
                          p[0], p[1], k[0], k[1], s[0], s[1], dl[0], dl[1], c_col[1], c_col[2], cols)
                else:
                    _one(col + i * positions, &im_out[0] + (n0 + i) * im_count, nax, c_im, c_col, k, p, s, dl,
                         False, force_nd, cols)
