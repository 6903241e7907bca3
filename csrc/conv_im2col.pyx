# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Convolution GEMMs chunk by chunk, the chunks in parallel, each with a single-threaded BLAS call: the engine for
any dtype and geometry (float32 2-D geometries take conv_fused.pyx where the build has AVX2 and FMA).

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
include "conv_pass.pxi"


cdef const real* _padded(const real* im, real* padded, int channels, int height, int width, int pad_h,
                         int pad_w) noexcept nogil:
    # The image with its zero border, so that the row copies below need no bounds tests (the image itself
    # where there is no pad).
    if not pad_h and not pad_w:
        return im
    _pad_chunk(im, padded, 1, channels, height, width, pad_h, pad_w)
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


def run(const real[::1] im_in, const real[::1] y_in, const real[::1] w, const real[::1] bias,
        real[::1] out, real[::1] im_out, real[::1] dw_partials, real[::1] scratch,
        Py_ssize_t num, im_shape, kernel, pad, stride, dilation, bint force_nd,
        int group, int out_channels, Py_ssize_t chunk, int threads):
    """One pass over `num` images in chunks of `chunk` (see the module docstring). Empty arrays mean "not given".
    scratch: threads * ((rows + out_channels) * chunk * P + padded image) values;
    2-D geometries (unless force_nd) use conv_pass.pxi's padded row copies, others Caffe's N-d loops; dw_partials:
    min(threads, chunks) * w.size, a sum per thread at work, which the kernel adds to (the caller zeroes and sums
    them, or passes dW itself where one thread works)."""
    cdef Pass ps
    if not _pass(&ps, "conv_im2col", im_in, y_in, w, bias, out, im_out, dw_partials, scratch, num, im_shape, kernel,
                 pad, stride, dilation, force_nd, group, out_channels, chunk, threads):
        return
    cdef int* c_im = ps.c_im
    cdef int* c_col = ps.c_col
    cdef int* k = ps.k
    cdef int* p = ps.p
    cdef int* s = ps.s
    cdef int* dl = ps.dl
    cdef int nax = ps.nax
    cdef Py_ssize_t im_count = ps.im_count, rows = ps.rows, positions = ps.positions, out_count = ps.out_count
    cdef Py_ssize_t per_thread = ps.per_thread, chunks = ps.chunks, ci, n0, nb, i, m, q, cols
    cdef int mg = ps.mg, kg = ps.kg
    cdef bint want_col = ps.want_col, want_y = ps.want_y, want_dw = ps.want_dw, want_out = ps.want_out
    cdef bint want_im = ps.want_im, want_bias = ps.want_bias, rows2d = ps.rows2d
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

