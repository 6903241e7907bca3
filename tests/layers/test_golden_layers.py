"""Every golden layer case of the real Caffe is reproduced: outputs, bottom diffs and parameter diffs."""
import pytest

from tests.layers.golden_cases import layer_case_names, run_layer_case


@pytest.mark.parametrize("name", layer_case_names())
def test_golden_layer_case(name):
    run_layer_case(name)


def test_all_golden_cases_are_found():
    assert len(layer_case_names()) == 110
