"""The counter-based random streams on the device (csrc/cuda/random.cu, pycaffe_dist/random_stream.py): the
kernels' uint32 and float32 numbers are numpy's Philox bit generator's, bit for bit (keys and counters that use
every bit, the counter's carry); the layers that draw (Dropout, stochastic pooling) draw on the device the numbers
their CPU code draws, forward after forward, and upload nothing to do it."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.layers import create_layer
from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.pycaffe import Net
from pycaffe_dist.random_stream import RandomStream, blocks_for, seeded_key
from tests.layers.gradient_checker import layer_param

TRAIN = caffe_pb2.TRAIN
U64 = (1 << 64) - 1


def kernel_arguments(key, counter, count):
    """The leading arguments of random.cu's kernels for numpy's Philox(key=key, counter=counter) (counter < 2^64)."""
    halves = [(word >> shift) & 0xFFFFFFFF for word in (key & U64, key >> 64, counter) for shift in (0, 32)]
    return (blocks_for(count), count) + tuple(h - (1 << 32) if h >= (1 << 31) else h for h in halves)


KEYS = [0, 1, (1 << 128) - 1, seeded_key(1701, "drop6"), 0x0123456789ABCDEF_FEDCBA9876543210]
COUNTERS = [0, 5, (1 << 32) + 7, U64 - 2]        # U64 - 2: the third block's counter carries into word 1
COUNTS = [1, 7, 8, 9, 1000, 5304]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("counter", COUNTERS)
def test_uint32_stream_is_numpys_philox(gpu, key, counter):
    for count in COUNTS:
        out = gpu.empty(count, np.uint32)
        gpu.launch("philox_uint32", *kernel_arguments(key, counter, count), out)
        words = np.random.Philox(key=key, counter=counter).random_raw(-(-count // 2)).astype(np.uint64)
        want = words.view(np.uint32)[:count]       # little endian: each word's low half, then its high half
        np.testing.assert_array_equal(gpu.to_host(out), want, err_msg="key %#x counter %d count %d"
                                      % (key, counter, count))


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("counter", COUNTERS)
def test_float32_uniforms_are_numpys(gpu, key, counter):
    for count in COUNTS:
        out = gpu.empty(count)
        gpu.launch("philox_uniform", *kernel_arguments(key, counter, count), out)
        want = np.random.Generator(np.random.Philox(key=key, counter=counter)).random(count, dtype=np.float32)
        np.testing.assert_array_equal(gpu.to_host(out), want)


def test_a_stream_draws_the_same_on_the_device_as_on_the_host(gpu):
    common.set_random_seed(3)
    on_host, on_device = RandomStream("pool1"), RandomStream("pool1")
    for count in (9, 1, 4096, 15, 8):
        want = on_host.uniform(np.empty(count, np.float32))
        out = gpu.empty(count + 3)
        got = gpu.to_host(on_device.uniform_gpu(gpu, out, count))[:count]
        np.testing.assert_array_equal(got, want)
    assert on_device.counter == on_host.counter == blocks_for(9) + 1 + 512 + 2 + 1


# --- Dropout --------------------------------------------------------------------------------------------------

def _dropout(text, shape):
    layer = create_layer(layer_param(text), TRAIN)
    bottom, top = Blob(shape), Blob()
    layer.setup([bottom], [top])
    layer.reshape([bottom], [top])
    return layer, bottom, top


def _forward_backward(layer, bottom, top, x, dy, on_gpu):
    bottom.data[...] = x
    if on_gpu:
        layer.forward_gpu([bottom], [top])
    else:
        layer.forward([bottom], [top])
    y = top.data.copy()
    top.diff[...] = dy
    if on_gpu:
        layer.backward_gpu([top], [True], [bottom])
    else:
        layer.backward([top], [True], [bottom])
    return y, bottom.diff.copy()


@pytest.mark.parametrize("ratio", [0.5, 0.3])
def test_dropout_masks_equal_the_cpus_forward_after_forward(gpu, ratio):
    text = 'name: "drop6" type: "Dropout" dropout_param { dropout_ratio: %g }' % ratio
    shape = (3, 8, 17, 13)
    rng = np.random.default_rng(2)
    inputs = [(rng.standard_normal(shape).astype(np.float32) + 10, rng.standard_normal(shape).astype(np.float32))
              for _ in range(3)]
    runs = {}
    for on_gpu in (False, True):
        common.set_random_seed(1701)
        layer, bottom, top = _dropout(text, shape)
        runs[on_gpu] = [_forward_backward(layer, bottom, top, x, dy, on_gpu) for x, dy in inputs]
    scale = np.float32(1 / (1 - np.float32(ratio)))
    masks = []
    for (y_cpu, dx_cpu), (y_gpu, dx_gpu), (x, dy) in zip(runs[False], runs[True], inputs):
        np.testing.assert_array_equal(y_gpu, y_cpu)
        np.testing.assert_array_equal(dx_gpu, dx_cpu)
        kept = y_gpu != 0
        np.testing.assert_array_equal(y_gpu[kept], x[kept] * scale)
        np.testing.assert_array_equal(dx_gpu, np.where(kept, dy * scale, 0))     # the backward's mask is the forward's
        masks.append(kept)
    assert (masks[0] != masks[1]).any() and (masks[1] != masks[2]).any()        # the counter moves on


def test_dropout_in_place_draws_the_same_mask(gpu):
    shape, got = (4, 1001), []
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32) + 10
    for in_place in (False, True):
        layer = create_layer(layer_param('type: "Dropout"'), TRAIN)
        bottom = Blob(shape)
        top = bottom if in_place else Blob()
        layer.setup([bottom], [top])
        bottom.data[...] = x
        common.set_random_seed(11)
        layer.reshape([bottom], [top])
        layer.forward_gpu([bottom], [top])
        got.append(top.data.copy())
    np.testing.assert_array_equal(got[1], got[0])


def test_dropout_masks_differ_by_seed_and_by_layer(gpu):
    shape = (2, 4000)
    masks = {}
    for seed, name in [(5, "drop6"), (5, "drop7"), (6, "drop6")]:
        layer, bottom, top = _dropout('name: "%s" type: "Dropout"' % name, shape)
        bottom.data[...] = 1.0
        common.set_random_seed(seed)
        layer.forward_gpu([bottom], [top])
        masks[seed, name] = top.data != 0
    assert (masks[5, "drop6"] != masks[5, "drop7"]).mean() > 0.4
    assert (masks[5, "drop6"] != masks[6, "drop6"]).mean() > 0.4


@pytest.mark.parametrize("ratio", [0.5, 0.2, 0.9])
def test_dropout_train_keeps_one_minus_ratio(gpu, ratio):
    shape = (8, 100000)
    layer, bottom, top = _dropout('type: "Dropout" dropout_param { dropout_ratio: %g }' % ratio, shape)
    bottom.data[...] = 1.0
    common.set_random_seed(4)
    for _ in range(2):
        layer.forward_gpu([bottom], [top])
        kept = (top.data != 0).mean()
        assert abs(kept - (1 - ratio)) < 4 * np.sqrt(ratio * (1 - ratio) / top.count)


NET = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 4 dim: 3 dim: 50 } } }
layer { name: "drop_a" type: "Dropout" bottom: "data" top: "a" }
layer { name: "drop_b" type: "Dropout" bottom: "data" top: "b" }
"""


def test_a_net_with_two_dropout_layers_draws_two_masks(gpu, tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    tops = {}
    for mode in ("cpu", "gpu"):
        getattr(common, "set_mode_" + mode)()
        net = Net(str(path), phase=TRAIN)
        net.blobs["data"].data[...] = 1.0
        common.set_random_seed(8)
        net.forward()
        net.forward()       # the second forward: each layer's counter moved on
        tops[mode] = {name: net.blobs[name].data.copy() for name in ("a", "b")}
    common.set_mode_gpu()
    np.testing.assert_array_equal(tops["gpu"]["a"], tops["cpu"]["a"])
    np.testing.assert_array_equal(tops["gpu"]["b"], tops["cpu"]["b"])
    assert ((tops["gpu"]["a"] != 0) != (tops["gpu"]["b"] != 0)).mean() > 0.4


# --- nothing crosses from the host ------------------------------------------------------------------------------

def _refuse_uploads(monkeypatch, dev):
    def upload(*args, **kwargs):
        raise AssertionError("a host-to-device upload in a random layer's GPU pass")
    monkeypatch.setattr(dev, "upload", upload)


@pytest.mark.parametrize("text, shape", [
    ('type: "Dropout" dropout_param { dropout_ratio: 0.4 }', (3, 8, 17, 13)),
    ('type: "Pooling" pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }', (2, 3, 9, 11)),
    ('type: "SPP" spp_param { pool: STOCHASTIC pyramid_height: 2 }', (2, 3, 8, 8)),
])
def test_the_gpu_passes_upload_nothing(gpu, monkeypatch, text, shape):
    layer = create_layer(layer_param(text), TRAIN)
    bottom, top = Blob(shape), Blob()
    layer.setup([bottom], [top])
    layer.reshape([bottom], [top])
    bottom.data[...] = np.random.default_rng(1).uniform(0.1, 1.0, shape)
    common.set_random_seed(2)
    layer.forward_gpu([bottom], [top])              # the first pass allocates the layer's device buffers
    top.diff[...] = 1.0
    top.gpu_diff                                    # the inputs on the device before uploads are refused
    bottom.gpu_data
    _refuse_uploads(monkeypatch, gpu)
    for _ in range(2):
        layer.forward_gpu([bottom], [top])
        layer.backward_gpu([top], [True], [bottom])
    monkeypatch.undo()
    assert np.isfinite(bottom.diff).all() and (top.data != 0).any()
