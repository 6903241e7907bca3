# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""CPU kernels of local response normalization, as Caffe's src/caffe/layers/lrn_layer.cpp.

cross_channel_forward / cross_channel_backward: ACROSS_CHANNELS, Caffe's CrossChannelForward_cpu and
CrossChannelBackward_cpu. Arrays are (num, channels, pixels) C-contiguous; the window of `size` channels centred
on c (zero-padded by (size - 1) / 2) slides along the channels with Caffe's running sum (add the head, subtract
the tail), in Caffe's order of operations. Padding channels hold zeros, and adding or subtracting an exact zero
changes nothing, so they are skipped rather than stored.

box_sum: WITHIN_CHANNEL's pooling step, the sum over the size x size window centred on each pixel (zero-padded),
summed row by row as Caffe's AVE pooling sums it. Arrays are (planes, height, width).

float32 and float64 (fused `real`); prange over images or planes once the array is big enough.
"""
from cython.parallel cimport prange
from libc.math cimport pow, powf
from libc.stdlib cimport malloc, free

ctypedef fused real:
    float
    double

cdef enum:
    GRAIN = 32768   # elements below which one thread does the loop: starting the team would cost more


cdef inline real _pow(real x, real p) noexcept nogil:
    # caffe_powx: powf for float, pow for double
    if real is float:
        return powf(x, p)
    else:
        return pow(x, p)


def cross_channel_forward(const real[:, :, ::1] x, real[:, :, ::1] scale, real[:, :, ::1] top, int size,
                          double alpha, double beta, double k):
    """scale = k + alpha / size * (sum of x^2 over the channel window); top = x * scale^-beta."""
    cdef Py_ssize_t num = x.shape[0], channels = x.shape[1], pixels = x.shape[2]
    cdef Py_ssize_t n, c, i, head, tail, pre_pad = (size - 1) // 2
    cdef real alpha_over_size = <real>alpha / <real>size   # Caffe: Dtype alpha_over_size = alpha_ / size_
    cdef real neg_beta = -<real>beta, kk = <real>k, v
    for n in prange(num, nogil=True, schedule="static", use_threads_if=num * channels * pixels > GRAIN):
        for i in range(pixels):
            scale[n, 0, i] = kk
        # the first window: padded channels 0 .. size - 1, i.e. x channels -pre_pad .. size - 1 - pre_pad
        for c in range(size):
            head = c - pre_pad
            if 0 <= head < channels:
                for i in range(pixels):
                    v = x[n, head, i]
                    scale[n, 0, i] = scale[n, 0, i] + alpha_over_size * (v * v)
        for c in range(1, channels):
            head = c + pre_pad
            tail = c - 1 - pre_pad
            for i in range(pixels):
                scale[n, c, i] = scale[n, c - 1, i]
            if head < channels:
                for i in range(pixels):
                    v = x[n, head, i]
                    scale[n, c, i] = scale[n, c, i] + alpha_over_size * (v * v)
            if tail >= 0:
                for i in range(pixels):
                    v = x[n, tail, i]
                    scale[n, c, i] = scale[n, c, i] + (-alpha_over_size) * (v * v)
        for c in range(channels):
            for i in range(pixels):
                top[n, c, i] = _pow(scale[n, c, i], neg_beta) * x[n, c, i]


def cross_channel_backward(const real[:, :, ::1] x, const real[:, :, ::1] top, const real[:, :, ::1] scale,
                           const real[:, :, ::1] top_diff, real[:, :, ::1] bottom_diff, int size, double alpha,
                           double beta):
    """bottom_diff = top_diff * scale^-beta - 2 alpha beta / size * x * (sum over the window of
    top_diff * top / scale)."""
    cdef Py_ssize_t num = x.shape[0], channels = x.shape[1], pixels = x.shape[2]
    cdef Py_ssize_t n, c, i, head, tail, pre_pad = (size - 1) // 2
    cdef real neg_beta = -<real>beta
    cdef real neg_cache_ratio = -<real>(2. * alpha * beta / size)   # Caffe computes it in double
    cdef real* accum
    for n in prange(num, nogil=True, schedule="static", use_threads_if=num * channels * pixels > GRAIN):
        accum = <real*>malloc(pixels * sizeof(real))
        for c in range(channels):
            for i in range(pixels):
                bottom_diff[n, c, i] = _pow(scale[n, c, i], neg_beta) * top_diff[n, c, i]
        for i in range(pixels):
            accum[i] = 0
        # Caffe's padded_ratio channel p holds the ratio of x channel p - pre_pad; accumulate p = 0 .. size - 2
        for c in range(size - 1):
            head = c - pre_pad
            if 0 <= head < channels:
                for i in range(pixels):
                    accum[i] = accum[i] + top_diff[n, head, i] * top[n, head, i] / scale[n, head, i]
        for c in range(channels):
            head = c + pre_pad
            tail = c - pre_pad
            if head < channels:
                for i in range(pixels):
                    accum[i] = accum[i] + top_diff[n, head, i] * top[n, head, i] / scale[n, head, i]
            for i in range(pixels):
                bottom_diff[n, c, i] = bottom_diff[n, c, i] + neg_cache_ratio * (accum[i] * x[n, c, i])
            if tail >= 0:
                for i in range(pixels):
                    accum[i] = accum[i] - top_diff[n, tail, i] * top[n, tail, i] / scale[n, tail, i]
        free(accum)


def box_sum(const real[:, :, ::1] src, real[:, :, ::1] dst, int size):
    """dst[p, h, w] = sum of src[p] over the size x size window centred on (h, w), zero-padded."""
    cdef Py_ssize_t planes = src.shape[0], height = src.shape[1], width = src.shape[2]
    cdef Py_ssize_t p, h, w, hh, ww, h0, h1, w0, w1, pad = (size - 1) // 2
    cdef real s
    for p in prange(planes, nogil=True, schedule="static", use_threads_if=planes * height * width > GRAIN):
        for h in range(height):
            h0 = h - pad
            if h0 < 0:
                h0 = 0
            h1 = h + pad + 1
            if h1 > height:
                h1 = height
            for w in range(width):
                w0 = w - pad
                if w0 < 0:
                    w0 = 0
                w1 = w + pad + 1
                if w1 > width:
                    w1 = width
                s = 0
                for hh in range(h0, h1):
                    for ww in range(w0, w1):
                        s = s + src[p, hh, ww]
                dst[p, h, w] = s
