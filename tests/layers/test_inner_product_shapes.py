"""Shapes, params and checks of InnerProduct and Embed (pycaffe_dist/layers/inner_product.py)."""
import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.golden_shapes import cases_of, check_case_shapes


@pytest.mark.parametrize("name", cases_of("InnerProduct", "Embed"))
def test_golden_shapes(name):
    check_case_shapes(name)


def setup(type_, text, bottom_shape, blobs=()):
    lp = parse_text('name: "l" type: "%s" %s' % (type_, text), caffe_pb2.LayerParameter())
    for b in blobs:
        Blob(b).to_proto(proto=lp.blobs.add())
    layer = create_layer(lp)
    bottom, top = [Blob(bottom_shape)], [Blob()]
    layer.setup(bottom, top)
    return layer, bottom, top


def ip(text, bottom_shape, **kw):
    return setup("InnerProduct", "inner_product_param { %s }" % text, bottom_shape, **kw)


@pytest.mark.parametrize("text, bottom, out, params", [
    ("num_output: 5", (2, 3, 4, 4), (2, 5), [(5, 48), (5,)]),
    ("num_output: 5 axis: 2", (2, 3, 4, 4), (2, 3, 5), [(5, 16), (5,)]),
    ("num_output: 5 axis: -1", (2, 3, 4), (2, 3, 5), [(5, 4), (5,)]),
    ("num_output: 5 axis: 0", (2, 3, 4), (5,), [(5, 24), (5,)]),
    ("num_output: 5 transpose: true", (2, 3, 4), (2, 5), [(12, 5), (5,)]),
    ("num_output: 5 bias_term: false transpose: true axis: 2", (2, 3, 4), (2, 3, 5), [(4, 5)]),
    ("num_output: 7", (6, 1), (6, 7), [(7, 1), (7,)]),
])
def test_ip_shapes(text, bottom, out, params):
    layer, _, top = ip(text, bottom)
    assert top[0].shape == out
    assert [b.shape for b in layer.blobs] == params


def test_ip_fillers_and_flops():
    layer, bottom, top = ip('num_output: 3 weight_filler { type: "constant" value: 2 } '
                            'bias_filler { type: "constant" value: 1 }', (4, 5))
    assert np.all(layer.blobs[0].data == 2) and np.all(layer.blobs[1].data == 1)
    assert layer.flops(bottom, top) == 4 * 3 * (2 * 5 + 1)


def test_ip_reshape_keeps_k():
    layer, bottom, top = ip("num_output: 5", (2, 3, 4))
    bottom[0].reshape((7, 12))
    layer.reshape(bottom, top)
    assert top[0].shape == (7, 5)
    bottom[0].reshape((7, 3, 5))
    with pytest.raises(NetError, match="Input size incompatible with inner product parameters"):
        layer.reshape(bottom, top)


def test_ip_embedded_weights():
    layer, _, _ = ip("num_output: 2", (3, 4), blobs=[(2, 4), (2,)])
    assert [b.shape for b in layer.blobs] == [(2, 4), (2,)]
    with pytest.raises(NetError, match="Incorrect shape of param blob 0"):
        ip("num_output: 2 transpose: true", (3, 4), blobs=[(2, 4), (2,)])
    with pytest.raises(NetError, match="Incorrect number of weight blobs"):
        ip("num_output: 2 bias_term: false", (3, 4), blobs=[(2, 4), (2,)])


def test_ip_bad_axis():
    with pytest.raises(NetError, match="axis 3 out of range"):
        ip("num_output: 2 axis: 3", (3, 4))


def embed(text, bottom_shape, **kw):
    return setup("Embed", "embed_param { %s }" % text, bottom_shape, **kw)


@pytest.mark.parametrize("text, bottom, out, params", [
    ("num_output: 5 input_dim: 10", (4, 3), (4, 3, 5), [(10, 5), (5,)]),
    ("num_output: 5 input_dim: 10 bias_term: false", (4,), (4, 5), [(10, 5)]),
    ("num_output: 2 input_dim: 3", (2, 1, 3, 1), (2, 1, 3, 1, 2), [(3, 2), (2,)]),
])
def test_embed_shapes(text, bottom, out, params):
    layer, _, top = embed(text, bottom)
    assert top[0].shape == out
    assert [b.shape for b in layer.blobs] == params


def test_embed_errors_and_backward_rules():
    with pytest.raises(NetError, match="EmbedLayer num_output must be positive"):
        embed("input_dim: 3", (2,))
    with pytest.raises(NetError, match="EmbedLayer input_dim must be positive"):
        embed("num_output: 3", (2,))
    with pytest.raises(NetError, match="Incorrect shape of param blob 0"):
        embed("num_output: 2 input_dim: 3", (2,), blobs=[(2, 3), (2,)])
    layer, _, _ = embed("num_output: 2 input_dim: 3", (2,))
    assert layer.has_backward and not layer.allow_force_backward(0)
