"""Setup and shapes of the layers of pycaffe_dist/layers/arithmetic.py (Eltwise, Scale, Bias) against Caffe."""
import numpy as np
import pytest

from tests.layers.golden_shapes import cases_of, check_case_shapes
from tests.layers.test_shape_shapes import fails, make, tops


@pytest.mark.parametrize("name", cases_of("Eltwise", "Scale", "Bias"))
def test_golden_shapes(name):
    check_case_shapes(name)


# --- Eltwise -----------------------------------------------------------------------------------------------

def test_eltwise():
    assert tops('type: "Eltwise"', (2, 3), (2, 3), (2, 3)) == [(2, 3)]
    layer, bottom, top = make('type: "Eltwise"', (2, 3), (2, 3))
    assert layer.flops(bottom, top) == 6
    layer, bottom, top = make('type: "Eltwise" eltwise_param { coeff: 1 coeff: -1 }', (2, 3), (2, 3))
    assert layer.flops(bottom, top) == 18
    layer, bottom, top = make('type: "Eltwise" eltwise_param { operation: MAX }', (2, 3), (2, 3), (2, 3))
    assert layer.flops(bottom, top) == 12


def test_eltwise_errors():
    fails("one coefficient per bottom", 'type: "Eltwise" eltwise_param { coeff: 1 }', (2, 3), (2, 3))
    fails("one coefficient per bottom", 'type: "Eltwise" eltwise_param { coeff: 1 coeff: 2 coeff: 3 }',
          (2, 3), (2, 3))
    fails("only takes coefficients for summation",
          'type: "Eltwise" eltwise_param { operation: PROD coeff: 1 coeff: 2 }', (2, 3), (2, 3))
    fails("same shape", 'type: "Eltwise"', (2, 3), (3, 2))
    fails("same shape", 'type: "Eltwise"', (2, 3), (2, 3, 1))
    fails("at least 2 bottom", 'type: "Eltwise"', (2, 3))
    fails("exactly 1 top", 'type: "Eltwise" eltwise_param { operation: MAX }', (2, 3), (2, 3), ntop=2)


# --- Scale, Bias ------------------------------------------------------------------------------------------------

def test_scale_learned_blobs_and_fillers():
    layer, bottom, top = make('type: "Scale"', (2, 3, 4, 5))
    assert top[0].shape == (2, 3, 4, 5) and [b.shape for b in layer.blobs] == [(3,)]
    np.testing.assert_array_equal(layer.blobs[0].data, np.ones(3, np.float32))        # default filler: 1
    layer, bottom, top = make('type: "Scale" scale_param { axis: 1 num_axes: -1 bias_term: true '
                              'filler { type: "constant" value: 3 } }', (2, 3, 4))
    assert [b.shape for b in layer.blobs] == [(3, 4), (3, 4)]
    assert np.all(layer.blobs[0].data == 3) and np.all(layer.blobs[1].data == 0)     # bias default: 0
    assert layer.flops(bottom, top) == 48
    layer, _, _ = make('type: "Scale" scale_param { num_axes: 0 bias_term: true }', (2, 3))
    assert [b.shape for b in layer.blobs] == [(), ()]
    layer, _, _ = make('type: "Scale" scale_param { axis: -2 num_axes: 2 }', (2, 3, 4))
    assert [b.shape for b in layer.blobs] == [(3, 4)]


def test_scale_two_bottoms():
    layer, _, top = make('type: "Scale"', (2, 3, 4), (3,))
    assert top[0].shape == (2, 3, 4) and layer.blobs == []
    layer, _, top = make('type: "Scale" scale_param { axis: 0 bias_term: true }', (2, 3, 4), (2, 3))
    assert [b.shape for b in layer.blobs] == [(2, 3)]
    layer, _, _ = make('type: "Scale"', (2, 3, 4), ())          # a scalar scale applies everywhere
    assert layer.axis == 0


def test_scale_errors():
    fails("dimension mismatch", 'type: "Scale"', (2, 3, 4), (4,))
    fails("extends past", 'type: "Scale" scale_param { axis: 2 }', (2, 3, 4), (4, 1))
    fails("extends past", 'type: "Scale" scale_param { axis: 2 num_axes: 2 }', (2, 3, 4))
    fails("num_axes must be non-negative", 'type: "Scale" scale_param { num_axes: -2 }', (2, 3, 4))
    fails("at most 2 bottom", 'type: "Scale"', (2, 3), (3,), (3,))


def test_scale_keeps_blobs_of_the_layer_parameter():
    layer, _, _ = make('type: "Scale" scale_param { bias_term: true } '
                       'blobs { shape { dim: 2 } data: 5 data: 6 } blobs { shape { dim: 2 } data: 7 data: 8 }', (1, 2))
    np.testing.assert_array_equal(layer.blobs[0].data, [5, 6])
    np.testing.assert_array_equal(layer.blobs[1].data, [7, 8])
    fails("dimension mismatch", 'type: "Scale" blobs { shape { dim: 3 } data: 5 data: 6 data: 7 }', (1, 2))
    fails("expected 2 parameter blob", 'type: "Scale" scale_param { bias_term: true } '
          'blobs { shape { dim: 2 } data: 5 data: 6 }', (1, 2))


def test_bias():
    layer, _, top = make('type: "Bias"', (2, 3, 4))
    assert top[0].shape == (2, 3, 4) and [b.shape for b in layer.blobs] == [(3,)]
    assert np.all(layer.blobs[0].data == 0)
    layer, _, _ = make('type: "Bias" bias_param { axis: 0 num_axes: -1 filler { type: "constant" value: 2 } }',
                       (2, 3))
    assert [b.shape for b in layer.blobs] == [(2, 3)] and np.all(layer.blobs[0].data == 2)
    layer, _, top = make('type: "Bias"', (2, 3, 4), (3, 4))
    assert layer.blobs == [] and top[0].shape == (2, 3, 4)
    fails("dimension mismatch", 'type: "Bias"', (2, 3, 4), (4,))
    fails("extends past", 'type: "Bias" bias_param { axis: 2 num_axes: 2 }', (2, 3, 4))
