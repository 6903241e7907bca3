"""2-D pooling of (num, channels, height, width) arrays on the CPU: the Cython kernels of csrc/pooling.pyx.

kernel, stride and pad are (h, w) pairs; outputs are written into the given arrays (C-contiguous, in the input's
dtype), whose shapes set the pooled size. Window positions (`mask`) are int32 arrays shaped like the output,
holding offsets h * width + w within the plane. Backward functions overwrite the input diff unless accumulate.
"""
from .._kernels import pooling as _k


def _planes(a):
    """A (num * channels, height * width) view of a 4-D array; never a copy, so that writes land."""
    if not a.flags.c_contiguous:
        raise ValueError("pooling needs C-contiguous arrays, got one of shape %s" % (a.shape,))
    n, c, h, w = a.shape
    return a.reshape(n * c, h * w)


def _geometry(x, y, kernel, stride, pad):
    return tuple(int(v) for v in x.shape[2:] + y.shape[2:] + tuple(kernel) + tuple(stride) + tuple(pad))


def max_forward(x, y, mask, kernel, stride, pad):
    _k.max_forward(_planes(x), _planes(y), _planes(mask), _geometry(x, y, kernel, stride, pad))


def ave_forward(x, y, kernel, stride, pad):
    _k.ave_forward(_planes(x), _planes(y), _geometry(x, y, kernel, stride, pad))


def stochastic_forward(x, y, mask, kernel, stride, uniform):
    """TRAIN: `uniform` (shaped like y, dtype of x) holds one draw in [0, 1] per output."""
    _k.stochastic_forward(_planes(x), _planes(uniform), _planes(y), _planes(mask),
                          _geometry(x, y, kernel, stride, (0, 0)))


def stochastic_forward_test(x, y, kernel, stride):
    _k.stochastic_forward_test(_planes(x), _planes(y), _geometry(x, y, kernel, stride, (0, 0)))


def mask_backward(dy, mask, dx, accumulate=False, kernel=None, stride=None, pad=None):
    """MAX and STOCHASTIC TRAIN: dx[mask] += dy, plane by plane. The forward's kernel, stride and pad, given
    when every position lies in its own window (max_forward's mask), let whole 2x2 stride-2 windows take a faster
    path."""
    geometry = _geometry(dx, dy, kernel, stride, pad) if kernel is not None else None
    _k.mask_backward(_planes(dy), _planes(mask), _planes(dx), accumulate, geometry)


def ave_backward(dy, dx, kernel, stride, pad, accumulate=False):
    _k.ave_backward(_planes(dy), _planes(dx), _geometry(dx, dy, kernel, stride, pad), accumulate)


def stochastic_test_backward(x, dy, dx, kernel, stride, accumulate=False):
    _k.stochastic_test_backward(_planes(x), _planes(dy), _planes(dx), _geometry(x, dy, kernel, stride, (0, 0)),
                                accumulate)
