"""InnerProduct and Embed: gradients (Caffe's checker), values, errors."""
import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from tests.layers.gradient_checker import GradientChecker, check_layer, layer_param

RNG = np.random.default_rng(12)
FILLERS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'


@pytest.mark.parametrize("extra,shape", [
    ("", (2, 3, 4, 5)),                          # Caffe's TestGradient
    ("transpose: true", (2, 3, 4, 5)),           # TestGradientTranspose
    ("axis: 2", (2, 3, 2, 2)),
    ("axis: -1 bias_term: false", (3, 4)),
])
def test_inner_product_gradient(extra, shape):
    check_layer('type: "InnerProduct" inner_product_param { num_output: 5 %s %s }' % (extra, FILLERS),
                [RNG.standard_normal(shape)])


def test_transpose_stores_the_transposed_weights():
    """transpose: true keeps W as (K, N); with W^T copied in, both layers compute the same top."""
    x = RNG.standard_normal((3, 2, 2))
    gc = GradientChecker()
    plain, pb, pt = gc.make(layer_param('type: "InnerProduct" inner_product_param { num_output: 4 %s }' % FILLERS), [x])
    trans, tb, tt = gc.make(layer_param('type: "InnerProduct" inner_product_param { num_output: 4 transpose: true '
                                        '%s }' % FILLERS), [x])
    assert trans.blobs[0].shape == (4, 4) and plain.blobs[0].shape == (4, 4)
    trans.blobs[0].data[...] = plain.blobs[0].data.T
    trans.blobs[1].data[...] = plain.blobs[1].data
    plain.forward(pb, pt)
    trans.forward(tb, tt)
    np.testing.assert_allclose(pt[0].data, x.reshape(3, 4) @ plain.blobs[0].data.T + plain.blobs[1].data)
    np.testing.assert_allclose(tt[0].data, pt[0].data)


def test_embed_param_gradient_with_repeated_indices():
    """Caffe's TestGradient for Embed: only the parameters get gradients; repeated indices add up."""
    idx = np.array([[0, 2], [2, 1], [3, 0]], dtype=np.float64)
    gc = GradientChecker()
    layer, bottom, top = gc.make(layer_param(
        'type: "Embed" embed_param { num_output: 3 input_dim: 4 %s }' % FILLERS), [idx])
    gc.check(layer, bottom, top, check_bottom=-2)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data[1, 0], layer.blobs[0].data[2] + layer.blobs[1].data)


@pytest.mark.parametrize("value", [4.0, -1.0, 1.5])
def test_embed_rejects_bad_indices(value):
    gc = GradientChecker()
    layer, bottom, top = gc.make(layer_param(
        'name: "emb" type: "Embed" embed_param { num_output: 2 input_dim: 4 }'), [np.array([1.0, value])])
    with pytest.raises(NetError, match=r"layer 'emb'.*input 1 is .*integer index in \[0, 4\)"):
        layer.forward(bottom, top)


def test_inner_product_rejects_a_changed_input_size():
    gc = GradientChecker()
    layer, bottom, top = gc.make(layer_param('name: "fc" type: "InnerProduct" inner_product_param '
                                             '{ num_output: 2 }'), [np.zeros((2, 6))])
    bottom[0].reshape(2, 5)
    with pytest.raises(NetError, match="layer 'fc'.*Input size incompatible"):
        layer.reshape(bottom, top)
