"""Setup and shapes of the Softmax layer (pycaffe_dist/layers/softmax.py) against Caffe."""
import pytest

from tests.layers.golden_shapes import cases_of, check_case_shapes
from tests.layers.test_shape_shapes import fails, make


@pytest.mark.parametrize("name", cases_of("Softmax"))
def test_golden_shapes(name):
    check_case_shapes(name)


def test_softmax():
    layer, bottom, top = make('type: "Softmax" softmax_param { axis: -1 }', (2, 3, 4))
    assert top[0].shape == (2, 3, 4) and layer.axis == 2 and layer.flops(bottom, top) > 0
    fails("out of range", 'type: "Softmax" softmax_param { axis: 3 }', (2, 3, 4))
