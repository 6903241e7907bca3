"""Fillers (Caffe's filler.hpp): fans, formulas, the checks Caffe makes, and their order in a net."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.blob.filler import fill
from pycaffe_dist.errors import NetError
from pycaffe_dist.proto import caffe_pb2


def filler(**kw):
    return caffe_pb2.FillerParameter(**kw)


def test_fillers_follow_caffe_formulas():
    common.set_random_seed(7)
    shape = (200, 50, 3, 3)      # fan_in = 450, fan_out = 1800
    xavier = fill(filler(type="xavier"), Blob(shape)).data
    assert np.abs(xavier).max() <= np.sqrt(3 / 450) and np.abs(xavier).max() > 0.95 * np.sqrt(3 / 450)
    avg = fill(filler(type="xavier", variance_norm=caffe_pb2.FillerParameter.AVERAGE), Blob(shape)).data
    assert np.abs(avg).max() <= np.sqrt(3 / 1125)
    msra = fill(filler(type="msra", variance_norm=caffe_pb2.FillerParameter.FAN_OUT), Blob(shape)).data
    assert msra.std() == pytest.approx(np.sqrt(2 / 1800), rel=0.02)
    gauss = fill(filler(type="gaussian", std=0.5, mean=1, sparse=20), Blob((100, 400))).data
    assert (gauss != 0).mean() == pytest.approx(0.2, abs=0.02)   # sparse / num_outputs
    ball = fill(filler(type="positive_unitball"), Blob((4, 3, 2))).data
    np.testing.assert_allclose(ball.reshape(4, -1).sum(1), 1, rtol=1e-6)
    assert fill(filler(type="constant", value=2.5), Blob((3,))).data.tolist() == [2.5] * 3
    uni = fill(filler(type="uniform", min=-2, max=-1), Blob((1000,))).data
    assert uni.min() >= -2 and uni.max() <= -1


def test_bilinear_filler_matches_caffe_kernel():
    # Caffe's FCN upsampling kernel for factor 2 (kernel 4): outer product of [0.25, 0.75, 0.75, 0.25].
    k = fill(filler(type="bilinear"), Blob((1, 1, 4, 4))).data[0, 0]
    np.testing.assert_allclose(k, np.outer([0.25, 0.75, 0.75, 0.25], [0.25, 0.75, 0.75, 0.25]))
    # Odd sizes: Caffe's c = (width - 1) / (2 f) centres the kernel: [0.5, 1, 0.5] for width 3.
    k3 = fill(filler(type="bilinear"), Blob((2, 1, 3, 3))).data[1, 0]
    np.testing.assert_allclose(k3, np.outer([0.5, 1, 0.5], [0.5, 1, 0.5]))
    with pytest.raises(NetError, match="height == width"):
        fill(filler(type="bilinear"), Blob((1, 1, 4, 3)))


@pytest.mark.parametrize("kind", ["xavier", "msra", "uniform", "constant", "positive_unitball", "bilinear"])
def test_sparse_is_refused_by_all_fillers_but_gaussian(kind):
    with pytest.raises(NetError, match="sparse is only supported by the gaussian filler"):
        fill(filler(type=kind, sparse=3), Blob((1, 1, 2, 2)))


@pytest.mark.parametrize("kw,shape,match", [
    (dict(type="gaussian", std=0), (2, 3), "std must be positive"),                 # caffe_rng_gaussian
    (dict(type="gaussian", std=-1), (2, 3), "std must be positive"),
    (dict(type="gaussian", sparse=5), (2, 100), r"sparse \(5\) must not exceed"),   # bernoulli p > 1
    (dict(type="gaussian", sparse=1), (), "at least one axis"),
    (dict(type="gaussian", sparse=-2), (2, 3), "sparse must be -1"),
    (dict(type="constant", sparse=-5), (2, 3), "sparse must be -1"),
    (dict(type="uniform", min=1, max=0), (2, 3), r"min \(1\) must not be above max \(0\)"),
    (dict(type="xavier"), (3, 0), "no elements"),                                  # CHECK(count)
    (dict(type="constant"), (0,), "no elements"),
])
def test_fillers_refuse_what_caffe_checks(kw, shape, match):
    with pytest.raises(NetError, match=match):
        fill(filler(**kw), Blob(shape))


def test_a_layers_refused_filler_names_the_layer_at_setup():
    from pycaffe_dist.io.prototxt import parse_text
    from pycaffe_dist.net.net import Net
    text = ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }'
            'layer { name: "fc" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 4 '
            'weight_filler { type: "gaussian" std: 0 } } }')
    with pytest.raises(NetError, match=r"layer 'fc' \(InnerProduct\): gaussian filler: std must be positive"):
        Net(parse_text(text, caffe_pb2.NetParameter()), fill_params=False)


def test_unknown_filler():
    with pytest.raises(NetError, match="unknown filler type 'he_normal'"):
        fill(filler(type="he_normal"), Blob((2,)))


def test_lazy_filler_runs_in_layer_order_for_reproducibility():
    from pycaffe_dist.io.prototxt import parse_text
    from pycaffe_dist.net.net import Net
    text = ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }'
            'layer { name: "a" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 4 '
            'weight_filler { type: "gaussian" } } }')
    param = parse_text(text, caffe_pb2.NetParameter())
    common.set_random_seed(3)
    first = Net(param).layers[1].blobs[0].data.copy()
    common.set_random_seed(3)
    second = Net(param).layers[1].blobs[0].data
    np.testing.assert_array_equal(first, second)
    common.set_random_seed(3)
    lazy = Net(param, fill_params=False)
    assert lazy.layers[1].blobs[0].data_memory is None
    np.testing.assert_array_equal(lazy.layers[1].blobs[0].data, first)
