"""Setup and shapes of the layers of pycaffe_dist/layers/reduction.py (ArgMax, Reduction) against Caffe."""
import pytest

from tests.layers.golden_shapes import cases_of, check_case_shapes
from tests.layers.test_shape_shapes import fails, make, tops


@pytest.mark.parametrize("name", cases_of("ArgMax", "Reduction"))
def test_golden_shapes(name):
    check_case_shapes(name)


# --- ArgMax ------------------------------------------------------------------------------------------------

def test_argmax_shapes():
    assert tops('type: "ArgMax"', (2, 10)) == [(2, 1, 1)]
    assert tops('type: "ArgMax" argmax_param { out_max_val: true top_k: 3 }', (2, 10)) == [(2, 2, 3)]
    assert tops('type: "ArgMax" argmax_param { top_k: 4 }', (2, 3, 4, 5)) == [(2, 1, 4, 1)]
    assert tops('type: "ArgMax"', (2, 3, 4, 5, 6)) == [(2, 1, 1, 1, 1)]
    assert tops('type: "ArgMax" argmax_param { axis: 1 top_k: 2 out_max_val: true }', (2, 5, 3)) == [(2, 2, 3)]
    assert tops('type: "ArgMax" argmax_param { axis: -1 }', (2, 5, 3)) == [(2, 5, 1)]
    assert make('type: "ArgMax"', (2, 10))[0].has_backward is False


def test_argmax_errors():
    fails("top_k must be less than or equal to the dimension of the axis",
          'type: "ArgMax" argmax_param { axis: 1 top_k: 6 }', (2, 5, 3))
    fails("flattened bottom blob per instance", 'type: "ArgMax" argmax_param { top_k: 16 }', (2, 5, 3))
    fails("top k must not be less than 1", 'type: "ArgMax" argmax_param { top_k: 0 }', (2, 5))
    fails("out of range", 'type: "ArgMax" argmax_param { axis: 3 }', (2, 5, 3))


# --- Reduction -------------------------------------------------------------------------------------------------

def test_reduction():
    assert tops('type: "Reduction"', (2, 3, 4)) == [()]
    assert tops('type: "Reduction" reduction_param { axis: 1 }', (2, 3, 4)) == [(2,)]
    assert tops('type: "Reduction" reduction_param { axis: -1 operation: MEAN }', (2, 3, 4)) == [(2, 3)]
    layer, bottom, top = make('type: "Reduction" reduction_param { operation: SUMSQ axis: 1 }', (2, 3, 4))
    assert layer.flops(bottom, top) == 48
    fails("out of range", 'type: "Reduction" reduction_param { axis: 3 }', (2, 3, 4))
