# What the two convolution engines share, included by conv_im2col.pyx (any dtype: unrolled columns and BLAS GEMMs)
# and conv_fused.pyx (float32 2-D: sgemm.h reads the images and output diffs in place) after the `real` fused type
# and im2col_geometry.pxi:
# - _pass: the checks of a run()'s arguments against the geometry, and the passes that are empty sums;
# - the 2-D row copies both engines make, by runs of output_w values: the padding of images, and the fold
#   (col2im) of one image's columns into its diff (conv_im2col.pyx has the unroll, im2col, that only it needs).
from libc.stddef cimport ptrdiff_t
from libc.string cimport memcpy, memset


cdef extern from "fold8.h" nogil:
    int pcd_fold8_fits(int output_w, int stride_w, int padded_w)
    void pcd_fold8(const float* col, ptrdiff_t ld, float* padded, int channels, int padded_h, int padded_w,
                   int kernel_h, int kernel_w, int stride_h, int dilation_h, int dilation_w, int output_h,
                   int output_w)


cdef extern from "row_runs.h" nogil:
    # runs of consecutive values, for the unroll and the fold (whole 32-byte blocks, then the tail)
    void pcd_copy_run_f(float* dst, const float* src, int n)
    void pcd_add_run_f(float* dst, const float* src, int n)
    void pcd_copy_run_d(double* dst, const double* src, int n)
    void pcd_add_run_d(double* dst, const double* src, int n)


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


cdef void _pad_chunk(const real* im, real* padded, Py_ssize_t nb, int channels, int height, int width, int pad_h,
                     int pad_w) noexcept nogil:
    # nb images with their zero borders, every element written (so a buffer shared by geometries needs no care)
    cdef int padded_h = height + 2 * pad_h, padded_w = width + 2 * pad_w, h
    cdef Py_ssize_t plane, planes = nb * channels
    for plane in range(planes):
        memset(padded, 0, pad_h * padded_w * sizeof(real))
        padded += pad_h * padded_w
        for h in range(height):
            memset(padded, 0, pad_w * sizeof(real))
            memcpy(padded + pad_w, im, width * sizeof(real))
            memset(padded + pad_w + width, 0, pad_w * sizeof(real))
            padded += padded_w
            im += width
        memset(padded, 0, pad_h * padded_w * sizeof(real))
        padded += pad_h * padded_w


cdef void _fold_rows(const real* col, real* acc, int channels, int padded_h, int padded_w, int kernel_h,
                     int kernel_w, int stride_h, int stride_w, int dilation_h, int dilation_w, int output_h,
                     int output_w, Py_ssize_t ld) noexcept nogil:
    # Caffe's col2im order: each column row (c, kh, kw) added into the padded image, row by output row
    cdef Py_ssize_t c, kh, kw, oh, ow
    cdef real* row
    cdef const real* src
    memset(acc, 0, <Py_ssize_t>channels * padded_h * padded_w * sizeof(real))
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


cdef void _fold(const real* col, real* im, real* padded, int channels, int height, int width, int pad_h, int pad_w,
                int kernel_h, int kernel_w, int stride_h, int stride_w, int dilation_h, int dilation_w,
                int output_h, int output_w, Py_ssize_t ld) noexcept nogil:
    # col2im of one 2-D image: sums into the padded buffer (or straight into the image when there is no pad),
    # then copies the interior out. The buffer may hold an image unrolled in this pass: it is written whole.
    cdef int padded_h = height + 2 * pad_h, padded_w = width + 2 * pad_w, c, h
    cdef bint has_pad = pad_h or pad_w
    cdef real* acc = padded if has_pad else im
    if real is float and pcd_fold8_fits(output_w, stride_w, padded_w):
        # rows of at most 8 outputs (fold8.h): summed in registers, each padded row stored once
        pcd_fold8(col, ld, acc, channels, padded_h, padded_w, kernel_h, kernel_w, stride_h, dilation_h,
                  dilation_w, output_h, output_w)
    else:
        _fold_rows(col, acc, channels, padded_h, padded_w, kernel_h, kernel_w, stride_h, stride_w, dilation_h,
                   dilation_w, output_h, output_w, ld)
    if has_pad:
        for c in range(channels):
            for h in range(height):
                memcpy(im + (c * height + h) * width, padded + (c * padded_h + h + pad_h) * padded_w + pad_w,
                       width * sizeof(real))



cdef struct Pass:
    # One run()'s geometry, as im2col_core.pxi's _geometry gives it, and the sizes the engines derive from it.
    int c_im[MAX_AXES]
    int c_col[MAX_AXES]
    int k[MAX_AXES]
    int p[MAX_AXES]
    int s[MAX_AXES]
    int dl[MAX_AXES]
    int nax                 # spatial axes
    bint rows2d             # 2-D (unless force_nd): the row copies below, else Caffe's N-d loops
    int mg, kg              # a group's output channels and column rows
    Py_ssize_t im_count, rows, positions, out_count, per_thread, chunks
    bint want_col, want_y, want_dw, want_out, want_im, want_bias   # which arrays were given (not empty)


cdef int _pass(Pass* ps, str engine, const real[::1] im_in, const real[::1] y_in, const real[::1] w,
               const real[::1] bias, real[::1] out, real[::1] im_out, real[::1] dw_partials, real[::1] scratch,
               Py_ssize_t num, im_shape, kernel, pad, stride, dilation, bint force_nd, int group, int out_channels,
               Py_ssize_t chunk, int threads) except -1:
    # Fills `ps` and checks run()'s arrays against it (ValueError). Returns 1 where the pass has products to
    # compute, 0 where it is an empty sum, whose outputs are then written here.
    cdef int* c_im = ps.c_im
    cdef int* c_col = ps.c_col
    cdef int* p = ps.p
    ps.nax = _geometry(tuple(im_shape), tuple(kernel), tuple(pad), tuple(stride), tuple(dilation), c_im, c_col,
                       ps.k, p, ps.s, ps.dl)
    cdef Py_ssize_t im_count = _prod(c_im, ps.nax + 1), rows = c_col[0], positions = _prod(c_col + 1, ps.nax)
    cdef int mg = out_channels // group, kg = <int>(rows // group)
    cdef bint want_col = im_in.shape[0] > 0, want_y = y_in.shape[0] > 0, want_dw = dw_partials.shape[0] > 0
    cdef bint want_out = out.shape[0] > 0, want_im = im_out.shape[0] > 0, want_bias = bias.shape[0] > 0
    cdef bint rows2d = ps.nax == 2 and not force_nd
    cdef Py_ssize_t padded_count = c_im[0] * (c_im[1] + 2 * p[0]) * (c_im[2] + 2 * p[1]) if rows2d else 0
    cdef Py_ssize_t per_thread = (rows + out_channels) * chunk * positions + padded_count
    cdef Py_ssize_t out_count = out_channels * positions
    cdef Py_ssize_t chunks = (num + chunk - 1) // chunk if chunk > 0 else 0, i
    ps.rows2d, ps.im_count, ps.rows, ps.positions, ps.out_count = rows2d, im_count, rows, positions, out_count
    ps.per_thread, ps.chunks, ps.mg, ps.kg = per_thread, chunks, mg, kg
    ps.want_col, ps.want_y, ps.want_dw, ps.want_out, ps.want_im, ps.want_bias = \
        want_col, want_y, want_dw, want_out, want_im, want_bias
    if chunk < 1 or threads < 1 or scratch.shape[0] < threads * per_thread or w.shape[0] != out_channels * kg:
        raise ValueError("%s.run: scratch, chunk or weights do not fit the geometry" % engine)
    if (want_col and im_in.shape[0] != num * im_count) or (want_y and y_in.shape[0] != num * out_count) or \
            (want_out and out.shape[0] != num * out_count) or (want_im and im_out.shape[0] != num * im_count) or \
            (want_dw and dw_partials.shape[0] < min(threads, chunks) * w.shape[0]) or \
            (want_bias and bias.shape[0] != out_channels):
        raise ValueError("%s.run: array sizes do not match %d images of %r" % (engine, num, tuple(im_shape)))
    if num == 0 or rows == 0 or positions == 0 or im_count == 0 or out_channels == 0:
        # Empty sums (no channels in the window, no output channels, no positions or an empty image: Caffe's sizes
        # can be 0, and then the arrays of that side arrive empty): images get 0, outputs their bias, dW nothing.
        if want_im:
            im_out[:] = 0
        if want_out:
            for i in range(out.shape[0]):
                out[i] = bias[(i // positions) % out_channels] if want_bias else 0
        return 0
    if (want_dw or want_out) and not want_col or (want_dw or want_im) and not want_y:
        raise ValueError("%s.run: the requested products need im_in / y_in" % engine)
    return 1
