"""LRN (both regions), MVN and BatchNorm on the GPU path against their CPU code (pycaffe_dist/layers/norm.py,
csrc/cuda/lrn.cu, csrc/cuda/norm.cu): forward outputs, bottom diffs and the statistics blobs, on random inputs.

`run_both` (also used by test_loss_gpu.py) builds the layer twice from the same prototxt on the same inputs and
runs it once through forward/backward (CPU) and once through forward_gpu/backward_gpu (the device of the `gpu`
fixture). The emulated device runs the same float32 operations in the same order as the CPU code except where a
GEMV sums (BatchNorm, MVN), hence rtol 1e-5 / atol 1e-6 rather than equality (see `tolerance` for a real GPU).
"""
import numpy as np
import pytest

from pycaffe_dist.backend import select
from pycaffe_dist.backend.emulated import EmulatedDevice
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob import synced_memory
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.gradient_checker import layer_param

ON_DEVICE = (synced_memory.DEVICE, synced_memory.SYNCED)


def tolerance():
    """(rtol, atol): float32 rounding on the emulated device, whose only differences from the CPU code are the
    GEMV sums; looser on a real GPU, whose expf/powf/logf differ from libm's by an ulp or two, whose cuBLAS sums in
    another order and where nvcc contracts multiply-adds to FMA (BatchNorm's and MVN's backward subtract nearly
    equal terms, which magnifies those differences)."""
    return (1e-5, 1e-6) if isinstance(select.current(), EmulatedDevice) else (1e-4, 1e-5)


def gaussian(shape, seed=1701, scale=1.0, shift=0.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale + shift).astype(np.float32)


class Run:
    """One path's layer and blobs after forward (and backward)."""

    def __init__(self, layer, bottom, top):
        self.layer, self.bottom, self.top = layer, bottom, top


def run_both(text, inputs, phase=caffe_pb2.TRAIN, num_tops=1, in_place=False, top_diffs=None, loss_weight=None,
             propagate_down=None, params=None, passes=1, backward=True):
    """Run the layer of `text` on `inputs` (float32 arrays) on the CPU and on the GPU path; returns (cpu, gpu) Runs.

    top_diffs: the top diffs to back-propagate (default: random; loss layers keep their loss weight, or
    loss_weight). params: arrays for the layer's blobs. passes: forward (and backward) this many times (BatchNorm's
    moving averages). Bottom diffs start from the same random values on both paths, so whatever a backward leaves
    untouched is compared too."""
    runs = []
    for gpu in (False, True):
        bottom = []
        for i, x in enumerate(inputs):
            blob = Blob(np.shape(x))
            blob.data[...] = x
            blob.diff[...] = gaussian(np.shape(x), seed=99 + i)
            bottom.append(blob)
        top = bottom[:1] if in_place else [Blob() for _ in range(num_tops)]
        layer = create_layer(layer_param(text), phase)
        layer.setup(bottom, top)
        for blob, value in zip(layer.blobs, params or []):
            blob.data[...] = value
        down = propagate_down or [True] + [False] * (len(bottom) - 1)
        for step in range(passes):
            if in_place:   # the same input each pass: the previous pass overwrote it
                bottom[0].data[...] = inputs[0]
            layer.reshape(bottom, top)
            (layer.forward_gpu if gpu else layer.forward)(bottom, top)
            if gpu:
                # The device read the input; it wrote the top there too, except the scalars that loss layers and
                # Accuracy write on the host (Caffe's top[0]->mutable_cpu_data()[0] = ...).
                assert bottom[0].data_memory.head in ON_DEVICE, "the forward did not read its input on the device"
                if not (layer.is_loss or layer.type == "Accuracy"):
                    assert top[0].data_memory.head == synced_memory.DEVICE, "the forward did not run on the device"
            if not backward:
                continue
            if layer.is_loss:
                if loss_weight is not None:
                    top[0].diff[...] = loss_weight
            else:
                for i, blob in enumerate(top):
                    blob.diff[...] = (top_diffs[i] if top_diffs else gaussian(blob.shape, seed=7 + i + step))
            (layer.backward_gpu if gpu else layer.backward)(top, down, bottom)
            if gpu and down[0]:
                assert bottom[0].diff_memory.head == synced_memory.DEVICE, "the backward did not run on the device"
        runs.append(Run(layer, bottom, top))
    return runs


def assert_same(cpu, gpu, diffs=True):
    """Tops, bottom diffs and layer blobs of the two runs agree."""
    rtol, atol = tolerance()
    for i, (a, b) in enumerate(zip(cpu.top, gpu.top)):
        np.testing.assert_allclose(b.data, a.data, rtol=rtol, atol=atol, err_msg="top %d" % i)
    if diffs:
        for i, (a, b) in enumerate(zip(cpu.bottom, gpu.bottom)):
            np.testing.assert_allclose(b.diff, a.diff, rtol=rtol, atol=atol, err_msg="bottom diff %d" % i)
    for i, (a, b) in enumerate(zip(cpu.layer.blobs, gpu.layer.blobs)):
        np.testing.assert_allclose(b.data, a.data, rtol=rtol, atol=atol, err_msg="blob %d" % i)


# --- LRN ---------------------------------------------------------------------------------------------------------

LRN_SETTINGS = [
    # (local_size, alpha, beta, k, region)
    (5, 1.0, 0.75, 1.0, "ACROSS_CHANNELS"),
    (15, 1.0, 0.75, 1.0, "ACROSS_CHANNELS"),     # a window wider than the channels
    (5, 1e-4, 0.75, 1.0, "ACROSS_CHANNELS"),     # AlexNet's
    (3, 0.5, 0.5, 2.0, "ACROSS_CHANNELS"),
    (1, 2.0, 1.5, 1.0, "ACROSS_CHANNELS"),
    (3, 1.0, 0.75, 1.0, "WITHIN_CHANNEL"),
    (5, 2.0, 1.5, 3.0, "WITHIN_CHANNEL"),        # k is ignored within channels, as in Caffe
    (7, 0.5, 0.25, 1.0, "WITHIN_CHANNEL"),       # a window wider than the plane
    (1, 0.5, 0.25, 1.0, "WITHIN_CHANNEL"),
]


def lrn_text(size, alpha, beta, k, region):
    return ('type: "LRN" lrn_param { local_size: %d alpha: %g beta: %g k: %g norm_region: %s }'
            % (size, alpha, beta, k, region))


@pytest.mark.parametrize("setting", LRN_SETTINGS)
@pytest.mark.parametrize("shape", [(2, 7, 3, 4), (1, 16, 5, 6)])
def test_lrn(gpu, setting, shape):
    x = gaussian(shape, scale=30.0 if setting[1] < 1e-3 else 1.0)
    cpu, dev = run_both(lrn_text(*setting), [x])
    assert_same(cpu, dev)


def test_lrn_without_propagate_down_leaves_the_bottom_diff(gpu):
    cpu, dev = run_both(lrn_text(*LRN_SETTINGS[0]), [gaussian((2, 7, 3, 4))], propagate_down=[False])
    np.testing.assert_array_equal(dev.bottom[0].diff, gaussian((2, 7, 3, 4), seed=99))
    assert_same(cpu, dev)


def test_lrn_forward_twice_with_new_shape(gpu):
    """Scratch buffers follow a reshape (a second forward on a bigger batch)."""
    text = lrn_text(*LRN_SETTINGS[0])
    for shape in [(1, 7, 3, 4), (3, 7, 5, 4)]:
        cpu, dev = run_both(text, [gaussian(shape)])
        assert_same(cpu, dev)


# --- MVN -----------------------------------------------------------------------------------------------------------

MVN_SETTINGS = [
    "",
    "mvn_param { across_channels: true }",
    "mvn_param { normalize_variance: false }",
    "mvn_param { normalize_variance: false across_channels: true }",
    "mvn_param { eps: 0.01 }",
]


@pytest.mark.parametrize("setting", MVN_SETTINGS)
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 6)])
def test_mvn(gpu, setting, shape):
    cpu, dev = run_both('type: "MVN" ' + setting, [gaussian(shape, scale=2.0, shift=0.5)])
    assert_same(cpu, dev)


@pytest.mark.parametrize("setting", MVN_SETTINGS[:3])
def test_mvn_in_place(gpu, setting):
    cpu, dev = run_both('type: "MVN" ' + setting, [gaussian((2, 3, 4, 5))], in_place=True)
    assert_same(cpu, dev)


# --- BatchNorm -------------------------------------------------------------------------------------------------------

def stats(channels, factor, seed=5):
    """Stored statistics: mean sums, variance sums (positive) and the moving-average factor."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(channels).astype(np.float32) * factor,
            (rng.random(channels).astype(np.float32) + 0.5) * factor, np.float32([factor])]


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3), (3, 2, 2, 3, 2), (40, 2, 7), (64, 2, 3, 3)])
@pytest.mark.parametrize("fraction", [0.999, 0.9, 0.0])
def test_batchnorm_train(gpu, shape, fraction):
    """Batch statistics, the gradient through them, and the moving averages over three passes."""
    text = 'type: "BatchNorm" batch_norm_param { moving_average_fraction: %g }' % fraction
    cpu, dev = run_both(text, [gaussian(shape, scale=3.0, shift=1.0)], passes=3)
    assert_same(cpu, dev)
    assert dev.layer.blobs[2].data[0] == cpu.layer.blobs[2].data[0] != 0


@pytest.mark.parametrize("factor", [2.5, 1.0, 0.0])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3)])
def test_batchnorm_global_stats(gpu, factor, shape):
    """The stored statistics divided by the factor (a zero factor gives zero statistics), in TEST."""
    channels = shape[1]
    cpu, dev = run_both('type: "BatchNorm" batch_norm_param { eps: 1e-3 }', [gaussian(shape)],
                        phase=caffe_pb2.TEST, params=stats(channels, factor))
    assert_same(cpu, dev)


def test_batchnorm_use_global_stats_in_train_and_batch_stats_in_test(gpu):
    shape = (2, 3, 4, 5)
    cpu, dev = run_both('type: "BatchNorm" batch_norm_param { use_global_stats: true }', [gaussian(shape)],
                        params=stats(3, 4.0))
    assert_same(cpu, dev)
    cpu, dev = run_both('type: "BatchNorm" batch_norm_param { use_global_stats: false }', [gaussian(shape)],
                        phase=caffe_pb2.TEST, passes=2)
    assert_same(cpu, dev)


@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
def test_batchnorm_in_place(gpu, phase):
    """In place, the TRAIN backward reads its own copy of the normalized output (Caffe's x_norm_)."""
    cpu, dev = run_both('type: "BatchNorm"', [gaussian((2, 3, 4, 5), shift=2.0)], phase=phase, in_place=True,
                        params=stats(3, 1.0), passes=2)
    assert_same(cpu, dev)


def test_batchnorm_without_propagate_down(gpu):
    cpu, dev = run_both('type: "BatchNorm"', [gaussian((2, 3, 4, 5))], propagate_down=[False])
    assert_same(cpu, dev)
    np.testing.assert_array_equal(dev.bottom[0].diff, gaussian((2, 3, 4, 5), seed=99))
