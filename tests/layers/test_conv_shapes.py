"""Shapes, params and checks of Convolution, Deconvolution and Im2col (pycaffe_dist/layers/conv.py)."""
import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.golden_shapes import cases_of, check_case_shapes


@pytest.mark.parametrize("name", cases_of("Convolution", "Deconvolution", "Im2col"))
def test_golden_shapes(name):
    check_case_shapes(name)


def setup(type_, text, *bottom_shapes, ntop=None, blobs=()):
    lp = parse_text('name: "l" type: "%s" %s' % (type_, text), caffe_pb2.LayerParameter())
    for b in blobs:
        Blob(b).to_proto(proto=lp.blobs.add())
    layer = create_layer(lp)
    bottom = [Blob(s) for s in bottom_shapes]
    top = [Blob() for _ in range(len(bottom) if ntop is None else ntop)]
    layer.setup(bottom, top)
    return layer, bottom, top


def conv(text, *shapes, **kw):
    return setup("Convolution", "convolution_param { %s }" % text, *shapes, **kw)


def deconv(text, *shapes, **kw):
    return setup("Deconvolution", "convolution_param { %s }" % text, *shapes, **kw)


def shapes(blobs):
    return [b.shape for b in blobs]


@pytest.mark.parametrize("text, bottom, out", [
    ("num_output: 4 kernel_size: 3", (2, 3, 7, 7), (2, 4, 5, 5)),
    ("num_output: 4 kernel_size: 3 pad: 1 stride: 2", (2, 3, 7, 7), (2, 4, 4, 4)),
    ("num_output: 4 kernel_size: 3 dilation: 3", (1, 3, 9, 10), (1, 4, 3, 4)),
    ("num_output: 4 kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 stride_h: 1 stride_w: 2", (1, 3, 5, 5), (1, 4, 5, 3)),
    ("num_output: 4 kernel_size: 3 kernel_size: 1 stride: 2 stride: 1", (1, 3, 7, 7), (1, 4, 3, 7)),
    ("num_output: 2 kernel_size: 3 kernel_size: 1 kernel_size: 2", (1, 3, 4, 5, 6), (1, 2, 2, 5, 5)),
    ("num_output: 2 kernel_size: 3", (1, 3, 8), (1, 2, 6)),                    # 1 spatial axis
    # C's truncating division, as Caffe: (2 - 3) / 2 + 1 = 0 + 1 = 1 (floor division would give 0)
    ("num_output: 2 kernel_size: 3 stride: 2", (1, 3, 2, 2), (1, 2, 1, 1)),
    # axis 2: the leading axes are all "num"
    ("num_output: 5 kernel_size: 3 axis: 2", (2, 3, 4, 6, 6), (2, 3, 5, 4, 4)),
    ("num_output: 5 kernel_size: 3 axis: -3", (2, 3, 4, 6, 6), (2, 3, 5, 4, 4)),
    ("num_output: 5 kernel_size: 1", (2, 3, 6, 6), (2, 5, 6, 6)),
])
def test_conv_output_shape(text, bottom, out):
    layer, _, top = conv(text, bottom)
    assert top[0].shape == out


def test_conv_weight_shapes_group_bias():
    layer, _, _ = conv("num_output: 6 kernel_size: 3 kernel_size: 2 group: 3", (2, 9, 5, 5))
    assert shapes(layer.blobs) == [(6, 3, 3, 2), (6,)]
    layer, _, _ = conv("num_output: 6 kernel_size: 3 bias_term: false", (2, 4, 5, 5, 5))
    assert shapes(layer.blobs) == [(6, 4, 3, 3, 3)]


def test_conv_fillers():
    layer, _, _ = conv('num_output: 2 kernel_size: 1 weight_filler { type: "constant" value: 0.5 } '
                       'bias_filler { type: "constant" value: -2 }', (1, 3, 2, 2))
    assert np.all(layer.blobs[0].data == 0.5) and np.all(layer.blobs[1].data == -2)
    layer, _, _ = conv("num_output: 2 kernel_size: 1", (1, 3, 2, 2))   # Caffe's default filler: constant 0
    assert not layer.blobs[0].data.any() and not layer.blobs[1].data.any()


@pytest.mark.parametrize("text, bottom, out, weight", [
    # out = stride * (in - 1) + dilation * (kernel - 1) + 1 - 2 * pad
    ("num_output: 4 kernel_size: 4 stride: 2 pad: 1", (2, 3, 5, 5), (2, 4, 10, 10), (3, 4, 4, 4)),
    ("num_output: 2 kernel_size: 3 dilation: 2", (1, 3, 4, 4), (1, 2, 8, 8), (3, 2, 3, 3)),
    ("num_output: 6 kernel_size: 2 stride: 2 group: 3", (1, 3, 4, 5), (1, 6, 8, 10), (3, 2, 2, 2)),
    ("num_output: 2 kernel_h: 3 kernel_w: 1 stride_h: 2 stride_w: 3", (1, 3, 4, 4), (1, 2, 9, 10), (3, 2, 3, 1)),
    ("num_output: 2 kernel_size: 3 stride: 2", (1, 3, 2, 3, 4), (1, 2, 5, 7, 9), (3, 2, 3, 3, 3)),
])
def test_deconv_output_and_weight_shape(text, bottom, out, weight):
    layer, _, top = deconv(text, bottom)
    assert top[0].shape == out
    assert shapes(layer.blobs) == [weight, (out[1],)]


def test_several_bottoms_each_get_a_top():
    layer, _, top = conv("num_output: 2 kernel_size: 3", (1, 3, 5, 5), (1, 3, 5, 5))
    assert shapes(top) == [(1, 2, 3, 3)] * 2
    with pytest.raises(NetError, match="shape mismatch"):
        conv("num_output: 2 kernel_size: 3", (1, 3, 5, 5), (1, 3, 6, 5))
    with pytest.raises(NetError, match="as many tops as bottoms"):
        conv("num_output: 2 kernel_size: 3", (1, 3, 5, 5), (1, 3, 5, 5), ntop=1)


def test_reshape_follows_the_bottom_but_not_its_channels():
    layer, bottom, top = conv("num_output: 2 kernel_size: 3 pad: 1", (1, 3, 5, 5))
    bottom[0].reshape((4, 3, 8, 6))
    layer.reshape(bottom, top)
    assert top[0].shape == (4, 2, 8, 6)
    bottom[0].reshape((4, 2, 8, 6))
    with pytest.raises(NetError, match="Input size incompatible with convolution kernel"):
        layer.reshape(bottom, top)
    bottom[0].reshape((4, 3, 8))
    with pytest.raises(NetError, match="bottom num_axes may not change"):
        layer.reshape(bottom, top)


def test_embedded_weights_are_kept_and_checked():
    layer, _, _ = conv("num_output: 2 kernel_size: 1", (1, 3, 2, 2), blobs=[(2, 3, 1, 1), (2,)])
    assert shapes(layer.blobs) == [(2, 3, 1, 1), (2,)]
    with pytest.raises(NetError, match="Incorrect shape of param blob 0"):
        conv("num_output: 2 kernel_size: 1", (1, 3, 2, 2), blobs=[(2, 4, 1, 1), (2,)])
    with pytest.raises(NetError, match="Incorrect number of weight blobs"):
        conv("num_output: 2 kernel_size: 1", (1, 3, 2, 2), blobs=[(2, 3, 1, 1)])


@pytest.mark.parametrize("text, bottom, message", [
    ("num_output: 4 kernel_size: 3 group: 2", (1, 3, 5, 5), "multiple of group"),
    ("num_output: 3 kernel_size: 3 group: 3", (1, 4, 5, 5), r"input channels \(4\) must be a multiple of group"),
    ("num_output: 4 kernel_size: 3 group: 3", (1, 6, 5, 5), "Number of output should be multiples of group"),
    ("num_output: 4 kernel_size: 3 group: 0", (1, 6, 5, 5), "group must be positive"),
    ("num_output: 4", (1, 3, 5, 5), "kernel_size must be specified once, or once per spatial dimension"),
    ("num_output: 4 kernel_size: 3 kernel_size: 3", (1, 3, 5, 5, 5), "kernel_size specified 2 times; 3 spatial"),
    ("num_output: 4 kernel_size: 3 kernel_h: 3 kernel_w: 3", (1, 3, 5, 5),
     "Either kernel_size or kernel_h/w should be specified; not both"),
    ("num_output: 4 kernel_h: 3 kernel_w: 3", (1, 3, 5, 5, 5), "kernel_h & kernel_w can only be used for 2D"),
    ("num_output: 4 kernel_h: 3", (1, 3, 5, 5), "Filter dimensions must be nonzero"),
    ("num_output: 4 kernel_size: 0", (1, 3, 5, 5), "Filter dimensions must be nonzero"),
    ("num_output: 4 kernel_size: 3 stride: 0", (1, 3, 5, 5), "Stride dimensions must be nonzero"),
    ("num_output: 4 kernel_size: 3 stride: 1 stride_h: 1 stride_w: 1", (1, 3, 5, 5),
     "Either stride or stride_h/w should be specified; not both"),
    ("num_output: 4 kernel_size: 3 pad: 1 pad_h: 1", (1, 3, 5, 5), "Either pad or pad_h/w should be specified"),
    ("num_output: 4 kernel_size: 3 pad_h: 1", (1, 3, 5, 5, 5), "pad_h & pad_w can only be used for 2D"),
    ("num_output: 4 kernel_size: 3 pad: 1 pad: 1", (1, 3, 5, 5, 5), "pad must be specified once, or once per"),
    ("num_output: 4 kernel_size: 3 dilation: 1 dilation: 2", (1, 3, 5, 5, 5), "dilation must be specified once"),
    ("kernel_size: 3", (1, 3, 5, 5), "num_output must be positive"),
    ("num_output: 4 kernel_size: 3 axis: 4", (1, 3, 5, 5), "axis 4 out of range"),
    ("num_output: 4 kernel_size: 7", (1, 3, 5, 5), "does not fit"),
])
def test_conv_errors(text, bottom, message):
    with pytest.raises(NetError, match=message):
        conv(text, bottom)


def test_deconv_group_errors():
    with pytest.raises(NetError, match="multiple of group"):
        deconv("num_output: 4 kernel_size: 2 group: 2", (1, 3, 4, 4))
    with pytest.raises(NetError, match="does not fit"):
        deconv("num_output: 4 kernel_size: 1 pad: 1", (1, 3, 1, 1))


def test_conv_flops():
    layer, bottom, top = conv("num_output: 5 kernel_size: 3", (2, 4, 7, 7))
    # 2 per multiply-add over (5 x 36) x (36 x 25) per image, plus one bias add per output
    assert layer.flops(bottom, top) == 2 * (2 * 5 * 36 * 25 + 5 * 25)
    layer, bottom, top = deconv("num_output: 2 kernel_size: 2 stride: 2 bias_term: false", (1, 3, 4, 4))
    assert layer.flops(bottom, top) == 2 * 3 * 2 * 4 * 16


@pytest.mark.parametrize("text, bottom, out", [
    ("kernel_size: 3 stride: 2 pad: 1", (2, 3, 6, 6), (2, 27, 3, 3)),
    ("kernel_h: 2 kernel_w: 3", (1, 2, 4, 5), (1, 12, 3, 3)),
    ("kernel_size: 2 dilation: 2", (1, 2, 5, 5, 5), (1, 16, 3, 3, 3)),
    ("kernel_size: 3 axis: 2", (2, 3, 4, 6), (2, 3, 12, 4)),
    ("kernel_size: 3 force_nd_im2col: true", (1, 2, 5, 5), (1, 18, 3, 3)),
])
def test_im2col_layer_shape(text, bottom, out):
    layer, _, top = setup("Im2col", "convolution_param { %s }" % text, bottom)
    assert top[0].shape == out and layer.blobs == []


def test_im2col_layer_errors():
    with pytest.raises(NetError, match="at least one spatial axis"):
        setup("Im2col", "convolution_param { kernel_size: 1 axis: -1 }", (2, 3))
    with pytest.raises(NetError, match="takes exactly 1 top"):
        setup("Im2col", "convolution_param { kernel_size: 1 }", (2, 3, 4, 4), ntop=2)
