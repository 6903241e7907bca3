"""Reduction (pycaffe_dist/layers/reduction.py) on the GPU code path (csrc/cuda/reduction.cu) against its CPU code:
every operation, axis and coefficient, slices long enough to take several passes of partial sums, and a top that
stays on the device."""
import numpy as np
import pytest

from pycaffe_dist.blob import synced_memory
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.layers import create_layer
from tests.gpu.test_activation_gpu import compare_layer, gaussian, positive
from tests.gpu.test_shape_gpu import bottoms_of, device_work
from tests.layers.gradient_checker import layer_param


@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis,coeff", [(0, 1.0), (1, -0.5), (2, 2.0), (-1, 1.0)])
def test_reduction(gpu, op, axis, coeff):
    shape = (3, 4, 5, 6)
    top = shape[:axis % 4]
    text = 'type: "Reduction" reduction_param { operation: %s axis: %d coeff: %g }' % (op, axis, coeff)
    x = gaussian(*shape)
    x[0, 0, 0, :2] = 0      # sign(0) = 0 (ASUM)
    compare_layer(gpu, text, [x], [gaussian(*top, seed=2)])


@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis", [0, 1])
def test_reduction_of_long_slices_takes_several_passes(gpu, op, axis):
    # 150000 (axis 0) or 75000 values per slice: three passes of partial sums. Positive values, so that the only
    # difference from numpy's pairwise sum is the rounding of a sum that does not cancel.
    shape = (2, 300, 250)
    text = 'type: "Reduction" reduction_param { operation: %s axis: %d }' % (op, axis)
    compare_layer(gpu, text, [positive(*shape)], [gaussian(*shape[:axis], seed=2)])


def test_reduction_leaves_its_top_on_the_device(gpu):
    bottom, tops = bottoms_of([gaussian(4, 1000)]), [Blob()]
    layer = create_layer(layer_param('type: "Reduction" reduction_param { operation: SUMSQ axis: 1 }'))
    layer.setup(bottom, tops)
    bottom[0].gpu_data
    with device_work(gpu) as work:
        layer.forward_gpu(bottom, tops)
    assert "download" not in work and tops[0].data_memory.head == synced_memory.DEVICE
    np.testing.assert_allclose(tops[0].data, (bottom[0].data.astype(np.float64) ** 2).sum(1), rtol=1e-5)
