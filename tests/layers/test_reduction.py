"""Forward and backward of the layers of pycaffe_dist/layers/reduction.py (ArgMax, Reduction): Caffe's tie rule and
gradient checks, numpy references and errors."""
import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from tests.layers.gradient_checker import check_layer
from tests.layers.test_shape import backward, gaussian, run


# --- ArgMax ----------------------------------------------------------------------------------------------------

def caffe_argmax(values, k):
    """std::partial_sort of (value, index) pairs with std::greater over the last axis, as index array."""
    out = np.empty(values.shape[:-1] + (k,), dtype=np.int64)
    for pos in np.ndindex(values.shape[:-1]):
        pairs = sorted(((v, j) for j, v in enumerate(values[pos])), reverse=True)
        out[pos] = [j for _, j in pairs[:k]]
    return out


def test_argmax_ties_take_the_larger_index():
    x = np.array([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    _, _, top = run('type: "ArgMax"', [x])
    np.testing.assert_array_equal(top[0].data.reshape(2), [4, 4])
    _, _, top = run('type: "ArgMax" argmax_param { top_k: 3 out_max_val: true }', [x])
    np.testing.assert_array_equal(top[0].data.reshape(2, 2, 3), [[[4, 2, 1], [3, 3, 3]], [[4, 3, 2], [2, 2, 2]]])


@pytest.mark.parametrize("param", [
    "argmax_param { top_k: 4 }",
    "argmax_param { top_k: 2 out_max_val: true }",
    "argmax_param { axis: 1 top_k: 3 }",
    "argmax_param { axis: -1 top_k: 2 out_max_val: true }",
    "argmax_param { axis: 0 }",
])
def test_argmax_reference_with_ties(param):
    x = np.round(gaussian(3, 4, 5) * 2) / 2      # many equal values
    layer, _, top = run('type: "ArgMax" ' + param, [x])
    if layer.axis is None:
        values = x.reshape(3, -1)
        index = caffe_argmax(values, layer.top_k)
        expect = index if not layer.out_max_val else \
            np.concatenate([index, np.take_along_axis(values, index, -1)], axis=1)
    else:
        values = np.moveaxis(x, layer.axis, -1)
        index = caffe_argmax(values, layer.top_k)
        expect = np.moveaxis(np.take_along_axis(values, index, -1) if layer.out_max_val else index, -1, layer.axis)
    np.testing.assert_array_equal(top[0].data.reshape(expect.shape), expect)


def test_argmax_has_no_backward():
    layer, bottom, top = run('type: "ArgMax"', [gaussian(2, 3)])
    with pytest.raises(NetError, match="no backward"):
        layer.backward(top, [True], bottom)


# --- Reduction -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("extra", ["", "coeff: 2.3", "axis: 1", "axis: 1 coeff: -0.5", "axis: -1"])
def test_reduction_gradient(op, extra):
    check_layer('type: "Reduction" reduction_param { operation: %s %s }' % (op, extra), [gaussian(2, 3, 2)],
                mode="exhaustive")


@pytest.mark.parametrize("op,fn", [("SUM", np.sum), ("ASUM", lambda v, axis: np.abs(v).sum(axis)),
                                   ("SUMSQ", lambda v, axis: (v * v).sum(axis)), ("MEAN", np.mean)])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_reduction_forward_reference(op, fn, axis):
    x = gaussian(2, 3, 4)
    _, _, top = run('type: "Reduction" reduction_param { operation: %s axis: %d coeff: 1.5 }' % (op, axis), [x])
    expect = 1.5 * fn(x.reshape(x.shape[:axis] + (-1,)), axis=-1)
    assert top[0].shape == x.shape[:axis]
    np.testing.assert_allclose(top[0].data, expect, rtol=1e-12)


def test_reduction_backward_reference():
    x = gaussian(2, 3, 4)
    x[0, 0, 0] = 0.0       # sign(0) = 0, as caffe_cpu_sign
    d = np.array([0.5, -2.0])
    for op, grad in [("SUM", np.ones_like(x)), ("ASUM", np.sign(x)), ("SUMSQ", 2 * x), ("MEAN", np.ones_like(x) / 12)]:
        layer, bottom, top = run('type: "Reduction" reduction_param { operation: %s axis: 1 coeff: 3 }' % op, [x])
        backward(layer, top, bottom, [d])
        np.testing.assert_allclose(bottom[0].diff, 3 * grad * d[:, None, None], rtol=1e-12)


def test_reduction_mean_scales_in_float32_like_caffe():
    x = np.arange(1, 8, dtype=np.float32)[None]        # 7 values: 1/7 is inexact in float32
    _, _, top = run('type: "Reduction" reduction_param { operation: MEAN axis: 1 }', [x], dtype=np.float32)
    assert top[0].data.dtype == np.float32
    assert top[0].data[0] == np.float32(28) * (np.float32(1) / np.float32(7))
