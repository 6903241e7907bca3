"""The shared gradient checker itself: it passes a right backward and catches a wrong one."""
import numpy as np
import pytest

from pycaffe_dist.layers.inner_product import InnerProductLayer
from tests.layers.gradient_checker import GradientChecker, layer_param

TEXT = ('type: "InnerProduct" inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } '
        'bias_filler { type: "gaussian" std: 1 } }')


class HalfBiasGradient(InnerProductLayer):
    """InnerProduct whose bias gradient is half what it should be."""
    def backward(self, top, propagate_down, bottom):
        super().backward(top, propagate_down, bottom)
        self.blobs[1].diff[...] *= 0.5


class WrongBottomGradient(InnerProductLayer):
    def backward(self, top, propagate_down, bottom):
        super().backward(top, propagate_down, bottom)
        bottom[0].diff.reshape(-1)[3] += 0.1


def _setup(cls):
    gc = GradientChecker()
    _, bottom, top = gc.make(layer_param(TEXT), [np.random.default_rng(0).standard_normal((2, 4))])
    layer = cls(layer_param(TEXT))
    layer.setup(bottom, top)
    for blob in layer.blobs:
        blob.astype(np.float64)
    return gc, layer, bottom, top


@pytest.mark.parametrize("mode", ["check", "check_exhaustive"])
def test_a_right_backward_passes(mode):
    gc, layer, bottom, top = _setup(InnerProductLayer)
    getattr(gc, mode)(layer, bottom, top)


@pytest.mark.parametrize("cls,what", [(HalfBiasGradient, r"param 1\[\d\]"), (WrongBottomGradient, r"bottom 0\[3\]")])
@pytest.mark.parametrize("mode", ["check", "check_exhaustive"])
def test_a_wrong_backward_is_caught_and_named(cls, what, mode):
    gc, layer, bottom, top = _setup(cls)
    with pytest.raises(AssertionError, match=what):
        getattr(gc, mode)(layer, bottom, top)


def test_kinks_are_skipped():
    """A wrong gradient at inputs within kink_range of the kink is not checked (Caffe's ReLU tests rely on it)."""
    gc, layer, bottom, top = _setup(WrongBottomGradient)
    bottom[0].data.reshape(-1)[3] = 0.001
    GradientChecker(kink=0.0, kink_range=0.01).check(layer, bottom, top, check_bottom=0)
    with pytest.raises(AssertionError):
        GradientChecker().check(layer, bottom, top, check_bottom=0)
