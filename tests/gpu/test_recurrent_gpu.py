"""LSTMUnit, LSTM and RNN (pycaffe_dist/layers/recurrent.py) on the GPU code path (csrc/cuda/recurrent.cu, and the
unrolled nets' layers' GPU code) against their CPU code: tops, bottom and parameter diffs with and without a static
input or exposed hidden states, the state carried over between forward passes, an unrolled net that reads nothing
back from the device, and an LSTM in a net."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.blob import synced_memory
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.layers import create_layer
from tests.gpu.test_activation_gpu import compare_layer, gaussian, tolerance
from tests.gpu.test_shape_gpu import bottoms_of, device_work
from tests.layers.gradient_checker import layer_param


# --- LSTMUnit ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("down", [[True, True, False], [True, False, False], [False, True, False]])
@pytest.mark.parametrize("num,hidden", [(3, 4), (5, 130)])
def test_lstm_unit(gpu, down, num, hidden):
    cont = (np.arange(num) % 2).astype(np.float32).reshape(1, num)
    compare_layer(gpu, 'type: "LSTMUnit"', [gaussian(1, num, hidden), gaussian(1, num, 4 * hidden, seed=1, scale=2),
                                             cont],
                  [gaussian(1, num, hidden, seed=2), gaussian(1, num, hidden, seed=3)], num_tops=2,
                  propagate_down=down, bottom_diffs=[gaussian(1, num, hidden, seed=7),
                                                     gaussian(1, num, 4 * hidden, seed=8), cont * 0])


# --- LSTM, RNN ---------------------------------------------------------------------------------------------------

T, N, K, H = 4, 3, 5, 6
CONT = np.array([[0, 0, 0], [1, 1, 0], [1, 1, 1], [0, 1, 1]], np.float32)     # a sequence restarts mid-batch


def recurrent_case(type_name, static=False, expose_hidden=False):
    """(prototxt, bottoms, top diffs, params, propagate_down) of an LSTM or RNN layer."""
    text = ('type: "%s" recurrent_param { num_output: %d expose_hidden: %s weight_filler { type: "gaussian" '
            'std: 0.3 } bias_filler { type: "constant" value: 0.1 } }' % (type_name, H, str(expose_hidden).lower()))
    bottoms = [gaussian(T, N, K), CONT]
    down = [True, False]
    if static:
        bottoms.append(gaussian(N, 2, 2, seed=1))
        down.append(True)
    states = (2 if type_name == "LSTM" else 1) if expose_hidden else 0
    bottoms += [gaussian(1, N, H, seed=10 + i) for i in range(states)]
    down += [False] * states
    top_diffs = [gaussian(T, N, H, seed=2)] + [gaussian(1, N, H, seed=20 + i) for i in range(states)]
    layer = create_layer(layer_param(text))
    layer.setup(bottoms_of(bottoms), [Blob() for _ in top_diffs])
    params = [gaussian(*blob.shape, seed=30 + i, scale=0.4) for i, blob in enumerate(layer.blobs)]
    return text, bottoms, top_diffs, params, down


@pytest.mark.parametrize("type_name", ["LSTM", "RNN"])
@pytest.mark.parametrize("static,expose_hidden", [(False, False), (True, False), (False, True)])
def test_recurrent(gpu, type_name, static, expose_hidden):
    text, bottoms, top_diffs, params, down = recurrent_case(type_name, static, expose_hidden)
    compare_layer(gpu, text, bottoms, top_diffs, num_tops=len(top_diffs), params=params, propagate_down=down,
                  param_diffs=[gaussian(*p.shape, seed=40 + i) for i, p in enumerate(params)])


def _two_passes(type_name, bottoms, params, on_gpu):
    """Forward twice (the state carries over: no expose_hidden), backward once; the outputs of each."""
    text = ('type: "%s" recurrent_param { num_output: %d weight_filler { type: "gaussian" } }' % (type_name, H))
    layer = create_layer(layer_param(text))
    bottom, tops = bottoms_of(bottoms), [Blob()]
    layer.setup(bottom, tops)
    for blob, value in zip(layer.blobs, params):
        blob.data[...] = value
    run = (layer.forward_gpu, layer.backward_gpu) if on_gpu else (layer.forward, layer.backward)
    outs = []
    for _ in range(2):
        layer.reshape(bottom, tops)
        run[0](bottom, tops)
        outs.append(tops[0].data.copy())
    tops[0].diff[...] = gaussian(T, N, H, seed=2)
    run[1](tops, [True, False], bottom)
    return outs + [bottom[0].diff.copy()] + [p.diff.copy() for p in layer.blobs]


@pytest.mark.parametrize("type_name", ["LSTM", "RNN"])
def test_recurrent_state_carries_over_on_the_device(gpu, type_name):
    cont = np.ones((T, N), np.float32)     # no restart: the second pass starts from the first one's last state
    bottoms = [gaussian(T, N, K), cont]
    _, _, _, params, _ = recurrent_case(type_name)
    want = _two_passes(type_name, bottoms, params, on_gpu=False)
    got = _two_passes(type_name, bottoms, params, on_gpu=True)
    assert not np.allclose(want[0], want[1])        # the carried state changed the second pass
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, err_msg="output %d" % i, **tolerance(gpu))


@pytest.mark.parametrize("type_name", ["LSTM", "RNN"])
def test_the_unrolled_net_runs_on_the_device(gpu, type_name):
    text, bottoms, top_diffs, params, down = recurrent_case(type_name, static=True)
    layer = create_layer(layer_param(text))
    bottom, tops = bottoms_of(bottoms), [Blob()]
    layer.setup(bottom, tops)
    for blob, value in zip(layer.blobs, params):
        blob.data[...] = value
    layer.reshape(bottom, tops)
    for blob in bottom + layer.blobs:
        blob.gpu_data                                   # inputs and weights on the device beforehand
    layer.forward_gpu(bottom, tops)                    # a first pass allocates the inner blobs (and uploads the
    tops[0].diff[...] = top_diffs[0]                   # address tables of its Concat and Split layers)
    tops[0].gpu_diff
    layer.backward_gpu(tops, down, bottom)
    with device_work(gpu) as work:
        layer.forward_gpu(bottom, tops)
        layer.backward_gpu(tops, down, bottom)
    assert "download" not in work and "upload" not in work, work
    inner = layer.unrolled_net
    for name in inner.blob_names:
        memory = inner.blob_by_name(name).data_memory
        assert memory is None or memory.head in (synced_memory.DEVICE, synced_memory.SYNCED), name
    assert tops[0].data_memory.head == synced_memory.DEVICE
    assert bottom[0].diff_memory.head == synced_memory.DEVICE and bottom[2].diff_memory.head == synced_memory.DEVICE


def test_lstm_in_a_net_trains_on_the_device_as_on_the_cpu(gpu, tmp_path):
    from pycaffe_dist.pycaffe import Net
    path = tmp_path / "net.prototxt"
    path.write_text("""
        force_backward: true
        layer { name: "in" type: "Input" top: "x" top: "cont" top: "target"
                input_param { shape { dim: 4 dim: 3 dim: 5 } shape { dim: 4 dim: 3 } shape { dim: 4 dim: 3 dim: 6 } } }
        layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
                recurrent_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 } } }
        layer { name: "flat" type: "Flatten" bottom: "h" top: "hf" }
        layer { name: "tf" type: "Flatten" bottom: "target" top: "tf" }
        layer { name: "loss" type: "EuclideanLoss" bottom: "hf" bottom: "tf" top: "loss" }
    """)
    runs, weights = [], None
    for mode in ("cpu", "gpu"):
        (common.set_mode_gpu if mode == "gpu" else common.set_mode_cpu)()
        net = Net(str(path), phase=0)
        if weights is None:
            weights = [gaussian(*p.shape, seed=30 + i, scale=0.4) for i, p in enumerate(net.params["lstm"])]
        for p, w in zip(net.params["lstm"], weights):
            p.data[...] = w
        net.blobs["x"].data[...] = gaussian(4, 3, 5)
        net.blobs["cont"].data[...] = CONT
        net.blobs["target"].data[...] = gaussian(4, 3, 6, seed=1)
        net.forward()
        net.backward()
        runs.append((net.blobs["loss"].data.copy(), net.blobs["x"].diff.copy(),
                     [p.diff.copy() for p in net.params["lstm"]]))
    (cpu_loss, cpu_dx, cpu_dw), (gpu_loss, gpu_dx, gpu_dw) = runs
    tol = tolerance(gpu)
    np.testing.assert_allclose(gpu_loss, cpu_loss, **tol)
    np.testing.assert_allclose(gpu_dx, cpu_dx, **tol)
    for g, c in zip(gpu_dw, cpu_dw):
        np.testing.assert_allclose(g, c, **tol)
