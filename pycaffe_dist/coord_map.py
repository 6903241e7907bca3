"""Where a position of one NetSpec top lies in another (pycaffe's `caffe.coord_map`), so that a skip connection
can be cropped to line up (FCN's `crop(n.upscore, n.data)`).

A spatial layer maps its input coordinate x to its output coordinate a * x + b along the spatial axes from `axis`
on: a map is the triple (axis, a, b), and (None, 1, 0) is the identity of a point-wise layer, which fits any axis.
Maps compose along a path and invert to go back up one. Two tops are related through a blob both descend from:
the map from the first up to that blob, then down to the second. Caffe's conventions are kept, so that an FCN
script gets the same Crop offsets: a convolution's window is centred ((kernel - 1) / 2, dilated), and only the
first bottom of a Crop carries coordinates (its second only gives the size)."""
import numpy as np

from .net_spec import layers as L

# Layers whose output position i comes from their input position i.
PASS_THROUGH_LAYERS = ["AbsVal", "BatchNorm", "Bias", "BNLL", "Dropout", "Eltwise", "ELU", "Log", "LRN", "Exp",
                       "MVN", "Power", "ReLU", "PReLU", "Scale", "Sigmoid", "Split", "TanH", "Threshold"]

IDENTITY = (None, 1, 0)


class UndefinedMapException(Exception):
    """A layer without a coordinate map (InnerProduct, Reshape, ...): the walk does not pass it."""


class AxisMismatchException(Exception):
    """Two maps along different axes, which no single map composes."""


def _window(fn):
    """(axis, stride, extent of the dilated kernel, pad) of a Convolution, Deconvolution, Im2col or Pooling.
    Their fields are given flat (kernel_size=3) or in their parameter message (convolution_param=dict(...))."""
    params = fn.params.get("convolution_param", fn.params.get("pooling_param", fn.params))
    assert not {"pad_h", "pad_w", "kernel_h", "kernel_w", "stride_h", "stride_w"} & set(params), \
        "cropping does not support legacy _h/_w params"
    kernel = np.array(params["kernel_size"], ndmin=1)
    dilation = np.array(params.get("dilation", 1), ndmin=1)
    return (params.get("axis", 1), np.array(params.get("stride", 1), ndmin=1), (kernel - 1) * dilation + 1,
            np.array(params.get("pad", 0), ndmin=1))


def coord_map(fn):
    """The map (axis, a, b) of one layer, from its input's coordinates to its output's."""
    kind = fn.type_name
    if kind in ("Convolution", "Pooling", "Im2col"):
        axis, stride, extent, pad = _window(fn)
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if kind == "Deconvolution":
        axis, stride, extent, pad = _window(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if kind in PASS_THROUGH_LAYERS:
        return IDENTITY
    if kind == "Crop":
        params = fn.params.get("crop_param", fn.params)
        # The map's axis is the last one that is not a coordinate, hence the one before crop_param's.
        return params.get("axis", 2) - 1, 1, -np.array(params.get("offset", 0), ndmin=1)
    raise UndefinedMapException("%s has no coordinate map" % kind)


def compose(base_map, next_map):
    """`next_map` after `base_map`: the scales multiply and next's shift is scaled by base's."""
    axis1, a1, b1 = base_map
    axis2, a2, b2 = next_map
    if axis1 is not None and axis2 is not None and axis1 != axis2:
        raise AxisMismatchException("maps along axis %d and axis %d" % (axis1, axis2))
    return (axis2 if axis1 is None else axis1), a1 * a2, a1 * b2 + b1


def inverse(coord_map):
    """The map back: x = (y - b) / a."""
    axis, a, b = coord_map
    return axis, 1 / a, -b / a


def _mapped_bottoms(top):
    """The bottoms whose coordinates a top's come from: all of them, but a Crop's first only."""
    return top.fn.inputs[:1] if top.fn.type_name == "Crop" else top.fn.inputs


def _maps_up(top, stop_at=None):
    """{ancestor: map from the ancestor's coordinates to top's}, walking up through every mappable layer; with
    `stop_at` (a dict of blobs), the first ancestor found in it and its map instead."""
    maps = {top: IDENTITY}
    frontier = [top]
    while frontier:
        blob = frontier.pop()
        if stop_at is not None and blob in stop_at:
            return blob, maps[blob]
        try:
            step = coord_map(blob.fn)
        except UndefinedMapException:
            continue
        for bottom in _mapped_bottoms(blob):
            maps[bottom] = compose(maps[blob], step)
            frontier.append(bottom)
    return None if stop_at is not None else maps


def coord_map_from_to(top_from, top_to):
    """The map (axis, a, b) that takes a coordinate of `top_from` to `top_to`'s, through a blob both come from.
    RuntimeError where none is reached through spatial layers."""
    from_maps = _maps_up(top_from)
    found = _maps_up(top_to, stop_at=from_maps)
    if found is None:
        raise RuntimeError("Could not compute map between tops; are they connected by spatial layers?")
    common, to_map = found
    return compose(to_map, inverse(from_maps[common]))


def crop(top_from, top_to):
    """A Crop layer (NetSpec) that cuts `top_from` to the region of `top_to`, its axis and offsets from the map
    between them; the map must be a pure, whole, non-negative shift."""
    axis, a, b = coord_map_from_to(top_from, top_to)
    assert (a == 1).all(), "scale mismatch on crop (a = {})".format(a)
    assert (b <= 0).all(), "cannot crop negative offset (b = {})".format(b)
    assert (np.round(b) == b).all(), "cannot crop noninteger offset (b = {})".format(b)
    return L.Crop(top_from, top_to, crop_param=dict(axis=axis + 1, offset=list(-np.round(b).astype(int))))
