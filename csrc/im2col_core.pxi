# The nogil cores of im2col / col2im (Caffe's im2col_cpu, col2im_cpu, im2col_nd_core_cpu) with their geometry
# (im2col_geometry.pxi), included by im2col.pyx (the Python entry points) and conv_im2col.pyx (which unrolls and
# multiplies chunk by chunk).
from libc.string cimport memcpy, memset

ctypedef fused real:
    float
    double

include "im2col_geometry.pxi"

cdef enum:
    PARALLEL_MIN = 65536  # elements to copy before threads pay for their start-up (and for a busy machine)


cdef inline bint _inside(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    # Caffe's is_a_ge_zero_and_a_lt_b: 0 <= a < b
    return 0 <= a < b


cdef inline void _valid_range(int offset, int stride, int size, int output, int* lo, int* hi) noexcept nogil:
    # The output positions o with 0 <= o * stride + offset < size, as [lo, hi): the loops below copy (or add)
    # that run without a bounds test per element, and zero the rest.
    cdef int a = 0 if offset >= 0 else (-offset + stride - 1) // stride
    cdef int b = (size - offset + stride - 1) // stride if size > offset else 0
    lo[0] = min(max(a, 0), output)
    hi[0] = min(max(b, lo[0]), output)


cdef void _im2col_2d(const real* im, int channels, int height, int width, int kernel_h, int kernel_w,
                     int pad_h, int pad_w, int stride_h, int stride_w, int dilation_h, int dilation_w,
                     int output_h, int output_w, real* col, Py_ssize_t ld) noexcept nogil:
    cdef Py_ssize_t channel_size = <Py_ssize_t>height * width
    cdef Py_ssize_t row = 0
    cdef int c, kernel_row, kernel_col, oh, ow, input_row, offset, lo, hi
    cdef real* dst
    cdef const real* src
    for c in range(channels):
        for kernel_row in range(kernel_h):
            for kernel_col in range(kernel_w):
                offset = kernel_col * dilation_w - pad_w
                _valid_range(offset, stride_w, width, output_w, &lo, &hi)
                dst = col + row * ld
                row += 1
                for oh in range(output_h):
                    input_row = oh * stride_h - pad_h + kernel_row * dilation_h
                    if not _inside(input_row, height):
                        memset(dst, 0, output_w * sizeof(real))   # all-zero bits are 0.0
                    else:
                        src = im + input_row * width + offset
                        memset(dst, 0, lo * sizeof(real))
                        if stride_w == 1:
                            memcpy(dst + lo, src + lo, (hi - lo) * sizeof(real))
                        else:
                            for ow in range(lo, hi):
                                dst[ow] = src[ow * stride_w]
                        memset(dst + hi, 0, (output_w - hi) * sizeof(real))
                    dst += output_w
        im += channel_size


cdef void _col2im_2d(const real* col, int channels, int height, int width, int kernel_h, int kernel_w,
                     int pad_h, int pad_w, int stride_h, int stride_w, int dilation_h, int dilation_w,
                     int output_h, int output_w, real* im, Py_ssize_t ld) noexcept nogil:
    cdef Py_ssize_t channel_size = <Py_ssize_t>height * width
    cdef Py_ssize_t i, row = 0
    cdef int c, kernel_row, kernel_col, oh, ow, input_row, offset, lo, hi
    cdef const real* src
    cdef real* dst
    for i in range(channel_size * channels):
        im[i] = 0
    for c in range(channels):
        for kernel_row in range(kernel_h):
            for kernel_col in range(kernel_w):
                offset = kernel_col * dilation_w - pad_w
                _valid_range(offset, stride_w, width, output_w, &lo, &hi)
                src = col + row * ld
                row += 1
                for oh in range(output_h):
                    input_row = oh * stride_h - pad_h + kernel_row * dilation_h
                    if _inside(input_row, height):
                        dst = im + input_row * width + offset
                        if stride_w == 1:
                            for ow in range(lo, hi):
                                dst[ow] += src[ow]
                        else:
                            for ow in range(lo, hi):
                                dst[ow * stride_w] += src[ow]
                    src += output_w
        im += channel_size


cdef void _im2col_nd_core(const real* data_input, bint im2col, int num_axes, const int* im_shape,
                          const int* col_shape, const int* kernel, const int* pad, const int* stride,
                          const int* dilation, real* data_output, Py_ssize_t ld) noexcept nogil:
    # Caffe's im2col_nd_core_cpu: im_shape = (channels, *spatial), col_shape = (channels * prod(kernel), *out);
    # column row r starts at r * ld.
    cdef int d_offset[MAX_AXES]
    cdef int d_iter[MAX_AXES]
    cdef Py_ssize_t im_size, index_col, index_im
    cdef int kernel_size = 1, channels_col = col_shape[0], c_col, offset, d_i, d, d_im
    cdef bint incremented, is_padding
    cdef Py_ssize_t i
    if not im2col:
        im_size = im_shape[0]
        for d_i in range(num_axes):
            im_size *= im_shape[1 + d_i]
        for i in range(im_size):
            data_output[i] = 0
    for d_i in range(num_axes):
        kernel_size *= kernel[d_i]
        d_iter[d_i] = 0
    for c_col in range(channels_col):
        # Loop over spatial axes in reverse order to compute a per-axis offset.
        offset = c_col
        for d_i in range(num_axes - 1, -1, -1):
            if d_i < num_axes - 1:
                offset = offset // kernel[d_i + 1]
            d_offset[d_i] = offset % kernel[d_i]
        incremented = True
        while incremented:
            # Loop over spatial axes in forward order: indices in image and column, and padding or not.
            index_col = 0
            index_im = c_col // kernel_size
            is_padding = False
            for d_i in range(num_axes):
                d = d_iter[d_i]
                d_im = d * stride[d_i] - pad[d_i] + d_offset[d_i] * dilation[d_i]
                is_padding = is_padding or d_im < 0 or d_im >= im_shape[d_i + 1]
                index_col = index_col * col_shape[d_i + 1] + d
                index_im = index_im * im_shape[d_i + 1] + d_im
            index_col += c_col * ld
            if im2col:
                data_output[index_col] = 0 if is_padding else data_input[index_im]
            elif not is_padding:
                data_output[index_im] += data_input[index_col]
            # Count through the output positions, last axis fastest.
            incremented = False
            for d_i in range(num_axes - 1, -1, -1):
                if d_iter[d_i] == col_shape[d_i + 1] - 1:
                    d_iter[d_i] = 0
                else:
                    d_iter[d_i] += 1
                    incremented = True
                    break


cdef void _one(const real* src, real* dst, int n, const int* c_im, const int* c_col, const int* k, const int* p,
               const int* s, const int* dl, bint forward, bint force_nd, Py_ssize_t ld) noexcept nogil:
    if n == 2 and not force_nd:
        if forward:
            _im2col_2d(src, c_im[0], c_im[1], c_im[2], k[0], k[1], p[0], p[1], s[0], s[1], dl[0], dl[1],
                       c_col[1], c_col[2], dst, ld)
        else:
            _col2im_2d(src, c_im[0], c_im[1], c_im[2], k[0], k[1], p[0], p[1], s[0], s[1], dl[0], dl[1],
                       c_col[1], c_col[2], dst, ld)
    else:
        _im2col_nd_core(src, forward, n, c_im, c_col, k, p, s, dl, dst, ld)
