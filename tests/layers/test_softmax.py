"""Softmax layer (pycaffe_dist/layers/softmax.py) and its kernel (csrc/softmax.pyx via pycaffe_dist/backend/softmax.py):
values against numpy, in place, both dtypes, and Caffe's gradient checks (test_softmax_layer.cpp)."""
import numpy as np
import pytest

from pycaffe_dist.backend import softmax
from pycaffe_dist.errors import NetError
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from tests.layers.gradient_checker import check_layer, layer_param


def reference(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def reference_backward(y, dy, axis):
    y, dy = y.astype(np.float64), dy.astype(np.float64)
    return (dy - (dy * y).sum(axis=axis, keepdims=True)) * y


def run(text, x, dy=None, in_place=False):
    """Forward (and backward with top diff dy) of the layer on one bottom; returns (top data, bottom diff)."""
    bottom = Blob(x.shape, dtype=x.dtype)
    bottom.data[...] = x
    top = bottom if in_place else Blob(dtype=x.dtype)
    layer = create_layer(layer_param(text))
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    y = top.data.copy()
    if dy is None:
        return y, None
    top.diff[...] = dy
    layer.backward([top], [True], [bottom])
    return y, bottom.diff.copy()


# (shape, axis): 2-D scores (rows), the (N, C, H, W) channel axis, inner > BLOCK with a remainder block, enough
# elements to run the OpenMP path (blocks and rows), and axes 0 and -1.
SHAPES = [((4, 10), 1), ((2, 4, 3, 3), 1), ((2, 3, 4, 2), 2), ((2, 5, 300), 1), ((3, 11, 40, 30), 1),
          ((4100, 8), 1), ((6, 3, 2), 0), ((2, 3, 7), -1)]


@pytest.mark.parametrize("shape,axis", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_backward_match_numpy(shape, axis, dtype):
    rng = np.random.default_rng(len(shape) * 100 + shape[0])
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y, dx = run('type: "Softmax" softmax_param { axis: %d }' % axis, x, dy)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(y, reference(x, axis), rtol=tol * 10, atol=tol)
    np.testing.assert_allclose(dx, reference_backward(y, dy, axis), rtol=tol * 10, atol=tol)
    assert y.dtype == dtype and dx.dtype == dtype


@pytest.mark.parametrize("shape,axis", [((4, 10), 1), ((2, 5, 300), 1), ((3, 11, 40, 30), 1), ((4100, 8), 1)])
def test_in_place_matches_out_of_place(shape, axis):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    dy = rng.standard_normal(shape).astype(np.float32)
    y, dx = run('type: "Softmax"', x, dy)
    y_in, dx_in = run('type: "Softmax"', x, dy, in_place=True)
    np.testing.assert_array_equal(y_in, y)
    np.testing.assert_array_equal(dx_in, dx)


def test_large_and_infinite_scores():
    # Subtracting the max keeps huge scores finite; -inf scores get probability 0.
    x = np.array([[1e30, 1e30 - 1e24, 0.0], [-np.inf, 0.0, 0.0], [88.0, 89.0, -1e30]], np.float32)
    y, _ = run('type: "Softmax"', x)
    np.testing.assert_allclose(y, [[1, 0, 0], [0, 0.5, 0.5], reference(x[2:], 1)[0]], rtol=1e-6, atol=0)
    assert np.isfinite(y).all()


def test_propagate_down_false_leaves_bottom_diff():
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    bottom, top = Blob(x.shape), Blob()
    bottom.data[...] = x
    bottom.diff[...] = 7
    layer = create_layer(layer_param('type: "Softmax"'))
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    layer.backward([top], [False], [bottom])
    assert (bottom.diff == 7).all()


def test_kernel_rejects_mismatched_and_non_contiguous_outputs():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="shape"):
        softmax.forward(x, np.zeros((2, 4, 3), np.float32), 1)
    with pytest.raises(ValueError, match="C-contiguous"):
        softmax.forward(x, np.zeros((4, 3, 2), np.float32).T, 1)
    softmax.forward(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), 1)   # empty: nothing to do


def test_axis_out_of_range_names_the_layer():
    with pytest.raises(NetError, match="Softmax.*axis 4 out of range"):
        run('type: "Softmax" softmax_param { axis: 4 }', np.zeros((2, 3, 4), np.float32))


# Caffe's test_softmax_layer.cpp: GradientChecker(1e-2, 1e-3), exhaustive. Smaller blobs than Caffe's (2, 10, 2, 3)
# to keep the exhaustive check fast.
@pytest.mark.parametrize("shape,axis", [((2, 5, 2, 3), 1), ((2, 3, 4, 2), 2), ((3, 6), 1), ((4, 3, 2), 0)])
def test_gradient(shape, axis):
    x = np.random.default_rng(1701).standard_normal(shape)
    check_layer('type: "Softmax" softmax_param { axis: %d }' % axis, [x], mode="exhaustive",
                stepsize=1e-2, threshold=1e-3)
