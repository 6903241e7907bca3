"""Per-channel sums on the device (pycaffe_dist/layers/channel_sums.py, csrc/cuda/channel.cu) against numpy's, for
partitions of every kind (parts within an image, parts that carry into the next image, parts that step several
images at once, one element per channel), and what BatchNorm and Scale no longer do on the GPU: transfers to the
host, and scratch tensors as large as the bottom."""
import numpy as np
import pytest

from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.layers import channel_sums, create_layer
from pycaffe_dist.proto import caffe_pb2
from tests.gpu.test_norm_gpu import gaussian
from tests.layers.gradient_checker import layer_param

# (outer, channels, inner), and the parts' settings to use (None: the module's)
PARTITIONS = [
    ((2, 3, 20), None),             # parts = 1: a whole channel in one thread
    ((40, 2, 7), None),             # 8 parts of 7-element images: a carry at every step
    ((64, 2, 9), None),             # 18 parts: two images a step
    ((5, 2, 1000), None),           # 156 parts within each image
    ((300, 4, 1), None),            # one element per image
    ((3, 5, 11), (7, 1, 32)),       # 7 parts of 11: steps that carry and do not carry
    ((6, 3, 4), (64, 1, 32)),       # 22 parts of 24 elements: two threads see two, the rest one
    ((1, 1, 1), (64, 1, 32)),
    ((6, 3, 4), (64, 1, 3)),        # folds: 22 parts -> 8 -> 3, then the last kernel
    ((7, 2, 9), (1 << 18, 1, 2)),   # 63 parts -> 32 -> 16 -> 8 -> 4 -> 2: the fold buffers take turns
]


def holder():
    """A layer to keep the sums' scratch buffers."""
    layer = create_layer(layer_param('type: "Scale"'))
    layer.setup([Blob((1, 1))], [Blob()])
    return layer


def with_parts(monkeypatch, setting):
    if setting is not None:
        target, minimum, width = setting
        monkeypatch.setattr(channel_sums, "TARGET_THREADS", target)
        monkeypatch.setattr(channel_sums, "MIN_PER_PART", minimum)
        monkeypatch.setattr(channel_sums, "MERGE_WIDTH", width)


def on_device(dev, host):
    return dev.to_device(np.ascontiguousarray(host, np.float32))


@pytest.mark.parametrize("dims,setting", PARTITIONS)
def test_sums_and_products_per_channel(gpu, monkeypatch, dims, setting):
    with_parts(monkeypatch, setting)
    a, b = gaussian(dims, seed=3), gaussian(dims, seed=4)
    out_a, out_ab = on_device(gpu, np.zeros(dims[1])), on_device(gpu, np.zeros(dims[1]))
    channel_sums.sums(holder(), on_device(gpu, a), on_device(gpu, b), dims, out_a, out_ab)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(gpu.to_host(out_a), a64.sum(axis=(0, 2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gpu.to_host(out_ab), (a64 * b64).sum(axis=(0, 2)), rtol=1e-5, atol=1e-5)


def test_betas_accumulate_assign_and_ignore_what_is_there(gpu):
    """beta 1 adds to the output; beta 0 assigns without reading it (a NaN there is not kept)."""
    dims = (4, 3, 5)
    a = gaussian(dims, seed=3)
    out_a = on_device(gpu, np.float32([1, 2, 3]))
    out_ab = on_device(gpu, np.float32([np.nan] * 3))
    channel_sums.sums(holder(), on_device(gpu, a), on_device(gpu, a), dims, out_a, out_ab, beta_a=1.0)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(gpu.to_host(out_a), a64.sum(axis=(0, 2)) + [1, 2, 3], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gpu.to_host(out_ab), (a64 * a64).sum(axis=(0, 2)), rtol=1e-5)


@pytest.mark.parametrize("dims,setting", PARTITIONS)
@pytest.mark.parametrize("shift", [0.0, 1e4])
def test_batch_statistics_per_channel(gpu, monkeypatch, dims, setting, shift):
    """Mean and biased variance from the parts' Welford moments; a mean 10^4 times the spread costs no accuracy
    (sums of squares would lose all of it in float32)."""
    with_parts(monkeypatch, setting)
    x = gaussian(dims, seed=8, shift=shift)
    c = dims[1]
    x_on_device = on_device(gpu, x)
    moments, parts = channel_sums.moments(holder(), x_on_device, dims)
    m = dims[0] * dims[2]
    mean, std = on_device(gpu, np.zeros(c)), on_device(gpu, np.zeros(c))
    sums = [on_device(gpu, np.zeros(c)), on_device(gpu, np.zeros(c)), on_device(gpu, np.zeros(1))]
    gpu.launch("batch_norm_statistics", c, x_on_device, dims[2], *moments, m, parts, 0.0, 1.0, 0.0, mean, std, *sums)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(gpu.to_host(mean), x64.mean(axis=(0, 2)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu.to_host(std) ** 2, x64.var(axis=(0, 2)), rtol=1e-5, atol=1e-6)


class Transfers:
    """Counts the device's copies to the host (each waits for the GPU) while installed."""

    def __init__(self, dev, monkeypatch):
        self.count = 0
        download = dev.download

        def counted(*args, **kwargs):
            self.count += 1
            return download(*args, **kwargs)
        monkeypatch.setattr(dev, "download", counted)


def batchnorm_and_scale(phase, shape):
    """Caffe's ResNet pattern: BatchNorm, then Scale with a bias, both in place."""
    bn = create_layer(layer_param('type: "BatchNorm"'), phase)
    scale = create_layer(layer_param('type: "Scale" scale_param { bias_term: true }'), phase)
    blob = Blob(shape)
    bn.setup([blob], [blob])
    scale.setup([blob], [blob])
    return bn, scale, blob


@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
def test_batchnorm_and_scale_wait_for_nothing_and_keep_one_tensor_each(gpu, monkeypatch, phase):
    """Training passes of BatchNorm + Scale (in place) copy nothing to the host, as the statistics' weight stays on
    the device; each layer keeps one scratch tensor of the bottom's size (BatchNorm's x_norm in TRAIN, Scale's
    saved input), not the square and product tensors of Caffe's GEMV sums."""
    shape = (8, 4, 6, 6)
    bn, scale, blob = batchnorm_and_scale(phase, shape)
    blob.data[...] = gaussian(shape)
    for layer in (bn, scale):
        for param in layer.blobs:
            param.gpu_data      # on the device first, as a solver's update leaves them
    transfers = Transfers(gpu, monkeypatch)
    for _ in range(2):
        for layer in (bn, scale):
            layer.reshape([blob], [blob])
            layer.forward_gpu([blob], [blob])
        blob.gpu_diff
        for layer in (scale, bn):
            layer.backward_gpu([blob], [True], [blob])
    assert transfers.count == 0
    for layer, kept in ((bn, {"x_norm"} if phase == caffe_pb2.TRAIN else set()), (scale, {"saved"})):
        large = {name for (name, on_device), (_, array) in layer._buffers.items()
                 if on_device and array.size >= blob.count}
        assert large == kept, layer.type


def test_batchnorm_with_folded_parts(gpu, monkeypatch):
    """The layer's statistics and gradient sums through the folds (forced here on a small tensor)."""
    from tests.gpu.test_norm_gpu import assert_same, run_both
    with_parts(monkeypatch, (1 << 18, 1, 3))
    cpu, dev = run_both('type: "BatchNorm"', [gaussian((10, 3, 4, 2), scale=3.0, shift=1.0)], passes=2)
    assert_same(cpu, dev)
