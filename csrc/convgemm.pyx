# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Convolution GEMMs chunk by chunk, the chunks in parallel, each with a single-threaded BLAS call.

A chunk of images is unrolled into the batch column layout (rows, n, P) and each group takes ONE GEMM over n * P
columns (better BLAS efficiency than Caffe's per-image GEMMs on small maps). Chunks are independent, so OpenMP
threads take whole chunks. The GEMMs are blas_core.pxi's: numpy's OpenBLAS, kept
at one thread (pycaffe_dist/common.py), so that our OpenMP threads are the only ones competing for the cores.

Names follow a convolution: the "image side" is what im2col reads, W is (out_channels, rows / group) per
group, the "output side" is (N, out_channels, P). One pass does any of:
    col = im2col(im_in)                      if im_in is given
    yt  = y_in in column layout (out, n*P)    if y_in is given
    dW_partial[thread] += yt col^T           if dw is given      (a convolution's weight gradient)
    out = W col (+ bias)                     if out is given     (a convolution's forward)
    im_out = col2im(W^T yt)                  if im_out is given  (a convolution's backward; a deconvolution's forward)
"""
from cython.parallel cimport prange, threadid
include "im2col_core.pxi"
include "blas_core.pxi"


cdef extern from *:
    """
    /* Runs of the 2-D unroll and fold: whole 32-byte blocks as one unaligned vector load and store (or add)
       each, then the tail. A runtime-length loop costs an alias check, a vector loop and an epilogue per run,
       too much for LeNet's 8-value runs. __restrict: a run never overlaps its source. */
    #define PCD_RUNS(copy, add, real)                                                                            \
    static inline void copy(real* __restrict dst, const real* __restrict src, int n) {                          \
        int i = 0;                                                                                              \
        for (; i + (int)(32 / sizeof(real)) <= n; i += 32 / sizeof(real)) __builtin_memcpy(dst + i, src + i, 32); \
        for (; i < n; i++) dst[i] = src[i];                                                                     \
    }                                                                                                           \
    static inline void add(real* __restrict dst, const real* __restrict src, int n) {                           \
        typedef real block __attribute__((vector_size(32), aligned(sizeof(real)), may_alias));                 \
        int i = 0;                                                                                              \
        for (; i + (int)(32 / sizeof(real)) <= n; i += 32 / sizeof(real))                                       \
            *(block*)(dst + i) = *(const block*)(dst + i) + *(const block*)(src + i);                           \
        for (; i < n; i++) dst[i] += src[i];                                                                    \
    }
    PCD_RUNS(pcd_copy_run_f, pcd_add_run_f, float)
    PCD_RUNS(pcd_copy_run_d, pcd_add_run_d, double)
    """
    void pcd_copy_run_f(float* dst, const float* src, int n) noexcept nogil
    void pcd_add_run_f(float* dst, const float* src, int n) noexcept nogil
    void pcd_copy_run_d(double* dst, const double* src, int n) noexcept nogil
    void pcd_add_run_d(double* dst, const double* src, int n) noexcept nogil


cdef inline void _copy_run(real* dst, const real* src, int n) noexcept nogil:
    if real is float:
        pcd_copy_run_f(dst, src, n)
    else:
        pcd_copy_run_d(dst, src, n)


cdef inline void _add_run(real* dst, const real* src, int n) noexcept nogil:
    if real is float:
        pcd_add_run_f(dst, src, n)
    else:
        pcd_add_run_d(dst, src, n)


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
    # im2col of one (already padded) 2-D image: every output row is one run of output_w values.
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
                        _copy_run(dst, row, output_w)
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
                        _add_run(row, src, output_w)
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
    min(threads, chunks) * w.size, a sum per thread at work, which the kernel adds to (the caller zeroes and sums
    them, or passes dW itself where one thread works)."""
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
    cdef Py_ssize_t chunks = (num + chunk - 1) // chunk if chunk > 0 else 0, ci, n0, nb, i, m, q, cols
    if chunk < 1 or threads < 1 or scratch.shape[0] < threads * per_thread or w.shape[0] != out_channels * kg:
        raise ValueError("convgemm.run: scratch, chunk or weights do not fit the geometry")
    if (want_col and im_in.shape[0] != num * im_count) or (want_y and y_in.shape[0] != num * out_count) or \
            (want_out and out.shape[0] != num * out_count) or (want_im and im_out.shape[0] != num * im_count) or \
            (want_dw and dw_partials.shape[0] < min(threads, chunks) * w.shape[0]) or \
            (want_bias and bias.shape[0] != out_channels):
        raise ValueError("convgemm.run: array sizes do not match %d images of %r" % (num, tuple(im_shape)))
    if num and ((want_dw or want_out) and not want_col or (want_dw or want_im) and not want_y):
        raise ValueError("convgemm.run: the requested products need im_in / y_in")
    if num == 0 or rows == 0 or positions == 0:
        # Empty sums (no channels in the window, or no positions): images get 0, outputs their bias.
        if want_im:
            im_out[:] = 0
        if want_out:
            for i in range(out.shape[0]):
                out[i] = bias[(i // positions) % out_channels] if want_bias else 0
        return
    cdef int g, tid
    # One chunk (a batch of one, or few large images): the threads split its GEMMs instead.
    cdef int gemm_threads = threads if chunks == 1 else 1
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
                _gemm_split(False, True, mg, kg, cols, 1, yt + g * mg * cols, <int>cols, col + g * kg * cols,
                            <int>cols, 1, &dw_partials[0] + tid * w.shape[0] + g * mg * kg, kg, gemm_threads)
            if want_out:    # prod_g (mg x cols) = W_g (mg x kg) col_g, into the yt buffer
                _gemm_split(False, False, mg, cols, kg, 1, &w[0] + g * mg * kg, kg, col + g * kg * cols, <int>cols,
                            0, yt + g * mg * cols, <int>cols, gemm_threads)
            if want_im:     # dcol_g (kg x cols) = W_g^T yt_g, into the col buffer (its columns are used up)
                _gemm_split(True, False, kg, cols, mg, 1, &w[0] + g * mg * kg, kg, yt + g * mg * cols, <int>cols,
                            0, col + g * kg * cols, <int>cols, gemm_threads)
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
