"""The learnable params' device diffs in one array (pycaffe_dist/net/gradient_arena.py): a GPU iteration clears
them with one memset; the diffs keep their content when they move into the arena, and a param whose memory
changed (reshaped) gets a new arena."""
import numpy as np
import pytest

from pycaffe_dist.blob.synced_memory import SyncedMemory
from pycaffe_dist.errors import DeviceError
from pycaffe_dist.net.gradient_arena import ALIGN, GradientArena
from tests.gpu.test_loss_gpu import loss_net, loss_net_text


def counting_memsets(dev):
    calls = []
    memset = dev.memset

    def counted(array, byte):
        calls.append(array.size)
        return memset(array, byte)
    dev.memset = counted
    return calls


def test_one_memset_clears_every_diff(gpu):
    net = loss_net(loss_net_text(aux="0.3"), True)
    net.forward_backward()
    assert len(net.learnable_params) == 6
    net.clear_param_diffs()                      # makes the arena
    net.forward_backward()
    assert all(np.abs(b.diff).sum() > 0 for b in net.learnable_params)
    net.learnable_params[0].diff[...] = 3.0      # a diff last written on the host
    calls = counting_memsets(gpu)
    try:
        net.clear_param_diffs()
    finally:
        del gpu.memset
    assert len(calls) == 1 and calls[0] >= sum(b.count for b in net.learnable_params)
    for blob in net.learnable_params:
        np.testing.assert_array_equal(blob.diff, 0)


def test_diffs_keep_their_content_in_the_arena(gpu):
    net = loss_net(loss_net_text(), True)
    values = []
    for i, blob in enumerate(net.learnable_params):
        blob.diff[...] = np.arange(blob.count, dtype=np.float32).reshape(blob.shape) + i
        blob.mutable_gpu_diff                    # the device copy current: it must move, not be lost
        values.append(blob.diff.copy())
    arena = GradientArena(net.learnable_params)
    for blob, value in zip(net.learnable_params, values):
        np.testing.assert_array_equal(blob.diff, value)
    offsets = [memory.device_array.ptr - arena.array.ptr for memory, _ in arena.slots]
    assert offsets == sorted(offsets) and all(o % (ALIGN * 4) == 0 for o in offsets)
    assert arena.holds(net.learnable_params)


def test_a_reshaped_param_gets_a_new_arena(gpu):
    net = loss_net(loss_net_text(), True)
    net.clear_param_diffs()
    fc = net.learnable_params[-2]
    shape = fc.shape
    fc.reshape(shape[0], shape[1] * 2)           # grown: new memories for the data and the diff
    fc.reshape(*shape)
    fc.data[...] = np.random.default_rng(1).standard_normal(shape)
    fc.diff[...] = 1.0
    net.clear_param_diffs()
    np.testing.assert_array_equal(fc.diff, 0)
    net.forward_backward()
    assert fc.diff.any() and net.learnable_params[0].diff.any()
    calls = counting_memsets(gpu)
    try:
        net.clear_param_diffs()                  # the new arena holds them all
    finally:
        del gpu.memset
    assert len(calls) == 1 and not fc.diff.any()


def test_a_memory_adopts_a_device_array_of_its_size(gpu):
    memory = SyncedMemory(5, np.float32)
    target = gpu.empty(8).at(2, 5)
    gpu.upload(target, np.full(5, 7, np.float32))
    memory.adopt_device(target)                  # nothing written yet: zeros, as a new one
    np.testing.assert_array_equal(memory.host(write=False), 0)
    with pytest.raises(DeviceError, match="cannot hold"):
        memory.adopt_device(gpu.empty(4))
