"""Per-layer timings (pycaffe_dist/net/timing.py): in GPU mode each layer is timed by events on the device's stream
(Caffe's Timer), not by the host's clock; the summary by layer type."""
import pytest
from google.protobuf import text_format

from pycaffe_dist import common
from pycaffe_dist.backend import select
from pycaffe_dist.backend.emulated import EmulatedDevice
from pycaffe_dist.net import timing
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2

NET = '''
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 } shape { dim: 2 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
'''


def build():
    return Net(text_format.Parse(NET, caffe_pb2.NetParameter()), phase=caffe_pb2.TRAIN)


@pytest.fixture
def emulated_gpu():
    dev = select.use(EmulatedDevice())
    common.set_mode_gpu()
    try:
        yield dev
    finally:
        common.set_mode_cpu()
        select.forget()


def test_gpu_mode_times_each_layer_with_device_events(emulated_gpu, monkeypatch):
    measured = []
    elapsed = emulated_gpu.elapsed_ms

    def counted(start, stop):
        measured.append((start, stop))
        return elapsed(start, stop)
    monkeypatch.setattr(emulated_gpu, "elapsed_ms", counted)
    net = build()
    result = timing.time_net(net, iterations=3)
    # a forward and a backward per step and iteration: each layer, but the Convolution and its ReLU, as one
    conv = net.layer_index("conv")
    assert timing.steps(net, gpu=True) == [(i, i) for i in range(conv)] + [(conv, conv + 1)] + \
        [(i, i) for i in range(conv + 2, len(net.layers))]
    assert len(measured) == 3 * 2 * (len(net.layers) - 1)
    assert all(stop >= start for start, stop in measured)
    assert all(f >= 0 and b >= 0 for _, _, f, b in result["layers"])


def test_cpu_mode_uses_the_wall_clock(monkeypatch):
    common.set_mode_cpu()
    monkeypatch.setattr(select, "current", lambda: pytest.fail("the CPU path asked for a device"))
    result = timing.time_net(build(), iterations=2)
    assert len(result["iteration_ms"]) == 2


def test_the_summary_by_layer_type():
    result = {"initial_loss": 0.0, "iteration_ms": [10.0], "data_wait_ms": None,
              "layers": [("a", "Convolution", 1.0, 2.0), ("b", "ReLU", 0.5, 0.5), ("c", "Convolution", 3.0, 1.0),
                         ("d", "Pooling", 0.0, 0.0)]}
    assert timing.by_type(result) == [("Convolution", 2, 4.0, 3.0), ("ReLU", 1, 0.5, 0.5), ("Pooling", 1, 0.0, 0.0)]
    text = timing.format_timings(result)
    assert "Average time per layer type (forward + backward):" in text
    line = next(l for l in text.splitlines() if l.strip().startswith("Convolution"))
    assert "2 layers" in line and "(87.5%)" in line


FUSED_NET = NET.replace('''layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }''', '''layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }''')


def test_gpu_mode_times_fused_layers_as_one(emulated_gpu):
    """BatchNorm + Scale + ReLU run as one on the GPU in training: timed so, on the BatchNorm's line."""
    net = Net(text_format.Parse(FUSED_NET, caffe_pb2.NetParameter()), phase=caffe_pb2.TRAIN)
    bn = net.layer_index("bn")
    assert timing.steps(net, gpu=True)[bn] == (bn, bn)      # nothing ran fused yet
    net.forward_backward()
    assert timing.steps(net, gpu=True)[bn] == (bn, bn + 2)
    assert timing.steps(net, gpu=False)[bn] == (bn, bn)
    result = timing.time_net(net, iterations=2)
    assert result["fused"] == 2
    assert net.fusions[bn].forward_fused == 3
    times = {name: (f, b) for name, _, f, b in result["layers"]}
    assert times["scale"] == times["relu"] == (0.0, 0.0) and times["bn"][0] > 0
    assert "2 layers ran fused into the layer before them" in timing.format_timings(result)


def test_gpu_mode_times_layers_apart_where_they_did_not_run_fused(emulated_gpu):
    """A Scale over another axis than the channels is not fused: each layer keeps its own line."""
    text = FUSED_NET.replace("scale_param { bias_term: true }", "scale_param { axis: 0 num_axes: 1 bias_term: true }")
    net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), phase=caffe_pb2.TRAIN)
    result = timing.time_net(net, iterations=1)
    assert result["fused"] == 0 and "fused" not in timing.format_timings(result)
    assert {name: f for name, _, f, _ in result["layers"]}["scale"] > 0
