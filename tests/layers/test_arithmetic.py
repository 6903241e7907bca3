"""Forward and backward of the layers of pycaffe_dist/layers/arithmetic.py (Eltwise, Scale, Bias): Caffe's gradient
checks (settings of Caffe's test_*_layer.cpp on smaller blobs), numpy references where the golden cases do not
reach, in place against out of place, and Caffe's rules for accumulating parameter gradients."""
import numpy as np
import pytest

from tests.layers.gradient_checker import GradientChecker, check_layer, layer_param
from tests.layers.test_shape import backward, gaussian, run


# --- Eltwise ---------------------------------------------------------------------------------------------------

ELTWISE_BOTTOMS = [gaussian(2, 3, 2, seed=i) for i in range(3)]


@pytest.mark.parametrize("param", [
    "eltwise_param { operation: PROD }",
    "eltwise_param { operation: PROD stable_prod_grad: false }",
    "eltwise_param { operation: SUM }",
    "eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 }",
])
def test_eltwise_gradient(param):
    check_layer('type: "Eltwise" ' + param, ELTWISE_BOTTOMS, mode="eltwise")


def test_eltwise_max_gradient():
    # Caffe's TestMaxGradient: a small step, so no perturbation changes which bottom wins
    check_layer('type: "Eltwise" eltwise_param { operation: MAX }', ELTWISE_BOTTOMS, mode="eltwise", stepsize=1e-4)


def test_eltwise_forward_backward_reference():
    a, b, c = ELTWISE_BOTTOMS
    d = gaussian(2, 3, 2, seed=9)
    layer, bottom, top = run('type: "Eltwise" eltwise_param { coeff: 1 coeff: -0.5 coeff: 2 }', [a, b, c])
    np.testing.assert_allclose(top[0].data, a - 0.5 * b + 2 * c)
    backward(layer, top, bottom, [d])
    for blob, k in zip(bottom, (1, -0.5, 2)):
        np.testing.assert_allclose(blob.diff, k * d)
    for stable in ("true", "false"):
        layer, bottom, top = run('type: "Eltwise" eltwise_param { operation: PROD stable_prod_grad: %s }' % stable,
                                 [a, b, c])
        np.testing.assert_allclose(top[0].data, a * b * c)
        backward(layer, top, bottom, [d])
        for blob, others in zip(bottom, (b * c, a * c, a * b)):
            np.testing.assert_allclose(blob.diff, others * d)


def test_eltwise_prod_unstable_gradient_divides_by_the_bottom():
    a, b = np.array([[0.0, 2.0]]), np.array([[3.0, 4.0]])
    layer, bottom, top = run('type: "Eltwise" eltwise_param { operation: PROD stable_prod_grad: false }', [a, b])
    with np.errstate(invalid="ignore"):
        backward(layer, top, bottom, [np.ones((1, 2))])
    assert np.isnan(bottom[0].diff[0, 0]) and bottom[0].diff[0, 1] == 4.0     # 0 / 0, as Caffe's caffe_div
    layer, bottom, top = run('type: "Eltwise" eltwise_param { operation: PROD }', [a, b])
    backward(layer, top, bottom, [np.ones((1, 2))])
    np.testing.assert_array_equal(bottom[0].diff, [[3.0, 4.0]])


def test_eltwise_max_ties_and_mask():
    a = np.array([1.0, 2.0, 5.0, 0.0])
    b = np.array([1.0, 3.0, 4.0, 0.0])
    c = np.array([0.5, 3.0, 6.0, 1.0])
    layer, bottom, top = run('type: "Eltwise" eltwise_param { operation: MAX }', [a, b, c])
    np.testing.assert_array_equal(top[0].data, [1.0, 3.0, 6.0, 1.0])
    # ties: bottom 1 beats bottom 0, a later bottom must be strictly greater
    np.testing.assert_array_equal(layer.max_idx, [1, 1, 2, 2])
    backward(layer, top, bottom, [np.array([10.0, 20.0, 30.0, 40.0])])
    np.testing.assert_array_equal(bottom[0].diff, [0, 0, 0, 0])
    np.testing.assert_array_equal(bottom[1].diff, [10, 20, 0, 0])
    np.testing.assert_array_equal(bottom[2].diff, [0, 0, 30, 40])


# --- Scale, Bias -----------------------------------------------------------------------------------------------

X = gaussian(2, 3, 2, 2)


@pytest.mark.parametrize("param,second", [
    ("scale_param { axis: 0 }", (2, 3, 2, 2)),                  # TestGradientEltwise
    ("scale_param { axis: 0 }", (2, 3)),                        # TestGradientBroadcastBegin
    ("scale_param { axis: 1 }", (3, 2)),                        # TestGradientBroadcastMiddle
    ("scale_param { axis: 2 }", (2, 2)),                        # TestGradientBroadcastEnd
    ("", ()),                                                   # TestGradientScale
    ("scale_param { axis: 2 }", ()),                            # TestGradientScaleAxis2
    ("scale_param { axis: 1 bias_term: true bias_filler { type: 'gaussian' } }", (3,)),
])
def test_scale_two_bottoms_gradient(param, second):
    check_layer('type: "Scale" ' + param, [X, gaussian(*second, seed=1) + 2], mode="exhaustive")


@pytest.mark.parametrize("param", [
    "scale_param { axis: 0 num_axes: -1 filler { type: 'gaussian' } }",                 # EltwiseWithParam
    "scale_param { axis: 1 num_axes: 2 filler { type: 'gaussian' } }",                  # BroadcastMiddleWithParam
    "scale_param { axis: 1 num_axes: 2 filler { type: 'gaussian' } bias_term: true "
    "bias_filler { type: 'gaussian' } }",                                               # ...WithParamAndBias
    "scale_param { num_axes: 0 filler { type: 'gaussian' } bias_term: true bias_filler { type: 'gaussian' } }",
])
def test_scale_learned_gradient(param):
    check_layer('type: "Scale" ' + param, [X], mode="exhaustive")


def out_of_place_and_in_place(text, bottoms, top_diff):
    """Forward output, bottom diffs and param diffs of the layer run with a separate top, then in place."""
    results = []
    for in_place in (False, True):
        gc = GradientChecker()
        layer, bottom, top = gc.make(layer_param(text), bottoms)
        if in_place:
            top = [bottom[0]]
            layer.reshape(bottom, top)
        layer.forward(bottom, top)
        out = top[0].data.copy()
        top[0].diff[...] = top_diff
        layer.backward(top, [True] * len(bottom), bottom)
        results.append((out, [b.diff.copy() for b in bottom], [p.diff.copy() for p in layer.blobs]))
    return results


@pytest.mark.parametrize("text,second", [
    ('type: "Scale" scale_param { axis: 0 }', (2, 3, 2, 2)),
    ('type: "Scale" scale_param { axis: 1 bias_term: true bias_filler { type: "gaussian" } }', (3, 2)),
    ('type: "Scale" scale_param { axis: 1 num_axes: 1 filler { type: "gaussian" } bias_term: true '
     'bias_filler { type: "gaussian" } }', None),
    ('type: "Scale" scale_param { axis: 0 num_axes: -1 filler { type: "gaussian" } }', None),
    ('type: "Bias" bias_param { axis: 1 num_axes: 2 filler { type: "gaussian" } }', None),
    ('type: "Bias"', (3, 2)),
])
def test_in_place_matches_out_of_place(text, second):
    bottoms = [X] + ([] if second is None else [gaussian(*second, seed=1)])
    (out, bdiffs, pdiffs), (out_ip, bdiffs_ip, pdiffs_ip) = out_of_place_and_in_place(
        text, bottoms, gaussian(*X.shape, seed=2))
    np.testing.assert_array_equal(out_ip, out)
    for a, b in zip(bdiffs_ip + pdiffs_ip, bdiffs + pdiffs):
        np.testing.assert_allclose(a, b, rtol=1e-13)


def test_scale_forward_backward_reference():
    s, b = gaussian(3, 2, seed=1), gaussian(3, 2, seed=2)
    layer, bottom, top = run('type: "Scale" scale_param { axis: 1 num_axes: 2 bias_term: true }', [X])
    layer.blobs[0].data[...], layer.blobs[1].data[...] = s, b
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, X * s[None, :, :, None] + b[None, :, :, None], rtol=1e-13)
    d = gaussian(*X.shape, seed=3)
    backward(layer, top, bottom, [d])
    np.testing.assert_allclose(bottom[0].diff, d * s[None, :, :, None], rtol=1e-13)
    np.testing.assert_allclose(layer.blobs[0].diff, (d * X).sum(axis=(0, 3)), rtol=1e-12)
    np.testing.assert_allclose(layer.blobs[1].diff, d.sum(axis=(0, 3)), rtol=1e-12)


@pytest.mark.parametrize("text,shape,accumulates", [
    ('type: "Scale" scale_param { axis: 1 }', (2, 3, 2), True),                       # outer_dim 2
    ('type: "Scale" scale_param { num_axes: 0 }', (2, 3), True),                       # scalar: dot, +=
    ('type: "Scale" scale_param { axis: 1 }', (1, 3, 2), False),                      # outer_dim 1: gemv into diff
    ('type: "Scale" scale_param { axis: 0 num_axes: -1 }', (2, 3), False),            # eltwise: product into diff
])
def test_scale_param_gradient_accumulation_follows_caffe(text, shape, accumulates):
    x, d = gaussian(*shape), gaussian(*shape, seed=1)
    layer, bottom, top = run(text, [x])
    fresh = None
    for before in (0.0, 10.0):
        layer.blobs[0].diff[...] = before
        backward(layer, top, bottom, [d])
        if fresh is None:
            fresh = layer.blobs[0].diff.copy()
        else:
            np.testing.assert_allclose(layer.blobs[0].diff, fresh + (10.0 if accumulates else 0.0), rtol=1e-12)


@pytest.mark.parametrize("text,bottoms", [
    ('type: "Bias" bias_param { axis: 0 }', [X, gaussian(2, 3, 2, 2, seed=1)]),           # TestGradientEltwise
    ('type: "Bias" bias_param { axis: 0 }', [X, gaussian(2, 3, seed=1)]),                  # BroadcastBegin
    ('type: "Bias" bias_param { axis: 1 }', [X, gaussian(3, 2, seed=1)]),                  # BroadcastMiddle
    ('type: "Bias" bias_param { axis: 2 }', [X, gaussian(2, 2, seed=1)]),                  # BroadcastEnd
    ('type: "Bias"', [X, np.array(0.7)]),                                                  # a scalar bias
    ('type: "Bias" bias_param { axis: 1 num_axes: 2 filler { type: "gaussian" } }', [X]),  # WithParam
    ('type: "Bias" bias_param { num_axes: 0 filler { type: "gaussian" } }', [X]),
])
def test_bias_gradient(text, bottoms):
    check_layer(text, bottoms, mode="exhaustive")


def test_bias_param_gradient_accumulates():
    layer, bottom, top = run('type: "Bias" bias_param { axis: 1 num_axes: 1 }', [X])
    d = gaussian(*X.shape, seed=1)
    layer.blobs[0].diff[...] = 1.0
    backward(layer, top, bottom, [d])
    np.testing.assert_allclose(layer.blobs[0].diff, 1.0 + d.sum(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_array_equal(bottom[0].diff, d)
