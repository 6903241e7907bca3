"""backend/lrn.py: arrays of no elements are left alone (the Cython kernel starts each image's channel window at
channel 0: with 0 channels it wrote the first pixels' scale into memory outside its arrays)."""
import numpy as np
import pytest

from pycaffe_dist.backend import lrn


@pytest.mark.parametrize("shape", [(2, 0, 2, 2), (0, 3, 2, 2), (2, 3, 0, 2)])
def test_arrays_of_no_elements_touch_no_memory(shape):
    memory = np.full(64, 7.0, np.float32)
    x, scale, top, diff, out = (memory[i * 10:i * 10].reshape(shape) for i in range(1, 6))
    lrn.cross_channel_forward(x, scale, top, 5, 1e-4, 0.75, 1.0)
    lrn.cross_channel_backward(x, top, scale, top, diff, 5, 1e-4, 0.75)
    assert lrn.window_sum(x, 3).shape == shape
    assert (memory == 7.0).all(), np.flatnonzero(memory != 7.0)
