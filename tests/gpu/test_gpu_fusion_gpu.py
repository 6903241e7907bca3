"""Layer runs the GPU runs as one (pycaffe_dist/net/gpu_fusion.py), BatchNorm + in-place Scale (+ in-place ReLU),
Eltwise SUM + in-place ReLU and Convolution + in-place ReLU: the same outputs and gradients as the CPU path and as
the layers run apart on the GPU, for every phase and setting of the run; which runs are fused and which are not; a
range that ends between them sees each layer's own output; a backward layer by layer after a fused forward."""
import numpy as np
import pytest
from google.protobuf import text_format

from pycaffe_dist import common
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2

BATCH = 4


def net_text(bn="", scale="scale_param { bias_term: true }", scale_param_spec="", bn_on_data=False,
             scale_in_place=True, batch=BATCH, relu="", bn_in_place=True, fused=3):
    """Input -> Convolution -> BatchNorm -> Scale -> ReLU -> InnerProduct -> SoftmaxWithLoss, ResNet's pattern.
    fused: how many layers the settings let run as one (what the test expects; the text does not use it)."""
    source = "data" if bn_on_data else "conv"
    bn_top = source if bn_in_place else "normed"
    scale_top = bn_top if scale_in_place else "scaled"
    conv = "" if bn_on_data else '''
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 5 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }'''
    return '''
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: %d dim: 3 dim: 6 dim: 5 } shape { dim: %d } } }%s
layer { name: "bn" type: "BatchNorm" bottom: "%s" top: "%s" %s }
layer { name: "scale" type: "Scale" bottom: "%s" top: "%s" %s %s }
layer { name: "relu" type: "ReLU" bottom: "%s" top: "%s" %s }
layer { name: "fc" type: "InnerProduct" bottom: "%s" top: "fc"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
''' % (batch, batch, conv, source, bn_top, bn, bn_top, scale_top, scale_param_spec, scale, scale_top, scale_top,
       relu, scale_top)


def build(text, phase=caffe_pb2.TRAIN):
    common.set_random_seed(1701)
    return Net(text_format.Parse(text, caffe_pb2.NetParameter()), phase=phase)


def feed(net, seed=3):
    rng = np.random.default_rng(seed)
    data, label = net.blob_by_name("data"), net.blob_by_name("label")
    data.data[...] = rng.standard_normal(data.shape) * 2 + 0.5
    label.data[...] = rng.integers(0, 4, label.shape)


def scale_params(net, seed=5):
    """Non-trivial gamma and beta, and earlier gradients in their diffs (where the Scale accumulates or assigns)."""
    if "scale" not in net.layer_names:
        return
    rng = np.random.default_rng(seed)
    for blob in net.layers[net.layer_index("scale")].blobs:
        blob.data[...] = rng.standard_normal(blob.shape) + 1.0
        blob.diff[...] = rng.standard_normal(blob.shape)


def run(text, gpu_on, fused=True, phase=caffe_pb2.TRAIN, passes=2, clear=False, layer_by_layer=False):
    """forward_backward `passes` times on one path; returns the net. fused=False runs the pair apart."""
    if gpu_on:
        common.set_mode_gpu()
    else:
        common.set_mode_cpu()
    try:
        net = build(text, phase)
        if not fused:
            net.fusions = {}
        scale_params(net)
        for _ in range(passes):
            feed(net)
            if clear:
                net.clear_param_diffs()
            if layer_by_layer:      # a fused forward, then each layer's backward alone
                net.forward_from_to()
                for i in reversed(range(len(net.layers))):
                    net.backward_from_to(i, i)
            else:
                net.forward_backward()
        return net
    finally:
        common.set_mode_gpu()


def compare(a, b, tol):
    for blob_a, blob_b, name in zip(a.blob_list, b.blob_list, a.blob_names):
        np.testing.assert_allclose(blob_a.data, blob_b.data, err_msg="data " + name, **tol)
        np.testing.assert_allclose(blob_a.diff, blob_b.diff, err_msg="diff " + name, **tol)
    for i, (pa, pb) in enumerate(zip(a.param_blobs, b.param_blobs)):
        np.testing.assert_allclose(pa.data, pb.data, err_msg="param %d" % i, **tol)
        np.testing.assert_allclose(pa.diff, pb.diff, err_msg="param diff %d" % i, **tol)


def tolerance(dev):
    return dict(rtol=1e-4, atol=1e-5) if dev.name.startswith("emulated") else dict(rtol=1e-3, atol=1e-4)


SETTINGS = [
    dict(),
    dict(relu="relu_param { negative_slope: 0.1 }", fused=2),           # a leaky ReLU runs apart
    dict(scale=""),                                                     # no bias
    dict(bn="batch_norm_param { use_global_stats: true }"),             # frozen statistics, fine-tuning
    dict(bn="batch_norm_param { moving_average_fraction: 0.9 eps: 1e-3 }"),
    dict(scale_param_spec="param { lr_mult: 0 } param { lr_mult: 0 }"),  # a frozen Scale: no parameter gradients
    dict(bn_on_data=True, fused=0),                                     # no gradient below, the Scale's is kept
    dict(batch=1),                                                      # the Scale assigns its gradient (outer 1)
]


@pytest.mark.parametrize("setting", SETTINGS, ids=[str(i) for i in range(len(SETTINGS))])
def test_fused_layers_equal_the_cpu_and_the_layers_apart(gpu, setting):
    text = net_text(**setting)
    fused = run(text, True)
    runs = list(fused.fusions.values())
    assert [f.forward_fused for f in runs] == ([setting.get("fused", 3)] if setting.get("fused", 3) else [])
    compare(fused, run(text, False), tolerance(gpu))
    compare(fused, run(text, True, fused=False), tolerance(gpu))


@pytest.mark.parametrize("setting", [dict(), dict(relu="relu_param { negative_slope: 0.1 }")], ids=["3", "2"])
def test_a_backward_layer_by_layer_after_a_fused_forward(gpu, setting):
    """The Scale alone takes the BatchNorm's x_norm as its input (the fused forward kept no copy of its own)."""
    text = net_text(**setting)
    compare(run(text, True, layer_by_layer=True), run(text, False), tolerance(gpu))


def test_the_fused_forward_keeps_no_copy_for_the_scale(gpu):
    net = run(net_text(), True)
    scale, bn = net.layers[net.layer_index("scale")], net.layers[net.layer_index("bn")]
    # its input, should its backward run alone, is the BatchNorm's x_norm itself
    assert scale.buffer("saved", device=True).ptr == bn.buffer("x_norm", device=True).ptr


@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
def test_a_forward_only_run(gpu, phase):
    """A forward alone, in both phases (TEST: the stored statistics)."""
    text = net_text()
    common.set_mode_cpu()
    cpu = build(text, phase)
    scale_params(cpu)
    feed(cpu)
    cpu.forward_from_to()
    common.set_mode_gpu()
    dev = build(text, phase)
    scale_params(dev)
    feed(dev)
    dev.forward_from_to()
    for a, b, name in zip(dev.blob_list, cpu.blob_list, dev.blob_names):
        np.testing.assert_allclose(a.data, b.data, err_msg=name, **tolerance(gpu))
    assert dev.fusions[dev.layer_index("bn")].forward_fused == 3


def test_a_range_that_ends_at_the_batchnorm_sees_its_own_output(gpu):
    text = net_text()
    outputs = []
    for on_gpu in (False, True):
        (common.set_mode_gpu if on_gpu else common.set_mode_cpu)()
        net = build(text)
        scale_params(net)
        feed(net)
        net.forward_from_to(0, net.layer_index("bn"))
        outputs.append(net.blob_by_name("conv").data.copy())
        assert not any(f.forward_fused for f in net.fusions.values())
        if on_gpu:          # and a range that ends at the Scale fuses the pair without the ReLU
            net.forward_from_to(0, net.layer_index("scale"))
            assert net.fusions[net.layer_index("bn")].forward_fused == 2
    np.testing.assert_allclose(outputs[1], outputs[0], **tolerance(gpu))
    # normalised per channel: mean 0, variance 1 (the Scale did not run)
    np.testing.assert_allclose(outputs[1].mean(axis=(0, 2, 3)), 0, atol=1e-5)


def test_runs_that_are_not_fused(gpu):
    # the Scale writes another blob, or the BatchNorm does: their outputs stay visible
    assert build(net_text(scale_in_place=False)).fusions == {}
    assert build(net_text(bn_in_place=False)).fusions == {}
    # the net prints each layer's output
    net = build(net_text())
    net.debug_info = True
    feed(net)
    net.forward_backward()
    assert not net.fusions[net.layer_index("bn")].forward_fused
    # a Scale of another axis than the channels'
    net = build(net_text(scale="scale_param { axis: 0 num_axes: 1 }"))
    assert list(net.fusions) == [net.layer_index("bn")]
    feed(net)
    net.forward_backward()
    assert not net.fusions[net.layer_index("bn")].forward_fused
    # the CPU path
    common.set_mode_cpu()
    try:
        net = build(net_text())
        feed(net)
        net.forward_backward()
        assert not net.fusions[net.layer_index("bn")].forward_fused
    finally:
        common.set_mode_gpu()


SOLVER = '''
base_lr: 0.1 momentum: 0.9 weight_decay: 0.0005 lr_policy: "fixed" max_iter: 6 display: 0 random_seed: 1701
snapshot_after_train: false
net_param {
  layer { name: "data" type: "DummyData" top: "data" top: "label"
          dummy_data_param { shape { dim: 4 dim: 3 dim: 6 dim: 5 } shape { dim: 4 }
                             data_filler { type: "gaussian" std: 2 } data_filler { type: "constant" value: 1 } } }
  layer { name: "pre" type: "Convolution" bottom: "data" top: "pre"
          convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
  layer { name: "pre_relu" type: "ReLU" bottom: "pre" top: "pre" }
  layer { name: "conv" type: "Convolution" bottom: "pre" top: "conv"
          convolution_param { num_output: 5 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
  layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
  layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
  layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
  layer { name: "branch" type: "Convolution" bottom: "conv" top: "branch"
          convolution_param { num_output: 5 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
  layer { name: "sum" type: "Eltwise" bottom: "conv" bottom: "branch" top: "sum" }
  layer { name: "sum_relu" type: "ReLU" bottom: "sum" top: "sum" }
  layer { name: "fc" type: "InnerProduct" bottom: "sum" top: "fc"
          inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }
  layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
}
'''


def test_training_with_fused_layers_equals_the_cpu(gpu, tmp_path):
    """Six solver steps (momentum, weight decay, BatchNorm's moving averages and their weight on the device; a
    ResNet block's Eltwise + ReLU; a Convolution + ReLU; the loss read after the pass; the one-launch SGD update)
    give the CPU's weights and statistics."""
    from pycaffe_dist.solver.solver import Solver
    results = []
    for on_gpu in (False, True):
        (common.set_mode_gpu if on_gpu else common.set_mode_cpu)()
        param = text_format.Parse(SOLVER, caffe_pb2.SolverParameter())
        param.snapshot_prefix = str(tmp_path / "snap")
        solver = Solver(param)
        solver.step(6)
        if on_gpu:
            assert solver.net.fusions[solver.net.layer_index("bn")].forward_fused == 3
            assert solver.net.fusions[solver.net.layer_index("sum")].forward_fused == 2
            assert solver.net.fusions[solver.net.layer_index("pre")].forward_fused == 2
        net = solver.net
        results.append({"%s/%d" % (net.layer_names[layer], i): net.layers[layer].blobs[i].data.copy()
                        for layer, i in net.param_layer_index})
    common.set_mode_gpu()
    cpu, dev = results
    assert cpu.keys() == dev.keys() and "bn/2" in cpu
    for key in cpu:
        np.testing.assert_allclose(dev[key], cpu[key], err_msg=key, **tolerance(gpu))
    assert dev["bn/2"][0] == cpu["bn/2"][0]         # the statistics' weight: the same float32 on both paths


# --- Eltwise SUM + ReLU ---------------------------------------------------------------------------------------------

def eltwise_text(eltwise="", relu="", shortcut="conv0", bottoms=("a", "b"), relu_in_place=True, operation="SUM"):
    """Input -> two Convolutions (a, b) -> Eltwise -> ReLU -> InnerProduct -> SoftmaxWithLoss, the end of a ResNet
    block. shortcut: what bottom a is (conv0, or the data: no gradient below it)."""
    relu_top = "sum" if relu_in_place else "relu_out"
    shortcut_layer = "" if shortcut == "data" else \
        '''layer { name: "conv0" type: "Convolution" bottom: "data" top: "a"
                convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }'''
    a = "data" if shortcut == "data" else "a"
    names = {"a": a, "b": "b", "c": "c"}
    return '''
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: %d dim: 3 dim: 6 dim: 5 } shape { dim: %d } } }
%s
layer { name: "conv1" type: "Convolution" bottom: "data" top: "b"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "conv2" type: "Convolution" bottom: "data" top: "c"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "sum" type: "Eltwise" %s top: "sum" eltwise_param { operation: %s %s } }
layer { name: "relu" type: "ReLU" bottom: "sum" top: "%s" %s }
layer { name: "fc" type: "InnerProduct" bottom: "%s" top: "fc"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
''' % (BATCH, BATCH, shortcut_layer, " ".join('bottom: "%s"' % names[b] for b in bottoms), operation, eltwise,
       relu_top, relu, relu_top)


ELTWISE_SETTINGS = [
    dict(),
    dict(eltwise="coeff: 0.5 coeff: -2"),
    dict(relu="relu_param { negative_slope: 0.1 }"),
    dict(shortcut="data"),                          # one bottom needs no gradient
    dict(bottoms=("a", "b", "c"), fused=0),         # three bottoms run apart
    dict(operation="PROD", fused=0),
    dict(operation="MAX", fused=0),
    dict(relu_in_place=False, fused=0),             # the sum stays visible beside the ReLU's top
]


@pytest.mark.parametrize("setting", ELTWISE_SETTINGS, ids=[str(i) for i in range(len(ELTWISE_SETTINGS))])
def test_a_fused_eltwise_sum_and_relu_equal_the_cpu_and_the_layers_apart(gpu, setting):
    setting = dict(setting)
    expected = setting.pop("fused", 2)
    fused_and_compared(gpu, eltwise_text(**setting), expected)


def fused_and_compared(gpu, text, expected):
    """The net of `text` run fused (its one run fusing `expected` layers; 0: none) against the CPU and against the
    layers apart on the GPU; returns the fused and the apart net."""
    fused = run(text, True)
    assert [f.forward_fused for f in fused.fusions.values()] == ([expected] if expected else [])
    compare(fused, run(text, False), tolerance(gpu))
    apart = run(text, True, fused=False)
    compare(fused, apart, tolerance(gpu))
    return fused, apart


def test_the_fused_eltwise_leaves_the_relus_diff_in_the_blob(gpu):
    """Apart, the ReLU in place leaves its bottom diff (dy where the sum is positive) in the blob: so does the fused
    backward, and the bottoms' diffs are it times their coefficients."""
    net = run(eltwise_text(eltwise="coeff: 1 coeff: 3"), True)
    total = net.blob_by_name("sum")
    assert (total.diff[total.data <= 0] == 0).all() and (total.diff != 0).any()
    np.testing.assert_array_equal(net.blob_by_name("a").diff, total.diff)
    np.testing.assert_array_equal(net.blob_by_name("b").diff, np.float32(3) * total.diff)


def test_an_eltwise_backward_layer_by_layer_after_a_fused_forward(gpu):
    text = eltwise_text(eltwise="coeff: 0.5 coeff: 2")
    compare(run(text, True, layer_by_layer=True), run(text, False), tolerance(gpu))


def test_a_range_that_ends_at_the_eltwise_sees_the_sum(gpu):
    text = eltwise_text()
    common.set_mode_gpu()
    net = build(text)
    feed(net)
    net.forward_from_to(0, net.layer_index("sum"))
    fusion = net.fusions[net.layer_index("sum")]
    assert not fusion.forward_fused
    a, b = net.blob_by_name("a").data, net.blob_by_name("b").data
    np.testing.assert_allclose(net.blob_by_name("sum").data, a + b, rtol=1e-6)
    assert (net.blob_by_name("sum").data < 0).any()     # the ReLU did not run
    net.forward_from_to(0, net.layer_index("relu"))
    assert fusion.forward_fused == 2
    np.testing.assert_allclose(net.blob_by_name("sum").data, np.maximum(a + b, 0), rtol=1e-6)


# --- Convolution + ReLU ---------------------------------------------------------------------------------------------

def conv_relu_text(conv="", relu="", relu_in_place=True, two=False, lr=""):
    """Input -> Convolution (+ bias) -> ReLU -> InnerProduct -> SoftmaxWithLoss, AlexNet's and GoogLeNet's pattern.
    two: the Convolution has two bottoms and two tops."""
    relu_top = "conv" if relu_in_place else "relu_out"
    split = 'layer { name: "copy" type: "Split" bottom: "data" top: "data_a" top: "data_b" }' if two else ""
    conv_io = 'bottom: "data_a" bottom: "data_b" top: "conv" top: "conv_b"' if two else 'bottom: "data" top: "conv"'
    return '''
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: %d dim: 4 dim: 6 dim: 5 } shape { dim: %d } } }
%s
layer { name: "conv" type: "Convolution" %s %s
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.5 } %s } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "%s" %s }
layer { name: "fc" type: "InnerProduct" bottom: "%s" top: "fc"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
''' % (BATCH, BATCH, split, conv_io, lr, conv, relu_top, relu, relu_top)


CONV_RELU_SETTINGS = [
    dict(),
    dict(relu="relu_param { negative_slope: 0.1 }"),
    dict(conv="stride: 2 group: 2", relu="relu_param { engine: CAFFE }"),
    dict(lr="param { lr_mult: 0 } param { lr_mult: 0 }"),              # frozen: no parameter gradients
    dict(conv="bias_term: false", fused=0),                             # nothing to add: run apart
    dict(relu_in_place=False, fused=0),                                 # the convolution's top stays visible
    dict(two=True, fused=0),                                            # two bottoms and tops: run apart
]


@pytest.mark.parametrize("setting", CONV_RELU_SETTINGS, ids=[str(i) for i in range(len(CONV_RELU_SETTINGS))])
def test_a_fused_convolution_and_relu_equal_the_cpu_and_the_layers_apart(gpu, setting):
    setting = dict(setting)
    expected = setting.pop("fused", 2)
    fused, apart = fused_and_compared(gpu, conv_relu_text(**setting), expected)
    for a, b, name in zip(fused.blob_list, apart.blob_list, fused.blob_names):     # the same float operations
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)


def test_a_fused_convolution_and_relu_make_one_launch_for_the_bias_and_the_relu(gpu, monkeypatch):
    """(The ReLU's engine is CAFFE, so that apart it is a launch of ours on a GPU with cuDNN too.)"""
    calls = []
    launch = gpu.launch
    monkeypatch.setattr(gpu, "launch", lambda kernel, *args: calls.append(kernel) or launch(kernel, *args))
    net = build(conv_relu_text(relu="relu_param { engine: CAFFE }"))
    feed(net)
    net.forward_from_to()
    assert calls.count("bias_relu_forward") == 1 and "relu_forward" not in calls
    calls.clear()
    net.fusions = {}
    net.forward_from_to()
    assert "bias_relu_forward" not in calls and calls.count("relu_forward") == 1


def test_a_convolution_backward_layer_by_layer_after_a_fused_forward(gpu):
    text = conv_relu_text(relu="relu_param { negative_slope: 0.2 }")
    compare(run(text, True, layer_by_layer=True), run(text, False), tolerance(gpu))


def test_a_range_that_ends_at_the_convolution_sees_the_bias_without_the_relu(gpu):
    net = build(conv_relu_text())
    feed(net)
    net.forward_from_to(0, net.layer_index("conv"))
    fusion = net.fusions[net.layer_index("conv")]
    assert not fusion.forward_fused
    conv = net.blob_by_name("conv").data.copy()
    assert (conv < 0).any()                             # the ReLU did not run
    net.forward_from_to(0, net.layer_index("relu"))
    assert fusion.forward_fused == 2
    np.testing.assert_array_equal(net.blob_by_name("conv").data, np.maximum(conv, 0))
