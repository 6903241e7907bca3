"""im2col / col2im for one image on the CPU: allocate the output, call the Cython kernel (csrc/im2col.pyx).
Float32 and float64 arrays keep their dtype; anything else is computed in float32.

An image is an array of shape (channels, *spatial); its column buffer has shape (channels * prod(kernel), *out)
with out[i] = (spatial[i] + 2 * pad[i] - (dilation[i] * (kernel[i] - 1) + 1)) / stride[i] + 1 (C division), as
Caffe's im2col_cpu / im2col_nd_cpu. Two spatial axes take the 2-D kernel unless force_nd.
"""
import numpy as np

from .._kernels import im2col as _k


def _spatial(value, n, default):
    """One value per spatial axis from an int, a sequence of n, or None (the default)."""
    if value is None:
        return (default,) * n
    if np.isscalar(value):
        return (int(value),) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ValueError("need one value per spatial axis (%d), got %r" % (n, value))
    return value


def _geometry(im_shape, kernel, pad, stride, dilation):
    n = len(im_shape) - 1
    return (tuple(int(d) for d in im_shape), _spatial(kernel, n, None), _spatial(pad, n, 0),
            _spatial(stride, n, 1), _spatial(dilation, n, 1))


def _col_shape(geometry):
    shape = _k.col_shape(*geometry)
    if any(d < 0 for d in shape):
        raise ValueError("im2col: the kernel does not fit: image %s, kernel %s, pad %s, stride %s, dilation %s "
                         "give output %s" % (geometry + (shape[1:],)))
    return shape


def col_shape(im_shape, kernel, pad=0, stride=1, dilation=1):
    """Shape of the column buffer of an image of shape (channels, *spatial)."""
    return _col_shape(_geometry(im_shape, kernel, pad, stride, dilation))


def _dtype(array):
    dtype = np.asarray(array).dtype
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


def _flat(array, dtype):
    return np.ascontiguousarray(array, dtype=dtype).reshape(-1)


def _check_out(name, out, shape, dtype):
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError("%s: out must be a C-contiguous %s array of shape %s" % (name, dtype, shape))


def im2col(im, kernel, pad=0, stride=1, dilation=1, force_nd=False, out=None):
    """The column buffer of `im` (channels, *spatial); written into `out` (C-contiguous, im's dtype) if given."""
    geometry = _geometry(np.shape(im), kernel, pad, stride, dilation)
    shape, dtype = _col_shape(geometry), _dtype(im)
    if out is None:
        out = np.empty(shape, dtype=dtype)
    _check_out("im2col", out, shape, dtype)
    _k.im2col(_flat(im, dtype), out.reshape(-1), *geometry, force_nd=force_nd)
    return out


def col2im(col, im_shape, kernel, pad=0, stride=1, dilation=1, force_nd=False, out=None):
    """The image of shape im_shape whose pixels sum the entries of `col` that im2col took from them."""
    geometry = _geometry(im_shape, kernel, pad, stride, dilation)
    shape = _col_shape(geometry)
    if np.size(col) != int(np.prod(shape)):
        raise ValueError("col2im: column buffer of shape %s, expected %s" % (np.shape(col), shape))
    dtype = _dtype(col)
    if out is None:
        out = np.empty(geometry[0], dtype=dtype)
    _check_out("col2im", out, geometry[0], dtype)
    _k.col2im(_flat(col, dtype), out.reshape(-1), *geometry, force_nd=force_nd)
    return out
