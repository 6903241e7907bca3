"""Shapes, params and checks of LRN, MVN and BatchNorm (pycaffe_dist/layers/norm.py)."""
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.golden_shapes import cases_of, check_case_shapes


@pytest.mark.parametrize("name", cases_of("LRN", "MVN", "BatchNorm"))
def test_golden_shapes(name):
    layer, _, _ = check_case_shapes(name)
    if layer.type == "BatchNorm":
        assert [p.lr_mult for p in layer.param.param] == [0, 0, 0]


def setup(type_, text, bottom_shape, phase=caffe_pb2.TRAIN, blobs=()):
    lp = parse_text('name: "l" type: "%s" %s' % (type_, text), caffe_pb2.LayerParameter())
    for b in blobs:
        Blob(b).to_proto(proto=lp.blobs.add())
    layer = create_layer(lp, phase)
    bottom, top = [Blob(bottom_shape)], [Blob()]
    layer.setup(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("text", ["", "lrn_param { local_size: 3 norm_region: WITHIN_CHANNEL }"])
def test_lrn_shape(text):
    layer, bottom, top = setup("LRN", text, (2, 6, 5, 4))
    assert top[0].shape == (2, 6, 5, 4) and layer.blobs == []
    assert layer.flops(bottom, top) > 0


@pytest.mark.parametrize("text, bottom, message", [
    ("lrn_param { local_size: 4 }", (2, 6, 5, 4), "LRN only supports odd values for local_size"),
    ("lrn_param { local_size: 2 norm_region: WITHIN_CHANNEL }", (2, 6, 5, 4), "odd values for local_size"),
    ("", (2, 6, 5), "Input must have 4 axes"),
])
def test_lrn_errors(text, bottom, message):
    with pytest.raises(NetError, match=message):
        setup("LRN", text, bottom)


@pytest.mark.parametrize("bottom, out", [
    ((2, 3, 4, 5), (2, 3, 4, 5)),
    ((2, 3), (2, 3, 1, 1)),        # Caffe reshapes the top with the legacy num/channels/height/width
    ((2, 3, 4), (2, 3, 4, 1)),
])
def test_mvn_shape(bottom, out):
    _, _, top = setup("MVN", "mvn_param { across_channels: true }", bottom)
    assert top[0].shape == out


def test_mvn_refuses_five_axes():
    with pytest.raises(NetError, match="legacy accessors"):
        setup("MVN", "", (1, 2, 3, 4, 5))


@pytest.mark.parametrize("bottom, channels", [((4, 3, 5, 5), 3), ((8, 5), 5), ((2, 7, 3), 7)])
def test_batchnorm_blobs_and_specs(bottom, channels):
    layer, _, top = setup("BatchNorm", "", bottom)
    assert top[0].shape == bottom
    assert [b.shape for b in layer.blobs] == [(channels,), (channels,), (1,)]
    assert not any(b.data.any() for b in layer.blobs)
    # Caffe masks the statistics from the solver with lr_mult 0 specs on the layer's own LayerParameter
    assert [p.lr_mult for p in layer.param.param] == [0, 0, 0]
    assert not layer.use_global_stats


def test_batchnorm_global_stats_default_and_override():
    assert setup("BatchNorm", "", (2, 3), phase=caffe_pb2.TEST)[0].use_global_stats
    assert not setup("BatchNorm", "batch_norm_param { use_global_stats: false }", (2, 3),
                     phase=caffe_pb2.TEST)[0].use_global_stats
    assert setup("BatchNorm", "batch_norm_param { use_global_stats: true }", (2, 3))[0].use_global_stats


def test_batchnorm_param_specs():
    layer, _, _ = setup("BatchNorm", "param { lr_mult: 0 } param { lr_mult: 0 decay_mult: 0 }", (2, 3))
    assert [p.lr_mult for p in layer.param.param] == [0, 0, 0]
    with pytest.raises(NetError, match="Cannot configure batch normalization statistics as layer parameters"):
        setup("BatchNorm", "param { lr_mult: 0 } param { lr_mult: 1 }", (2, 3))
    with pytest.raises(NetError, match="Cannot configure batch normalization statistics"):
        setup("BatchNorm", "param { decay_mult: 0 }", (2, 3))    # lr_mult defaults to 1


def test_batchnorm_embedded_blobs_and_errors():
    layer, _, _ = setup("BatchNorm", "", (2, 3, 4), blobs=[(3,), (3,), (1,)])
    assert [b.shape for b in layer.blobs] == [(3,), (3,), (1,)]
    with pytest.raises(NetError, match="BatchNorm blob 1 has shape"):
        setup("BatchNorm", "", (2, 3, 4), blobs=[(3,), (4,), (1,)])
    with pytest.raises(NetError, match="needs 3 blobs"):
        setup("BatchNorm", "", (2, 3, 4), blobs=[(3,), (3,)])
    with pytest.raises(NetError, match="channel axis"):
        setup("BatchNorm", "", (5,))
    layer, bottom, top = setup("BatchNorm", "", (2, 3, 4))
    bottom[0].reshape((2, 4, 4))
    with pytest.raises(NetError, match="set up for 3 channels"):
        layer.reshape(bottom, top)
