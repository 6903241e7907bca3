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


def loss_forward(prob, labels, axis, ignore_label):
    """SoftmaxWithLoss's sum over positions of -log(max(prob[label], FLT_MIN)), in Caffe's order and precision,
    skipping `ignore_label` (None: none). Returns (loss, positions counted, index of the first label outside the
    class axis or -1)."""
    return _k.loss_forward(_as3d(prob, axis), labels.reshape(-1), ignore_label is not None, ignore_label or 0)


def loss_backward(prob, labels, axis, ignore_label, diff):
    """diff[...] = prob - onehot(label), all 0 at positions of `ignore_label`; returns the positions counted."""
    return _k.loss_backward(_as3d(prob, axis), labels.reshape(-1), ignore_label is not None, ignore_label or 0,
                            _as3d(diff, axis, written=True))
