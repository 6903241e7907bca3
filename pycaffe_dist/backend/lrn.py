"""Local response normalization on the CPU: views for the Cython kernels of csrc/lrn.pyx.

Arrays are (num, channels, height, width), C-contiguous, all of one dtype (float32 or float64).
"""
import numpy as np

from .._kernels import lrn as _k


def _flat(a):
    """(num, channels, height * width) view of a contiguous 4-axis array (sizes spelled out: an empty blob has
    no -1 to infer)."""
    return a.reshape(a.shape[0], a.shape[1], a.shape[2] * a.shape[3])


def cross_channel_forward(x, scale, top, size, alpha, beta, k):
    """Fill scale (k + alpha / size * window sum of squares) and top (x * scale^-beta), as Caffe's
    CrossChannelForward_cpu. Arrays of no elements have nothing to fill: the kernel is not called (it starts each
    image's window at channel 0, which 0 channels do not have)."""
    if not x.size:
        return
    _k.cross_channel_forward(_flat(x), _flat(scale), _flat(top), size, alpha, beta, k)


def cross_channel_backward(x, top, scale, top_diff, bottom_diff, size, alpha, beta):
    """Fill bottom_diff as Caffe's CrossChannelBackward_cpu, from the forward's scale and top (nothing to fill for
    arrays of no elements, as the forward)."""
    if not x.size:
        return
    _k.cross_channel_backward(_flat(x), _flat(top), _flat(scale), _flat(top_diff), _flat(bottom_diff), size,
                              alpha, beta)


def window_sum(x, size):
    """Sum of each (height, width) plane over the size x size window centred on each pixel, zero-padded."""
    out = np.empty_like(x)
    if not x.size:
        return out
    planes = (int(np.prod(x.shape[:-2])),) + x.shape[-2:]
    _k.box_sum(x.reshape(planes), out.reshape(planes), size)
    return out
