"""coord_map: a layer's map, composition and inverse, the map between two tops of a NetSpec, and crop(): the
Crop it makes lines a skip connection up with its target when the net runs, pixel for pixel."""
import numpy as np
import pytest

import pycaffe_dist as caffe
from pycaffe_dist import layers as L
from pycaffe_dist import params as P
from pycaffe_dist.coord_map import (AxisMismatchException, UndefinedMapException, compose, coord_map,
                                    coord_map_from_to, crop, inverse)


def conv_pool_deconv(kernel=3, stride=1, pad=0, pool=2, up=2, up_pad=0):
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 40, 40]))
    n.conv = L.Convolution(n.data, num_output=2, kernel_size=kernel, stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool, stride=pool)
    n.up = L.Deconvolution(n.pool, num_output=2, kernel_size=2 * up, stride=up, pad=up_pad)
    return n


def test_one_layer_maps():
    n = conv_pool_deconv(kernel=5, stride=2, pad=1)
    axis, a, b = coord_map(n.conv.fn)
    assert axis == 1 and a == 0.5 and b == (1 - 2) / 2           # centre of a 5-wide window, padded by 1
    axis, a, b = coord_map(n.up.fn)
    assert axis == 1 and a == 2 and b == 1.5                      # (4 - 1) / 2 - 0
    assert coord_map(L.ReLU(n.conv).fn) == (None, 1, 0)
    with pytest.raises(UndefinedMapException):
        coord_map(L.InnerProduct(n.conv, num_output=3).fn)


def test_dilation_widens_the_window():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 20, 20]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=3, dilation=2)
    assert coord_map(n.conv.fn)[2] == -2                           # an effective 5-wide window


def test_compose_and_inverse():
    assert compose((None, 1, 0), (2, 3, 1)) == (2, 3, 1)
    assert compose((1, 2, 1), (None, 1, 0)) == (1, 2, 1)
    assert compose((1, 2, 1), (1, 0.5, 3)) == (1, 1.0, 7)
    axis, a, b = compose((1, 2, 1), inverse((1, 2, 1)))
    assert (axis, a, b) == (1, 1.0, 0.0)
    with pytest.raises(AxisMismatchException):
        compose((1, 1, 0), (2, 1, 0))


@pytest.mark.parametrize("pool,up,expected", [(2, 2, 0), (4, 4, -1)])
def test_conv_pool_deconv_lines_up_with_its_input(pool, up, expected):
    n = conv_pool_deconv(pool=pool, up=up)
    axis, a, b = coord_map_from_to(n.up, n.data)
    assert (axis, a, b) == (1, 1, expected)


def test_tops_not_joined_by_spatial_layers_have_no_map():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 8, 8]))
    n.other = L.Input(shape=dict(dim=[1, 1, 8, 8]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=3)
    with pytest.raises(RuntimeError, match="connected by spatial layers"):
        coord_map_from_to(n.conv, n.other)


def test_crop_refuses_a_scale_or_a_negative_offset():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 16, 16]))
    n.pool = L.Pooling(n.data, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    with pytest.raises(AssertionError, match="scale mismatch"):
        crop(n.pool, n.data)
    n.padded = L.Convolution(n.data, num_output=1, kernel_size=1, pad=2)
    with pytest.raises(AssertionError, match="negative offset"):
        crop(n.data, n.padded)


def test_the_crop_it_makes_cuts_out_the_pixels_of_the_target(tmp_path):
    # FCN's pattern: a padded convolution grows the map, crop() cuts it back to the input's window. With a
    # 1x1 kernel of weight 1 and pad 3, the padded output holds the input at offset 3: the crop must find it.
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 9, 7]))
    n.grown = L.Convolution(n.data, num_output=1, kernel_size=1, pad=3, bias_term=False,
                            weight_filler=dict(type="constant", value=1))
    n.score = crop(n.grown, n.data)
    path = tmp_path / "net.prototxt"
    path.write_text(str(n.to_proto()))
    layer = n.to_proto().layer[-1]
    assert layer.type == "Crop" and layer.crop_param.axis == 2 and list(layer.crop_param.offset) == [3]
    net = caffe.Net(str(path), caffe.TEST)
    image = np.random.default_rng(0).standard_normal((1, 1, 9, 7)).astype(np.float32)
    out = net.forward(data=image)["score"]
    np.testing.assert_array_equal(out, image)
