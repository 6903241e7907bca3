# The geometry of Caffe's im2col: an image's shape and its kernel, pad, stride and dilation copied into C arrays,
# and the column shape they give (Caffe's output sizes). Included by im2col_core.pxi and by conv_fused.pyx, which
# needs the geometry but none of the im2col loops.

cdef enum:
    MAX_AXES = 32  # Caffe's kMaxBlobAxes


cdef inline int _out_dim(int size, int kernel, int pad, int stride, int dilation) noexcept nogil:
    return (size + 2 * pad - (dilation * (kernel - 1) + 1)) // stride + 1  # C truncation (cdivision)


cdef int _geometry(tuple im_shape, tuple kernel, tuple pad, tuple stride, tuple dilation,
                   int* c_im, int* c_col, int* c_kernel, int* c_pad, int* c_stride, int* c_dilation) except -1:
    """Copy the shapes into C arrays and compute the column shape; returns the number of spatial axes."""
    cdef int n = len(im_shape) - 1, i
    if n < 1 or n >= MAX_AXES:
        raise ValueError("im2col needs 1 to %d spatial axes, got image shape %r" % (MAX_AXES - 1, im_shape))
    if not len(kernel) == len(pad) == len(stride) == len(dilation) == n:
        raise ValueError("kernel/pad/stride/dilation need one value per spatial axis (%d)" % n)
    c_im[0] = im_shape[0]
    c_col[0] = im_shape[0]
    for i in range(n):
        c_im[i + 1], c_kernel[i], c_pad[i] = im_shape[i + 1], kernel[i], pad[i]
        c_stride[i], c_dilation[i] = stride[i], dilation[i]
        # (Caffe accepts dilation 0: every tap reads the same pixel)
        if c_kernel[i] < 1 or c_stride[i] < 1 or c_dilation[i] < 0 or c_pad[i] < 0 or c_im[i + 1] < 0:
            raise ValueError("bad im2col geometry: kernel %r pad %r stride %r dilation %r"
                             % (kernel, pad, stride, dilation))
        c_col[0] *= c_kernel[i]
        c_col[i + 1] = _out_dim(c_im[i + 1], c_kernel[i], c_pad[i], c_stride[i], c_dilation[i])
    return n


cdef Py_ssize_t _prod(const int* shape, int n) noexcept:
    cdef Py_ssize_t p = 1
    cdef int i
    for i in range(n):
        p *= shape[i] if shape[i] > 0 else 0
    return p
