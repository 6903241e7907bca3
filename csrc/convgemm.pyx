# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Convolution GEMMs chunk by chunk, the chunks in parallel, each with a single-threaded BLAS call.

A chunk of images is unrolled into the batch column layout (rows, n, P) and each group takes ONE GEMM over n * P
columns (better BLAS efficiency than Caffe's per-image GEMMs on small maps). Chunks are independent, so OpenMP
threads take whole chunks; the GEMMs are scipy's BLAS (cython_blas, callable without the GIL), which
pycaffe_dist/backend/conv.py keeps at one thread so the two thread pools never fight over the cores.

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
from scipy.linalg.cython_blas cimport dgemm, sgemm

include "im2col_core.pxi"


cdef void _gemm(char transa, char transb, int m, int n, int k, real alpha, const real* a, int lda,
                const real* b, int ldb, real beta, real* c, int ldc) noexcept nogil:
    if real is float:
        sgemm(&transa, &transb, &m, &n, &k, &alpha, <float*>a, &lda, <float*>b, &ldb, &beta, c, &ldc)
    else:
        dgemm(&transa, &transb, &m, &n, &k, &alpha, <double*>a, &lda, <double*>b, &ldb, &beta, c, &ldc)


cdef void _gather(const real* im, real* padded, const int* index, real* col, int channels, int height, int width,
                  int pad_h, int pad_w, Py_ssize_t rows, Py_ssize_t positions, Py_ssize_t ld) noexcept nogil:
    # im2col of one 2-D image as a gather through the index table (the im2col of the padded image's pixel
    # numbers): for small maps about twice as fast as the row loops, whose rows are only 8 or 16 values long.
    # The padded copy's borders are zero from the start and never written.
    cdef Py_ssize_t c, h, r, q
    cdef int padded_h = height + 2 * pad_h, padded_w = width + 2 * pad_w
    cdef const real* src = im
    cdef real* dst
    cdef const int* idx
    if pad_h or pad_w:
        for c in range(channels):
            for h in range(height):
                memcpy(padded + (c * padded_h + h + pad_h) * padded_w + pad_w, im + (c * height + h) * width,
                       width * sizeof(real))
        src = padded
    for r in range(rows):
        dst = col + r * ld
        idx = index + r * positions
        for q in range(positions):
            dst[q] = src[idx[q]]


def run(const real[::1] im_in, const real[::1] y_in, const real[::1] w, const real[::1] bias,
        real[::1] out, real[::1] im_out, real[::1] dw_partials, real[::1] scratch, const int[::1] index,
        Py_ssize_t num, im_shape, kernel, pad, stride, dilation, bint force_nd,
        int group, int out_channels, Py_ssize_t chunk, int threads):
    """One pass over `num` images in chunks of `chunk` (see the module docstring). Empty arrays mean "not given".
    scratch: threads * ((rows + out_channels) * chunk * P + padded image) values, the padded images' part zero;
    index: the gather table of a 2-D geometry (rows * P entries) or empty for the row loops; dw_partials:
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
    cdef bint gather = index.shape[0] > 0
    cdef Py_ssize_t padded_count = c_im[0] * (c_im[1] + 2 * p[0]) * (c_im[2] + 2 * p[1]) if gather else 0
    cdef Py_ssize_t per_thread = (rows + out_channels) * chunk * positions + padded_count
    cdef Py_ssize_t out_count = out_channels * positions
    if chunk < 1 or threads < 1 or scratch.shape[0] < threads * per_thread or w.shape[0] != out_channels * kg:
        raise ValueError("convgemm.run: scratch, chunk or weights do not fit the geometry")
    if (want_col and im_in.shape[0] != num * im_count) or (want_y and y_in.shape[0] != num * out_count) or \
            (want_out and out.shape[0] != num * out_count) or (want_im and im_out.shape[0] != num * im_count) or \
            (want_dw and dw_partials.shape[0] < threads * w.shape[0]) or \
            (want_bias and bias.shape[0] != out_channels) or \
            (gather and (nax != 2 or force_nd or index.shape[0] != rows * positions)):
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
    cdef real* dst
    cdef const real* src
    cdef real b
    for ci in prange(chunks, nogil=True, schedule="dynamic", num_threads=threads,
                     use_threads_if=threads > 1 and chunks > 1):
        tid = threadid()
        col = &scratch[0] + tid * per_thread
        yt = col + rows * chunk * positions
        n0 = ci * chunk
        nb = min(chunk, num - n0)
        cols = nb * positions
        if want_col:
            for i in range(nb):
                if gather:
                    _gather(&im_in[0] + (n0 + i) * im_count, yt + out_channels * chunk * positions, &index[0],
                            col + i * positions, c_im[0], c_im[1], c_im[2], p[0], p[1], rows, positions, cols)
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
                _one(col + i * positions, &im_out[0] + (n0 + i) * im_count, nax, c_im, c_col, k, p, s, dl, False,
                     force_nd, cols)
