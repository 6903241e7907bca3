"""The arithmetic layers (Eltwise, Bias, Scale of pycaffe_dist/layers/arithmetic.py; kernels in csrc/cuda/shape.cu
and math.cu) on the device against their CPU code: tops, bottom diffs and parameter diffs for each layer and its
settings."""
import numpy as np
import pytest

from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from tests.gpu.test_activation_gpu import compare_layer, gaussian
from tests.gpu.test_shape_gpu import SHAPE, inputs, run
from tests.layers.gradient_checker import layer_param


# --- Eltwise -----------------------------------------------------------------------------------------------------

def ties(*shapes, seed=0):
    """Inputs on a coarse grid, so that bottoms often tie (MAX's mask then decides who gets the gradient)."""
    return [np.round(2 * x) / 2 for x in inputs(*shapes, seed=seed)]


@pytest.mark.parametrize("param,num", [
    ("", 2),                                                               # SUM, the default
    ("eltwise_param { operation: SUM }", 3),
    ("eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 }", 3),
    ("eltwise_param { operation: SUM coeff: 0.3 coeff: 1 }", 2),
    ("eltwise_param { operation: PROD }", 2),
    ("eltwise_param { operation: PROD }", 3),
    ("eltwise_param { operation: PROD stable_prod_grad: false }", 3),
    ("eltwise_param { operation: MAX }", 2),
    ("eltwise_param { operation: MAX }", 4),
])
@pytest.mark.parametrize("tied", [False, True])
def test_eltwise(gpu, param, num, tied):
    text = 'type: "Eltwise" ' + param
    bottoms = ties(*[SHAPE] * num) if tied else inputs(*[SHAPE] * num)
    if "stable_prod_grad: false" in param:
        bottoms = [b + np.float32(3.0) for b in bottoms]      # top / bottom: keep away from 0
    compare_layer(gpu, text, bottoms, inputs(SHAPE, seed=20), bottom_diffs=inputs(*[SHAPE] * num, seed=50))


def test_eltwise_some_bottoms_only(gpu):
    old = inputs(SHAPE, SHAPE, SHAPE, seed=50)
    for op in ("SUM", "PROD", "MAX"):
        got = compare_layer(gpu, 'type: "Eltwise" eltwise_param { operation: %s }' % op, ties(SHAPE, SHAPE, SHAPE),
                            inputs(SHAPE, seed=20), propagate_down=[False, True, True], bottom_diffs=old)
        np.testing.assert_array_equal(got["bottom diff 0"], old[0])


def test_eltwise_in_place(gpu):
    for op in ("SUM", "PROD", "MAX"):
        compare_layer(gpu, 'type: "Eltwise" eltwise_param { operation: %s }' % op, inputs(SHAPE, SHAPE),
                      inputs(SHAPE, seed=20), in_place=True)


# --- Bias, Scale ------------------------------------------------------------------------------------------------

def learned(text, shapes):
    """Values and earlier gradients (learned gradients accumulate) for the layer's parameter blobs, shaped as the
    layer makes them."""
    layer = create_layer(layer_param(text))
    layer.setup([Blob(s) for s in shapes], [Blob()])
    return ([gaussian(*b.shape, seed=30 + i) for i, b in enumerate(layer.blobs)],
            [gaussian(*b.shape, seed=40 + i) for i, b in enumerate(layer.blobs)])


@pytest.mark.parametrize("param,shapes", [
    ("", [SHAPE]),                                                        # axis 1, num_axes 1
    ("bias_param { axis: 0 num_axes: 2 }", [SHAPE]),
    ("bias_param { num_axes: 0 }", [SHAPE]),                              # a scalar
    ("bias_param { axis: -1 num_axes: -1 }", [SHAPE]),
    ("bias_param { axis: 0 num_axes: -1 }", [SHAPE]),                     # outer 1, inner 1
    ("bias_param { axis: 1 }", [SHAPE, (3, 4)]),                          # the bias is bottom 1
    ("bias_param { axis: 0 }", [SHAPE, (2,)]),
    ("", [(40, 2, 7)]),         # summed in parts that carry across images (layers/channel_sums.py)
])
@pytest.mark.parametrize("in_place", [False, True])
def test_bias(gpu, param, shapes, in_place):
    text = 'type: "Bias" ' + param
    params, old = learned(text, shapes)
    run(gpu, text, shapes, params=params, param_diffs=old, in_place=in_place)


@pytest.mark.parametrize("param,shapes", [
    ("", [SHAPE]),                                                        # axis 1, num_axes 1
    ("scale_param { bias_term: true }", [SHAPE]),
    ("scale_param { axis: 0 num_axes: -1 bias_term: true }", [SHAPE]),     # outer 1: Caffe assigns the gradient
    ("scale_param { axis: 0 num_axes: 1 }", [SHAPE]),
    ("scale_param { num_axes: 0 bias_term: true }", [SHAPE]),             # a scalar: accumulated
    ("scale_param { axis: 2 num_axes: 2 }", [SHAPE]),
    ("scale_param { axis: 1 }", [SHAPE, (3, 4)]),                         # the scale is bottom 1
    ("scale_param { axis: 1 bias_term: true }", [SHAPE, (3,)]),
    ("scale_param { axis: 0 bias_term: true }", [SHAPE, (2, 3)]),
    ("scale_param { axis: 0 }", [(1, 3, 4), (1,)]),                        # outer 1, a one-value scale bottom
    ("scale_param { bias_term: true }", [(40, 2, 7)]),    # summed in parts that carry across images
    ("", [(64, 2, 3, 3)]),                                # parts that step two images at a time
])
@pytest.mark.parametrize("in_place", [False, True])
def test_scale(gpu, param, shapes, in_place):
    text = 'type: "Scale" ' + param
    params, old = learned(text, shapes)
    run(gpu, text, shapes, params=params, param_diffs=old, in_place=in_place)


def test_scale_propagate_down_choices(gpu):
    # only the scale bottom, then only the data bottom
    for down in ([False, True], [True, False]):
        old = inputs(SHAPE, (3,), seed=50)
        got = run(gpu, 'type: "Scale" scale_param { axis: 1 }', [SHAPE, (3,)], propagate_down=down, bottom_diffs=old)
        skipped = down.index(False)
        np.testing.assert_array_equal(got["bottom diff %d" % skipped], old[skipped])
