"""The neuron layers (pycaffe_dist/layers/activation.py) on the GPU code path (csrc/cuda/neuron.cu) against their
CPU code: tops, bottom diffs and parameter diffs for each layer and its settings, in place and not, Dropout's
mask in TRAIN and its pass-through in TEST, PReLU's slope gradient accumulating into the slope diff.

`compare_layer` (also used by test_shape_gpu.py and test_arithmetic_gpu.py) runs one layer twice on equal float32
inputs: forward/backward on the host, forward_gpu/backward_gpu on the device, and checks that the GPU outputs stayed
on the device."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.layers import activation, create_layer
from pycaffe_dist.blob import synced_memory
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.gradient_checker import layer_param

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def tolerance(dev):
    # Emulated: the same float operations as the CPU code (only libm's expf / tanhf / powf against numpy's float32
    # loops, and BLAS summation orders, differ by an ulp or so). A real GPU contracts multiply-adds into FMAs and
    # its expf / logf / tanhf / powf are within 2 ulp: a few ulp more, through divisions such as BNLL's log1p.
    return dict(rtol=1e-5, atol=1e-6) if dev.name.startswith("emulated") else dict(rtol=1e-4, atol=1e-5)


def gaussian(*shape, seed=0, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def positive(*shape, seed=0):
    return np.exp(0.5 * gaussian(*shape, seed=seed)).astype(np.float32)


def wide(scale):
    """Gaussian inputs of standard deviation `scale`."""
    def make(*shape, seed=0):
        return gaussian(*shape, seed=seed, scale=scale)
    return make


def _run(text, bottoms, top_diffs, on_gpu, phase, num_tops, in_place, propagate_down, params, param_diffs,
         bottom_diffs, seed, on_device):
    bottom = []
    for x in bottoms:
        blob = Blob(x.shape)
        blob.data[...] = x
        bottom.append(blob)
    top = [bottom[0]] if in_place else [Blob() for _ in range(num_tops)]
    layer = create_layer(layer_param(text), phase)
    layer.setup(bottom, top)
    for blob, value in zip(layer.blobs, params or []):
        blob.data[...] = value
    for blob, value in zip(layer.blobs, param_diffs or []):
        blob.diff[...] = value
    if not in_place:
        for blob, value in zip(bottom, bottom_diffs or []):
            blob.diff[...] = value
    if seed is not None:
        common.set_random_seed(seed)
    layer.reshape(bottom, top)
    if on_gpu:
        layer.forward_gpu(bottom, top)
        if on_device is True:
            assert all(t.data_memory.head == synced_memory.DEVICE for t in top), \
                "the GPU forward left its tops on the host"
    else:
        layer.forward(bottom, top)
    out = {"top %d" % i: t.data.copy() for i, t in enumerate(top)}
    if top_diffs is None:
        return out
    for t, d in zip(top, top_diffs):
        t.diff[...] = d
    down = propagate_down or [True] * len(bottom)
    if on_gpu:
        layer.backward_gpu(top, down, bottom)
        # in place, a layer may leave the diff as it is (the top diff is the bottom diff): read on the device
        current = (synced_memory.DEVICE, synced_memory.SYNCED) if in_place else (synced_memory.DEVICE,)
        if on_device:
            for b, d in zip(bottom, down):
                assert not d or b.diff_memory.head in current, "the GPU backward left a bottom diff on the host"
    else:
        layer.backward(top, down, bottom)
    out.update(("bottom diff %d" % i, b.diff.copy()) for i, b in enumerate(bottom))
    out.update(("param diff %d" % i, p.diff.copy()) for i, p in enumerate(layer.blobs))
    out.update(("param %d" % i, p.data.copy()) for i, p in enumerate(layer.blobs))
    return out


def compare_layer(dev, text, bottoms, top_diffs=None, *, phase=TRAIN, num_tops=1, in_place=False,
                  propagate_down=None, params=None, param_diffs=None, bottom_diffs=None, seed=None, on_device=True,
                  tol=None):
    """Run the layer of prototxt `text` on the CPU and on the GPU path (the `gpu` fixture's device) and compare
    every top, bottom diff, parameter and parameter diff. top_diffs None: forward only. param_diffs / bottom_diffs:
    values the diffs hold before the backward (parameter gradients accumulate; bottom diffs are overwritten or, where
    propagate_down is False, left alone). on_device: assert that the GPU results are device-current (True), only
    the bottom diffs ("backward": tops that share the bottom's memory), or nothing (False)."""
    common_args = (phase, num_tops, in_place, propagate_down, params, param_diffs, bottom_diffs, seed)
    want = _run(text, bottoms, top_diffs, False, *common_args, on_device)
    got = _run(text, bottoms, top_diffs, True, *common_args, on_device)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], err_msg="%s: %s" % (text, key), **(tol or tolerance(dev)))
    return got


SHAPE = (2, 3, 4, 5)
BIG = (3, 8, 17, 13)        # 5304 elements: several blocks of 512 threads on a real GPU

# (prototxt, input maker, in place)
NEURONS = [
    ('type: "ReLU"', gaussian, False),
    ('type: "ReLU"', gaussian, True),
    ('type: "ReLU" relu_param { negative_slope: 0.1 }', gaussian, True),
    ('type: "ReLU" relu_param { negative_slope: -0.2 }', gaussian, True),     # the backward needs x: a copy
    ('type: "ELU"', gaussian, False),
    ('type: "ELU" elu_param { alpha: 0.5 }', gaussian, True),
    ('type: "ELU" elu_param { alpha: -0.3 }', gaussian, True),
    ('type: "Sigmoid"', wide(4.0), False),
    ('type: "Sigmoid"', gaussian, True),
    ('type: "TanH"', gaussian, False),
    ('type: "TanH"', gaussian, True),
    ('type: "AbsVal"', gaussian, False),
    ('type: "BNLL"', wide(30.0), False),        # both branches, and past exp's range
    ('type: "BNLL"', gaussian, True),
    ('type: "Power"', gaussian, False),
    ('type: "Power" power_param { power: 2 scale: 0.5 shift: 1 }', gaussian, True),
    ('type: "Power" power_param { power: 3 scale: 2 }', gaussian, False),
    ('type: "Power" power_param { power: 0.5 shift: 2 }', positive, True),
    ('type: "Power" power_param { power: -1.5 scale: 0.7 }', positive, False),
    ('type: "Power" power_param { power: 1 scale: -2 shift: 0.5 }', gaussian, True),
    ('type: "Power" power_param { power: 0 shift: 3 }', gaussian, False),     # constant 1
    ('type: "Power" power_param { power: 2 scale: 0 shift: 3 }', gaussian, False),     # constant shift ^ power
    ('type: "Exp"', gaussian, False),
    ('type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1 }', gaussian, True),
    ('type: "Exp" exp_param { base: 10 scale: -0.3 }', gaussian, False),
    ('type: "Log"', positive, False),
    ('type: "Log" log_param { base: 10 scale: 2 shift: 3 }', positive, True),
    ('type: "Log" log_param { base: 2 scale: 0.5 }', positive, False),
    ('type: "Clip" clip_param { min: -0.5 max: 0.7 }', gaussian, False),
    ('type: "Clip" clip_param { min: -0.5 max: 0.7 }', gaussian, True),
    ('type: "Swish"', gaussian, False),
    ('type: "Swish" swish_param { beta: 1.5 }', gaussian, True),
]


@pytest.mark.parametrize("text,make,in_place", NEURONS)
@pytest.mark.parametrize("shape", [SHAPE, BIG], ids=["small", "big"])
def test_neuron_forward_backward(gpu, text, make, in_place, shape):
    x, dy = make(*shape, seed=1), gaussian(*shape, seed=2)
    compare_layer(gpu, text, [x], [dy], in_place=in_place, bottom_diffs=[gaussian(*shape, seed=3)])


@pytest.mark.parametrize("threshold", [0.0, 0.3, -1.0])
def test_threshold_forward(gpu, threshold):
    text = 'type: "Threshold" threshold_param { threshold: %g }' % threshold
    x = gaussian(*SHAPE, seed=1)
    x[0, 0, 0, :2] = np.float32(threshold)       # equal to the threshold: 0
    got = compare_layer(gpu, text, [x])
    assert set(np.unique(got["top 0"])) <= {0.0, 1.0}
    assert create_layer(layer_param(text)).backward_gpu is None     # no backward (Caffe: NOT_IMPLEMENTED)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("shape", [SHAPE, (4, 3), BIG], ids=["4d", "2d", "big"])
def test_prelu_forward_backward_and_slope_gradient(gpu, shared, in_place, shape):
    text = 'type: "PReLU" prelu_param { channel_shared: %s }' % ("true" if shared else "false")
    channels = shape[1]
    slopes = np.float32(0.3) if shared else gaussian(channels, seed=4, scale=0.5)
    x, dy = gaussian(*shape, seed=1), gaussian(*shape, seed=2)
    # the slope diff holds an earlier gradient: Caffe adds to it
    earlier = np.float32(0.5) if shared else gaussian(channels, seed=5)
    compare_layer(gpu, text, [x], [dy], in_place=in_place, params=[slopes], param_diffs=[earlier])


def test_prelu_slope_gradient_alone(gpu):
    # propagate_down false: the bottom diff keeps its values, the slope still learns
    x, dy, old = gaussian(*SHAPE, seed=1), gaussian(*SHAPE, seed=2), gaussian(*SHAPE, seed=3)
    got = compare_layer(gpu, 'type: "PReLU"', [x], [dy], propagate_down=[False], bottom_diffs=[old],
                        on_device=False)
    np.testing.assert_array_equal(got["bottom diff 0"], old)


@pytest.mark.parametrize("ratio", [0.5, 0.2])
@pytest.mark.parametrize("in_place", [False, True])
def test_dropout_train_drops_the_same_units(gpu, ratio, in_place):
    text = 'type: "Dropout" dropout_param { dropout_ratio: %g }' % ratio
    x, dy = gaussian(*BIG, seed=1), gaussian(*BIG, seed=2)
    got = compare_layer(gpu, text, [x], [dy], in_place=in_place, seed=7)
    kept = got["top 0"] != 0
    np.testing.assert_allclose(got["top 0"][kept], x[kept] / np.float32(1 - ratio), rtol=1e-6)
    # the backward uses the forward's mask
    np.testing.assert_array_equal(got["bottom diff 0"] != 0, kept)
    assert abs(kept.mean() - (1 - ratio)) < 0.05


@pytest.mark.parametrize("in_place", [False, True])
def test_dropout_test_phase_passes_through(gpu, in_place):
    # BVLC Caffe has no scale_train: in TEST the values and the diffs pass through unscaled
    x, dy = gaussian(*SHAPE, seed=1), gaussian(*SHAPE, seed=2)
    got = compare_layer(gpu, 'type: "Dropout" dropout_param { dropout_ratio: 0.3 }', [x], [dy], phase=TEST,
                        in_place=in_place, on_device=not in_place)
    np.testing.assert_array_equal(got["top 0"], x)
    np.testing.assert_array_equal(got["bottom diff 0"], dy)


def test_dropout_fresh_mask_every_forward(gpu):
    layer = create_layer(layer_param('type: "Dropout"'), TRAIN)
    bottom, top = Blob(SHAPE), Blob()
    bottom.data[...] = 1.0
    layer.setup([bottom], [top])
    layer.reshape([bottom], [top])
    layer.forward_gpu([bottom], [top])
    first = top.data.copy()
    layer.forward_gpu([bottom], [top])
    assert not np.array_equal(first, top.data)


def test_subclasses_inherit_gpu_code_only_with_the_cpu_code_it_mirrors():
    class Redefined(activation.ReLULayer):
        def compute(self, x, y):
            y[...] = x

    class RedefinedBoth(activation.ReLULayer):
        def compute(self, x, y):
            y[...] = x

        def compute_gpu(self, dev, x, y):
            dev.copy(y, x)

    class Plain(activation.ReLULayer):
        pass

    assert Redefined.forward_gpu is None and Redefined.backward_gpu is not None
    assert RedefinedBoth.forward_gpu is not None
    assert Plain.forward_gpu is activation.ReLULayer.forward_gpu is activation.CudnnActivation.forward_gpu
    assert activation.PReLULayer.backward_gpu is not activation.NeuronLayer.backward_gpu
