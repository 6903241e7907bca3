"""Parameter fillers, as Caffe's include/caffe/filler.hpp (same names, fans and formulas).

The random streams are numpy's, not Caffe's boost mt19937: a seeded run is reproducible here but its draws differ
from Caffe's. Loading a .caffemodel gives identical weights.
"""
import math

import numpy as np

from .. import common
from ..errors import NetError


def _fans(shape):
    # Caffe: fan_in = count / num; fan_out = count / channels (or count for a 1-axis blob).
    n = int(np.prod(shape))
    if len(shape) < 1 or shape[0] == 0:
        raise NetError("xavier/msra fillers need a blob with at least one non-empty axis, got %s" % (shape,))
    fan_in = n // shape[0]
    fan_out = n // shape[1] if len(shape) > 1 and shape[1] else n
    return fan_in, fan_out


def _variance_n(filler, shape):
    from ..proto import caffe_pb2
    fan_in, fan_out = _fans(shape)
    norm = filler.variance_norm
    if norm == caffe_pb2.FillerParameter.AVERAGE:
        return (fan_in + fan_out) / 2.0
    if norm == caffe_pb2.FillerParameter.FAN_OUT:
        return float(fan_out)
    return float(fan_in)


def filler_problem(filler, shape):
    """What Caffe's filler.hpp (and the rng functions it calls) would CHECK-fail on when filling a blob of `shape`
    with `filler`, as a sentence; None if it fills."""
    kind, count = filler.type, int(np.prod(shape))
    if filler.sparse < -1:
        return "%s filler: sparse must be -1 (off) or at least 0, got %d" % (kind, filler.sparse)
    if filler.sparse >= 0 and kind != "gaussian":
        # Caffe CHECKs this in every filler but the gaussian one.
        return "%s filler: sparse is only supported by the gaussian filler (got sparse: %d)" % (kind, filler.sparse)
    if count == 0 and kind in ("constant", "uniform", "gaussian", "xavier", "msra"):
        return "%s filler: cannot fill a blob with no elements (shape %s)" % (kind, tuple(shape))
    if kind == "uniform" and filler.min > filler.max:
        return "uniform filler: min (%g) must not be above max (%g)" % (filler.min, filler.max)
    if kind == "gaussian":
        if not filler.std > 0:     # caffe_rng_gaussian: CHECK_GT(sigma, 0)
            return "gaussian filler: std must be positive, got %g" % filler.std
        if filler.sparse >= 0:
            if len(shape) < 1:
                return "sparse gaussian filler needs a blob with at least one axis"
            if filler.sparse > shape[0]:   # caffe_rng_bernoulli: CHECK_LE(p, 1), p = sparse / num_outputs
                return ("sparse gaussian filler: sparse (%d) must not exceed the blob's first axis (%d outputs)"
                        % (filler.sparse, shape[0]))
    return None


def fill(filler, blob):
    """Fill blob.data in place according to a FillerParameter."""
    shape, rng, kind = blob.shape, common.rng(), filler.type
    problem = filler_problem(filler, shape)
    if problem:
        raise NetError(problem)
    if kind == "constant":
        blob.data[...] = filler.value
    elif kind == "uniform":
        blob.data[...] = rng.uniform(filler.min, filler.max, shape)
    elif kind == "gaussian":
        values = rng.normal(filler.mean, filler.std, shape)
        if filler.sparse >= 0:
            # Caffe keeps each weight with probability sparse / num_outputs (num_outputs = shape[0]).
            keep = rng.random(shape) < filler.sparse / float(shape[0])
            values = values * keep
        blob.data[...] = values
    elif kind == "positive_unitball":
        values = rng.uniform(0.0, 1.0, shape).reshape(shape[0] if shape else 1, -1)
        blob.data[...] = (values / values.sum(axis=1, keepdims=True)).reshape(shape)
    elif kind == "xavier":
        scale = math.sqrt(3.0 / _variance_n(filler, shape))
        blob.data[...] = rng.uniform(-scale, scale, shape)
    elif kind == "msra":
        blob.data[...] = rng.normal(0.0, math.sqrt(2.0 / _variance_n(filler, shape)), shape)
    elif kind == "bilinear":
        if len(shape) != 4 or shape[2] != shape[3]:
            raise NetError("bilinear filler needs a 4-axis blob with height == width, got %s" % (shape,))
        f = math.ceil(shape[3] / 2.0)
        c = (shape[3] - 1) / (2.0 * f)   # Caffe's filler.hpp; the kernel is symmetric for odd sizes too
        x = np.arange(shape[3], dtype=np.float64)
        k1 = 1 - np.abs(x / f - c)
        blob.data[...] = np.outer(k1, k1)[None, None]
    else:
        raise NetError("unknown filler type %r (Caffe has constant, uniform, gaussian, positive_unitball, xavier, "
                       "msra, bilinear)" % kind)
    return blob
