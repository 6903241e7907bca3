"""Softmax over one axis of an N-d array on the CPU: view it as (outer, channels, inner) and call the Cython kernel
(csrc/softmax.pyx). Arrays are C-contiguous and of one dtype (float32 or float64); outputs may alias inputs."""
import math

from .._kernels import softmax as _k


def _as3d(array, axis, written=False):
    if written and not array.flags.c_contiguous:
        raise ValueError("softmax: the output array must be C-contiguous (a reshaped copy would be lost)")
    shape = array.shape
    return array.reshape(math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]))


def forward(x, y, axis):
    """y[...] = softmax of x over `axis` (Caffe's: subtract the max, exp, divide by the sum)."""
    _k.forward(_as3d(x, axis), _as3d(y, axis, written=True))


def backward(y, dy, dx, axis):
    """dx[...] = (dy - sum over `axis` of dy * y) * y, the gradient through y = softmax(x)."""
    _k.backward(_as3d(y, axis), _as3d(dy, axis), _as3d(dx, axis, written=True))
