"""Setup and shapes of the neuron layers (pycaffe_dist/layers/activation.py) against Caffe."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.golden_shapes import cases_of, check_case_shapes

NEURON_TYPES = ["ReLU", "PReLU", "ELU", "Sigmoid", "TanH", "AbsVal", "BNLL", "Power", "Exp", "Log", "Threshold",
                "Dropout", "Clip", "Swish"]


def make(text, *bottom_shapes, ntop=1, phase=caffe_pb2.TRAIN):
    lp = parse_text('name: "l" ' + text, caffe_pb2.LayerParameter())
    bottom = [Blob(s) for s in bottom_shapes]
    top = [Blob() for _ in range(ntop)]
    layer = create_layer(lp, phase)
    layer.setup(bottom, top)
    return layer, bottom, top


def extra(layer_type):
    return 'clip_param { min: -1 max: 1 }' if layer_type == "Clip" else ""


# Forward FLOPs per element with the default parameters in TRAIN (a multiply-add counts 2).
FLOPS_PER_ELEMENT = {
    "ReLU": 1,          # max(x, 0); no negative slope
    "PReLU": 3,         # max(x, 0) + a * min(x, 0)
    "ELU": 4,           # compare, exp, -1, * alpha
    "Sigmoid": 4,       # 0.5 * tanh(0.5 x) + 0.5
    "TanH": 1,
    "AbsVal": 1,
    "BNLL": 4,          # x + log(1 + exp(-x)) or log(1 + exp(x))
    "Power": 0,         # power 1, scale 1, shift 0: y = x, nothing computed
    "Exp": 3,           # multiply-add of the input, exp
    "Log": 3,
    "Threshold": 1,
    "Dropout": 2,       # TRAIN: compare the draw, scale
    "Clip": 2,          # max(min, min(x, max))
    "Swish": 6,         # beta * x, sigmoid (4), * x
}


@pytest.mark.parametrize("name", cases_of(*NEURON_TYPES))
def test_golden_shapes(name):
    check_case_shapes(name)


@pytest.mark.parametrize("layer_type", NEURON_TYPES)
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_top_has_bottom_shape(layer_type, shape):
    if layer_type == "PReLU" and len(shape) > 4:
        with pytest.raises(NetError, match="PReLU reads its legacy channel count"):
            make('type: "PReLU"', shape)
        return
    layer, bottom, top = make('type: "%s" %s' % (layer_type, extra(layer_type)), shape)
    assert top[0].shape == shape
    assert layer.flops(bottom, top) == FLOPS_PER_ELEMENT[layer_type] * bottom[0].count
    assert not layer.is_loss


@pytest.mark.parametrize("layer_type", NEURON_TYPES)
def test_exactly_one_bottom_and_top(layer_type):
    with pytest.raises(NetError, match="exactly 1 bottom"):
        make('type: "%s" %s' % (layer_type, extra(layer_type)), (2, 3), (2, 3))
    with pytest.raises(NetError, match="exactly 1 top"):
        make('type: "%s" %s' % (layer_type, extra(layer_type)), (2, 3), ntop=2)


@pytest.mark.parametrize("layer_type", [t for t in NEURON_TYPES if t != "AbsVal"])
def test_in_place_allowed(layer_type):
    """Set up with one blob as bottom and top, the layer computes into it what it computes into a top of its own."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    if layer_type == "Log":
        x = np.abs(x) + np.float32(0.5)     # in its domain
    text = 'name: "l" type: "%s" %s' % (layer_type, extra(layer_type))
    outputs = []
    for in_place in (False, True):
        blob = Blob(x.shape)
        blob.data[...] = x
        top = blob if in_place else Blob()
        layer = create_layer(parse_text(text, caffe_pb2.LayerParameter()), caffe_pb2.TRAIN)
        layer.setup([blob], [top])
        common.set_random_seed(7)          # Dropout draws its mask: the same draws both times
        layer.forward([blob], [top])
        outputs.append(top.data.copy())
    np.testing.assert_array_equal(outputs[1], outputs[0])


def test_absval_refuses_in_place():
    lp = parse_text('name: "l" type: "AbsVal"', caffe_pb2.LayerParameter())
    blob = Blob((2, 3))
    with pytest.raises(NetError, match="in-place"):
        create_layer(lp).setup([blob], [blob])


def test_prelu_channelwise_default_filler():
    layer, _, _ = make('type: "PReLU"', (2, 3, 4, 5))
    assert [b.shape for b in layer.blobs] == [(3,)]
    np.testing.assert_array_equal(layer.blobs[0].data, np.full(3, 0.25, np.float32))


def test_prelu_channel_shared_is_a_scalar_blob():
    layer, _, _ = make('type: "PReLU" prelu_param { channel_shared: true filler { type: "constant" value: 0.5 } }',
                       (2, 3, 4, 5))
    assert [b.shape for b in layer.blobs] == [()]
    assert float(layer.blobs[0].data) == 0.5


def test_prelu_keeps_blobs_of_the_layer_parameter():
    layer, _, _ = make('type: "PReLU" blobs { shape { dim: 3 } data: 1 data: 2 data: 3 }', (2, 3, 4))
    np.testing.assert_array_equal(layer.blobs[0].data, [1, 2, 3])


def test_prelu_rejects_inconsistent_blob_and_one_axis_bottom():
    with pytest.raises(NetError, match="inconsistent"):
        make('type: "PReLU" blobs { shape { dim: 4 } data: 1 data: 2 data: 3 data: 4 }', (2, 3, 4))
    with pytest.raises(NetError, match="inconsistent"):
        make('type: "PReLU" prelu_param { channel_shared: true } blobs { shape { dim: 3 } data: 1 data: 2 data: 3 }',
             (2, 3, 4))
    with pytest.raises(NetError, match=">=2"):
        make('type: "PReLU"', (5,))


@pytest.mark.parametrize("layer_type,param", [("Exp", "exp_param"), ("Log", "log_param")])
def test_exp_log_base_must_be_positive(layer_type, param):
    make('type: "%s" %s { base: -1 }' % (layer_type, param), (2, 3))     # -1 = natural base
    make('type: "%s" %s { base: 2 }' % (layer_type, param), (2, 3))
    for base in (0, -2):
        with pytest.raises(NetError, match="strictly positive"):
            make('type: "%s" %s { base: %g }' % (layer_type, param, base), (2, 3))


def test_threshold_has_no_backward():
    layer, _, _ = make('type: "Threshold"', (2, 3))
    assert layer.has_backward is False
    assert make('type: "ReLU"', (2, 3))[0].has_backward is True


def test_dropout_ratio_and_flops_by_phase():
    with pytest.raises(NetError, match="dropout_ratio"):
        make('type: "Dropout" dropout_param { dropout_ratio: 1 }', (2, 3))
    with pytest.raises(NetError, match="dropout_ratio"):
        make('type: "Dropout" dropout_param { dropout_ratio: -0.5 }', (2, 3))
    layer, bottom, top = make('type: "Dropout"', (2, 3), phase=caffe_pb2.TRAIN)
    assert layer.scale == 2.0 and layer.flops(bottom, top) > 0
    layer, bottom, top = make('type: "Dropout"', (2, 3), phase=caffe_pb2.TEST)
    assert layer.flops(bottom, top) == 0


def test_clip_needs_min_and_max():
    with pytest.raises(NetError, match="min and max"):
        make('type: "Clip"', (2, 3))
    with pytest.raises(NetError, match="min and max"):
        make('type: "Clip" clip_param { min: 0 }', (2, 3))


def test_flops_counts():
    shape = (2, 3, 4)
    layer, bottom, top = make('type: "ReLU"', shape)
    assert layer.flops(bottom, top) == 24
    layer, bottom, top = make('type: "ReLU" relu_param { negative_slope: 0.1 }', shape)
    assert layer.flops(bottom, top) == 72
    layer, bottom, top = make('type: "Power" power_param { power: 2 scale: 3 shift: 1 }', shape)
    assert layer.flops(bottom, top) == 72
    layer, bottom, top = make('type: "Power" power_param { power: 2 scale: 0 }', shape)
    assert layer.flops(bottom, top) == 0    # constant output
