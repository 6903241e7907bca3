# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""CPU im2col / col2im, as Caffe's src/caffe/util/im2col.cpp (im2col_cpu, col2im_cpu, im2col_nd_cpu, col2im_nd_cpu).

Plain functions over contiguous float32 or float64 buffers with explicit shapes; the loops run without the GIL.
For one image the column buffer is (channels * prod(kernel), *output) in C order: row (c * kh + i) * kw + j holds
kernel tap (i, j) of channel c, exactly as Caffe lays it out. Output sizes use C's truncating division, as Caffe:
    out = (in + 2 * pad - (dilation * (kernel - 1) + 1)) / stride + 1
The batch functions lay out the columns of N images as (rows, N, *output): row r of image n starts at r * ld + n * P
with ld = N * P, P = prod(output). One GEMM over that buffer does the whole batch (instead of Caffe's per-image
loop), and images are processed in parallel (OpenMP) because each writes its own part of the output.
Python wrappers that allocate the outputs: pycaffe_dist/backend/im2col.py.
"""
from cython.parallel cimport prange

include "im2col_core.pxi"


def col_shape(im_shape, kernel, pad, stride, dilation):
    """The column buffer's shape (channels * prod(kernel), *out) for an image of shape (channels, *spatial)."""
    cdef int c_im[MAX_AXES]
    cdef int c_col[MAX_AXES]
    cdef int k[MAX_AXES]
    cdef int p[MAX_AXES]
    cdef int s[MAX_AXES]
    cdef int dl[MAX_AXES]
    n = _geometry(tuple(im_shape), tuple(kernel), tuple(pad), tuple(stride), tuple(dilation), c_im, c_col,
                  k, p, s, dl)
    return tuple(c_col[i] for i in range(n + 1))


def _run(const real[::1] src, real[::1] dst, Py_ssize_t num, im_shape, kernel, pad, stride, dilation,
         bint forward, bint force_nd, bint batch_layout):
    cdef int c_im[MAX_AXES]
    cdef int c_col[MAX_AXES]
    cdef int k[MAX_AXES]
    cdef int p[MAX_AXES]
    cdef int s[MAX_AXES]
    cdef int dl[MAX_AXES]
    cdef int n = _geometry(tuple(im_shape), tuple(kernel), tuple(pad), tuple(stride), tuple(dilation), c_im,
                           c_col, k, p, s, dl)
    cdef Py_ssize_t im_count = _prod(c_im, n + 1), col_count = _prod(c_col, n + 1)
    cdef Py_ssize_t positions = _prod(c_col + 1, n)
    cdef Py_ssize_t src_count = num * (im_count if forward else col_count)
    cdef Py_ssize_t dst_count = num * (col_count if forward else im_count)
    cdef Py_ssize_t j, i
    for i in range(n + 1):
        if c_col[i] < 0:
            raise ValueError("negative im2col output size: image %r, kernel %r, pad %r, stride %r, dilation %r"
                             % (tuple(im_shape), tuple(kernel), tuple(pad), tuple(stride), tuple(dilation)))
    if src.shape[0] != src_count or dst.shape[0] != dst_count:
        raise ValueError("im2col buffer sizes %d -> %d do not match the shapes (need %d -> %d)"
                         % (src.shape[0], dst.shape[0], src_count, dst_count))
    if dst_count == 0:
        return
    if src_count == 0 or col_count == 0:   # an empty column: the image is all zero (col2im), nothing to copy
        with nogil:
            for j in range(dst_count):
                dst[j] = 0
        return
    cdef const real* a = &src[0]
    cdef real* b = &dst[0]
    # batch layout: (rows, num, *out); image layout: num buffers (rows, *out) one after the other
    cdef Py_ssize_t ld = num * positions if batch_layout else positions
    cdef Py_ssize_t col_step = positions if batch_layout else col_count
    cdef Py_ssize_t img
    if num == 1:
        with nogil:
            _one(a, b, n, c_im, c_col, k, p, s, dl, forward, force_nd, ld)
    elif forward:
        for img in prange(num, nogil=True, schedule="static", use_threads_if=num * col_count > PARALLEL_MIN):
            _one(a + img * im_count, b + img * col_step, n, c_im, c_col, k, p, s, dl, True, force_nd, ld)
    else:
        for img in prange(num, nogil=True, schedule="static", use_threads_if=num * col_count > PARALLEL_MIN):
            _one(a + img * col_step, b + img * im_count, n, c_im, c_col, k, p, s, dl, False, force_nd, ld)


def im2col(const real[::1] im, real[::1] col, im_shape, kernel, pad, stride, dilation, bint force_nd=False,
           Py_ssize_t num=1, bint batch_layout=True):
    """Fill `col` (flat) from the flat images `im`: `num` images of shape im_shape = (C, *spatial).

    One image gives the (rows, *output) buffer; num images the batch layout (rows, num, *output), or with
    batch_layout False the num buffers (num, rows, *output) of Caffe's Im2col layer.
    Two spatial axes take Caffe's im2col_cpu unless force_nd; any other number takes im2col_nd_cpu."""
    _run(im, col, num, im_shape, kernel, pad, stride, dilation, True, force_nd, batch_layout)


def col2im(const real[::1] col, real[::1] im, im_shape, kernel, pad, stride, dilation, bint force_nd=False,
           Py_ssize_t num=1, bint batch_layout=True):
    """Overwrite the flat images `im` with the sum of the column entries that map to each pixel (the adjoint
    of im2col, same layouts)."""
    _run(col, im, num, im_shape, kernel, pad, stride, dilation, False, force_nd, batch_layout)
