"""Softmax, SoftmaxWithLoss, EuclideanLoss, SigmoidCrossEntropyLoss, Accuracy and ContrastiveLoss on the GPU path
against their CPU code (pycaffe_dist/layers/softmax.py and loss.py, csrc/cuda/softmax.cu and loss.cu): outputs (the
loss scalar, the probabilities, the accuracies), bottom diffs under loss weights, ignore_label and every
normalization, and the CPU path's error for a label out of range. The harness is test_norm_gpu.run_both
(test_activation_gpu.compare_layer for ContrastiveLoss, whose bottoms are not all of one shape). Last, the net's
reading of its losses at the end of a GPU pass: no wait for the device before the pass is queued, the CPU's loss,
normalizer and label error."""
import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.layers import create_layer
from pycaffe_dist.layers.loss import SEQUENTIAL_LOSS_MAX_POSITIONS
from pycaffe_dist.blob.blob import Blob
from tests.gpu.test_activation_gpu import compare_layer
from tests.gpu.test_norm_gpu import assert_same, gaussian, run_both
from tests.layers.gradient_checker import layer_param


def labels(shape, num_labels, ignore=None, fraction=0.3, seed=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, num_labels, shape).astype(np.float32)
    if ignore is not None:
        y[rng.random(shape) < fraction] = ignore
    return y


# --- Softmax ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, axis", [((2, 5, 3, 4), 1), ((2, 5, 3, 4), 2), ((2, 5, 3, 4), -1), ((6, 10), 1),
                                         ((4, 3, 2), 0), ((3, 1, 4), 1)])
def test_softmax(gpu, shape, axis):
    cpu, dev = run_both('type: "Softmax" softmax_param { axis: %d }' % axis, [gaussian(shape, scale=3.0)])
    assert_same(cpu, dev)


def test_softmax_in_place(gpu):
    cpu, dev = run_both('type: "Softmax"', [gaussian((2, 5, 3, 4), scale=3.0)], in_place=True)
    assert_same(cpu, dev)


def test_softmax_large_scores(gpu):
    """The max is subtracted before exp: scores of 1e3 do not overflow."""
    cpu, dev = run_both('type: "Softmax"', [gaussian((3, 7), scale=1e3)])
    assert_same(cpu, dev)
    assert np.isfinite(dev.top[0].data).all()


def softmax_input(shape, seed=5):
    """Scores with a NaN, infinities and a row of equal values among the Gaussian ones."""
    x = gaussian(shape, scale=30.0, seed=seed).reshape(shape[0], shape[1], -1)
    x[0, :, 0] = 2.5
    if shape[0] > 1:
        x[1, min(1, shape[1] - 1), 0] = np.nan
    if shape[0] > 2:
        x[2, 0, -1], x[2, -1, -1] = np.inf, -np.inf
    return x.reshape(shape)


@pytest.mark.parametrize("shape", [(6, 10), (4, 1), (3, 64, 5), (3, 65, 2), (5, 7, 3, 2), (2, 200)])
@pytest.mark.parametrize("in_place", [False, True])
def test_softmax_in_one_kernel_is_the_five_kernels_bits(gpu, shape, in_place):
    """gpu_softmax's one pass (a thread per position) against Caffe's five kernels, bit for bit, NaN and infinities
    included, also in place and over more channels than it takes by default."""
    from pycaffe_dist.layers.gpu_helpers import gpu_softmax
    x = softmax_input(shape)
    outer, channels, inner = shape[0], shape[1], int(np.prod(shape[2:], dtype=int))
    results = []
    for one_pass in (True, False):
        src = gpu.to_device(x.reshape(-1))
        dst = src if in_place else gpu.to_device(np.full(x.size, 7.0, np.float32))
        gpu_softmax(src, dst, outer, channels, inner, gpu.to_device(np.zeros(outer * inner, np.float32)), one_pass)
        results.append(gpu.to_host(dst))
    np.testing.assert_array_equal(results[0].view(np.uint32), results[1].view(np.uint32))


@pytest.mark.parametrize("channels, launches", [(10, ["softmax_positions"]), (64, ["softmax_positions"]),
                                                (65, ["softmax_channel_max", "softmax_channel_subtract",
                                                      "softmax_exp", "softmax_channel_sum",
                                                      "softmax_channel_div"])])
def test_softmax_of_few_channels_is_one_launch(gpu, monkeypatch, channels, launches):
    calls = []
    launch = gpu.launch
    monkeypatch.setattr(gpu, "launch", lambda kernel, *args: calls.append(kernel) or launch(kernel, *args))
    cpu, dev = run_both('type: "Softmax"', [gaussian((4, channels), scale=3.0)], backward=False)
    assert_same(cpu, dev)
    assert calls == launches


# --- SoftmaxWithLoss -------------------------------------------------------------------------------------------------

NORMALIZATIONS = ["VALID", "BATCH_SIZE", "FULL", "NONE"]


def softmax_loss_text(normalization=None, ignore=None, axis=None, normalize=None):
    loss = []
    if normalization:
        loss.append("normalization: %s" % normalization)
    if normalize is not None:
        loss.append("normalize: %s" % ("true" if normalize else "false"))
    if ignore is not None:
        loss.append("ignore_label: %d" % ignore)
    text = 'type: "SoftmaxWithLoss" loss_param { %s }' % " ".join(loss)
    if axis is not None:
        text += " softmax_param { axis: %d }" % axis
    return text


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("ignore", [None, 2, -1])
def test_softmax_loss(gpu, normalization, ignore):
    x = gaussian((4, 5, 3, 2), scale=2.0)
    y = labels((4, 1, 3, 2), 5, ignore)
    cpu, dev = run_both(softmax_loss_text(normalization, ignore), [x, y], loss_weight=2.5)
    assert_same(cpu, dev)
    assert dev.top[0].data != 0


@pytest.mark.parametrize("positions, path", [(24, "softmax_loss_sequential"),
                                            (SEQUENTIAL_LOSS_MAX_POSITIONS, "softmax_loss_sequential"),
                                            (SEQUENTIAL_LOSS_MAX_POSITIONS + 44, "softmax_loss_forward")])
@pytest.mark.parametrize("normalization, ignore", [("VALID", 2), ("VALID", None), ("BATCH_SIZE", 0), ("NONE", None)])
def test_softmax_loss_summed_by_one_thread_or_in_parallel(gpu, monkeypatch, positions, path, normalization, ignore):
    """Up to SEQUENTIAL_LOSS_MAX_POSITIONS positions one thread sums the loss in one launch, in Caffe's CPU order:
    on the emulated device (the host's logf) the CPU's bits; more, the per-position kernel and the parallel sums."""
    assert positions % 4 == 0
    calls = []
    launch = gpu.launch
    monkeypatch.setattr(gpu, "launch", lambda kernel, *args: calls.append(kernel) or launch(kernel, *args))
    x = gaussian((positions // 4, 6, 4), scale=2.0)
    y = labels((positions // 4, 4), 6, ignore)
    cpu, dev = run_both(softmax_loss_text(normalization, ignore), [x, y], loss_weight=1.5)
    assert_same(cpu, dev)
    assert path in calls and ({"softmax_loss_sequential", "softmax_loss_forward"} - {path}).isdisjoint(calls)
    if path == "softmax_loss_sequential" and gpu.name.startswith("emulated"):
        assert dev.top[0].data.tobytes() == cpu.top[0].data.tobytes()


@pytest.mark.parametrize("positions", [12, 300])
def test_a_bad_label_is_the_cpu_error_on_both_paths(gpu, positions):
    y = labels((positions,), 3)
    y[positions - 5] = 3
    text = softmax_loss_text()
    assert forward_error(text, [gaussian((positions, 3)), y], True) == forward_error(text, [gaussian((positions, 3)), y],
                                                                                     False)


@pytest.mark.parametrize("normalize", [True, False])
def test_softmax_loss_deprecated_normalize(gpu, normalize):
    cpu, dev = run_both(softmax_loss_text(normalize=normalize, ignore=0), [gaussian((6, 4)), labels((6,), 4)])
    assert_same(cpu, dev)


def test_softmax_loss_other_axis_and_probability_top(gpu):
    """Softmax over axis 2 with labels (N, C, W), and the probabilities as a second top."""
    x = gaussian((2, 3, 4, 5))
    y = labels((2, 3, 5), 4, ignore=1)
    cpu, dev = run_both(softmax_loss_text("VALID", 1, axis=2), [x, y], num_tops=2)
    assert_same(cpu, dev)


def test_no_classes_is_the_cpu_error(gpu):
    """A score blob of 0 channels: every label is out of range (and no kernel may read a first channel)."""
    x, y = np.zeros((4, 0), np.float32), np.zeros(4, np.float32)
    assert forward_error(softmax_loss_text(), [x, y], True) == forward_error(softmax_loss_text(), [x, y], False)


@pytest.mark.parametrize("normalization, ignore", [("BATCH_SIZE", None), ("FULL", 2), ("VALID", None),
                                                   ("NONE", 4)])
@pytest.mark.parametrize("weight", [1.0, -0.3])
def test_softmax_loss_backward_in_one_launch_is_caffes_three_calls(gpu, monkeypatch, normalization, ignore, weight):
    """Where the normalizer is fixed, the backward is one kernel: Caffe's copy of the probabilities, its kernel and
    its scal (here cuBLAS's, or numpy's on the emulated device) give the same bits. A negative loss weight makes
    an ignored position's zeros -0 in both."""
    from pycaffe_dist.layers.loss import ignore_args
    calls = []
    launch = gpu.launch
    monkeypatch.setattr(gpu, "launch", lambda kernel, *args: calls.append(kernel) or launch(kernel, *args))
    shape, label_shape = (6, 5, 3), (6, 3)
    y = labels(label_shape, 5, ignore=ignore)
    cpu, dev = run_both(softmax_loss_text(normalization, ignore), [gaussian(shape, scale=2.0), y],
                        loss_weight=weight)
    assert_same(cpu, dev)
    assert [c for c in calls if "loss_backward" in c] == ["softmax_loss_backward_scaled"]
    # Caffe's three calls on the same probabilities
    layer = dev.layer
    positions, count = 18, int(np.prod(shape))
    prob = layer.buffer("prob", count, device=True)
    diff = gpu.to_device(np.zeros(count, np.float32))
    gpu.copy(diff, prob)
    flags = gpu.to_device(np.zeros(positions, np.float32))
    launch("softmax_loss_backward", positions, gpu.to_device(y.reshape(-1)), 5, 3, *ignore_args(ignore), diff, flags)
    fixed = {"BATCH_SIZE": 6, "FULL": 18, "VALID": 18, "NONE": 1}[normalization]
    gpu.scal(count, float(np.float32(weight) / np.float32(fixed)), diff)
    np.testing.assert_array_equal(gpu.to_host(diff).view(np.uint32),
                                  dev.bottom[0].diff.reshape(-1).view(np.uint32))


def test_softmax_loss_all_ignored(gpu):
    """No valid position: the normalizer is 1 (not 0), the loss and every diff are 0."""
    y = np.full((3, 1, 2, 2), 7, np.float32)
    cpu, dev = run_both(softmax_loss_text("VALID", 7), [gaussian((3, 4, 2, 2)), y])
    assert_same(cpu, dev)
    assert dev.top[0].data == 0 and not dev.bottom[0].diff.any()


def test_softmax_loss_tiny_probability(gpu):
    """A true class with probability 0 in float32 is clamped at FLT_MIN: the loss stays finite."""
    x = np.zeros((2, 3), np.float32)
    x[:, 0] = 200.0
    cpu, dev = run_both(softmax_loss_text(), [x, np.float32([1, 2])])
    assert_same(cpu, dev)
    assert np.isfinite(dev.top[0].data)


def test_softmax_loss_without_propagate_down(gpu):
    cpu, dev = run_both(softmax_loss_text(), [gaussian((4, 3)), labels((4,), 3)], propagate_down=[False, False])
    assert_same(cpu, dev)


def forward_error(text, inputs, gpu_path):
    bottom = []
    for x in inputs:
        blob = Blob(np.shape(x))
        blob.data[...] = x
        bottom.append(blob)
    top = [Blob()]
    layer = create_layer(layer_param(text))
    layer.setup(bottom, top)
    with pytest.raises(NetError) as info:
        if gpu_path:        # a GPU forward may leave its check until the net reads the loss
            layer.forward_gpu(bottom, top)
            layer.finish_forward_gpu()
        else:
            layer.forward(bottom, top)
    return str(info.value)


@pytest.mark.parametrize("text", [softmax_loss_text(ignore=-1), 'type: "Accuracy" accuracy_param { ignore_label: -1 }'])
@pytest.mark.parametrize("bad", [5.0, -2.0])
def test_label_out_of_range_is_the_cpu_error(gpu, text, bad):
    """A label outside [0, classes) reads nothing on the device and raises the CPU path's error."""
    y = np.float32([0, -1, bad, 1])
    inputs = [gaussian((4, 5)), y]
    assert forward_error(text, inputs, True) == forward_error(text, inputs, False)


# --- EuclideanLoss ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("down", [[True, True], [True, False], [False, True]])
@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 4, 2)])
def test_euclidean_loss(gpu, down, shape):
    a, b = gaussian(shape), gaussian(shape, seed=2)
    cpu, dev = run_both('type: "EuclideanLoss"', [a, b], propagate_down=down, loss_weight=0.75)
    assert_same(cpu, dev)


# --- SigmoidCrossEntropyLoss -----------------------------------------------------------------------------------------

def sigmoid_ce_text(normalization=None, ignore=None):
    loss = ([] if normalization is None else ["normalization: %s" % normalization]) + \
           ([] if ignore is None else ["ignore_label: %d" % ignore])
    return 'type: "SigmoidCrossEntropyLoss" loss_param { %s }' % " ".join(loss)


@pytest.mark.parametrize("normalization", [None] + NORMALIZATIONS)
@pytest.mark.parametrize("ignore", [None, -1])
def test_sigmoid_cross_entropy_loss(gpu, normalization, ignore):
    shape = (4, 3, 2)
    x = gaussian(shape, scale=4.0)
    t = np.random.default_rng(4).random(shape).astype(np.float32)
    if ignore is not None:
        t[np.random.default_rng(5).random(shape) < 0.3] = ignore
    cpu, dev = run_both(sigmoid_ce_text(normalization, ignore), [x, t], loss_weight=3.0)
    assert_same(cpu, dev)


def test_sigmoid_cross_entropy_targets_outside_zero_one(gpu):
    """Terms of either sign are summed with their signs, as the CPU path does (Caffe's asum would not)."""
    x = gaussian((6, 5), scale=3.0)
    t = np.random.default_rng(6).choice(np.float32([-2.0, 0.5, 3.0]), (6, 5)).astype(np.float32)
    cpu, dev = run_both(sigmoid_ce_text("FULL"), [x, t])
    assert_same(cpu, dev)


# --- Accuracy --------------------------------------------------------------------------------------------------------

def accuracy_text(top_k=1, ignore=None, axis=None):
    p = ["top_k: %d" % top_k] + ([] if ignore is None else ["ignore_label: %d" % ignore]) + \
        ([] if axis is None else ["axis: %d" % axis])
    return 'type: "Accuracy" accuracy_param { %s }' % " ".join(p)


@pytest.mark.parametrize("top_k", [1, 2, 5])
@pytest.mark.parametrize("ignore", [None, 3])
@pytest.mark.parametrize("num_tops", [1, 2])
def test_accuracy(gpu, top_k, ignore, num_tops):
    x = gaussian((20, 6))
    y = labels((20,), 6, ignore)
    cpu, dev = run_both(accuracy_text(top_k, ignore), [x, y], num_tops=num_tops, backward=False)
    assert_same(cpu, dev, diffs=False)
    assert 0 < dev.top[0].data <= 1


def test_accuracy_spatial_axis_ties_and_unseen_classes(gpu):
    """Scores (N, H, C, W) over axis 2; rounded scores give ties (they count against the true class); some
    classes have no position (their per-class accuracy is 0)."""
    x = np.round(gaussian((3, 2, 7, 4)))
    y = labels((3, 2, 4), 4, ignore=0)
    cpu, dev = run_both(accuracy_text(2, 0, axis=2), [x, y], num_tops=2, backward=False)
    assert_same(cpu, dev, diffs=False)
    assert not dev.top[1].data[4:].any()


def test_accuracy_all_ignored(gpu):
    cpu, dev = run_both(accuracy_text(1, 2), [gaussian((4, 3)), np.full(4, 2, np.float32)], num_tops=2,
                        backward=False)
    assert_same(cpu, dev, diffs=False)
    assert dev.top[0].data == 0 and not dev.top[1].data.any()


def test_infogain_loss_has_no_gpu_code(gpu):
    """InfogainLoss shares SoftmaxWithLoss's base but not its GPU code: the Net runs its CPU code."""
    from pycaffe_dist.layers.loss import InfogainLossLayer, SoftmaxWithLossLayer
    assert SoftmaxWithLossLayer.forward_gpu is not None
    assert InfogainLossLayer.forward_gpu is None and InfogainLossLayer.backward_gpu is None


# --- ContrastiveLoss ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("param", ["", "contrastive_loss_param { margin: 4 }",
                                   "contrastive_loss_param { margin: 9 legacy_version: true }",
                                   "contrastive_loss_param { margin: 1 legacy_version: true }"])
@pytest.mark.parametrize("loss_weight", [1.0, 2.5])
@pytest.mark.parametrize("down", [[True, True, False], [False, True, False]])
def test_contrastive_loss(gpu, param, loss_weight, down):
    num, channels = 12, 5
    similar = (np.arange(num) % 3 == 0).astype(np.float32).reshape(num, 1, 1, 1)
    a = gaussian((num, channels, 1, 1))
    b = gaussian((num, channels, 1, 1), seed=1)
    b[1] = a[1]     # a dissimilar pair at distance 0: Caffe's 1e-4 keeps its gradient finite
    # on_device "backward": the loss, a scalar, is written on the host (as Caffe's Forward_gpu does)
    compare_layer(gpu, 'type: "ContrastiveLoss" ' + param, [a, b, similar], [np.float32(loss_weight)],
                  propagate_down=down, bottom_diffs=[gaussian((num, channels, 1, 1), seed=5)] * 2 + [similar * 0],
                  on_device="backward")


# --- The net reads its losses at the end of a GPU pass (net.WeightedLosses) ----------------------------------------

def loss_net_text(batch=6, aux="", after_loss=""):
    """conv -> fc -> SoftmaxWithLoss, with GoogLeNet's auxiliary loss head in the middle where aux is its
    loss_weight; after_loss: a layer text run after the main loss."""
    head = '''
layer { name: "aux_fc" type: "InnerProduct" bottom: "conv" top: "aux_fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "aux_loss" type: "SoftmaxWithLoss" bottom: "aux_fc" bottom: "label" top: "aux_loss"
        loss_weight: %s }''' % aux if aux else ""
    return '''
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: %d dim: 2 dim: 5 dim: 5 } shape { dim: %d } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }%s
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
%s''' % (batch, batch, head, after_loss)


def loss_net(text, on_gpu, label_values=None):
    from google.protobuf import text_format
    from pycaffe_dist import common
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    (common.set_mode_gpu if on_gpu else common.set_mode_cpu)()
    common.set_random_seed(11)
    net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), phase=caffe_pb2.TRAIN)
    data, label = net.blob_by_name("data"), net.blob_by_name("label")
    data.data[...] = gaussian(data.shape)
    label.data[...] = labels(label.shape, 3) if label_values is None else label_values
    return net


def both_losses(text, method="forward_backward", label_values=None):
    from pycaffe_dist import common
    try:
        cpu = getattr(loss_net(text, False, label_values), method)()
    finally:
        common.set_mode_gpu()
    return cpu, getattr(loss_net(text, True, label_values), method)()


@pytest.mark.parametrize("aux", ["", "0.3"])
def test_a_gpu_pass_waits_for_the_device_only_once_everything_is_queued(gpu, aux):
    """Caffe's loss layers read their loss on the host as they run (asum), which makes the host wait for the GPU
    in mid-pass; here the first read comes after the backward's last call, and the loss is the CPU's."""
    calls = []
    waits = ("download", "asum", "dot", "synchronize")
    queued = ("_launch", "_sgemm", "_sgemm_batched", "_sgemv", "axpy", "scal", "copy", "memset")
    for name in waits + queued:
        method = getattr(gpu, name)

        def logged(*args, _name=name, _method=method, **kwargs):
            calls.append(_name)
            return _method(*args, **kwargs)
        setattr(gpu, name, logged)
    try:
        net = loss_net(loss_net_text(aux=aux), True)
        net.forward_backward()                  # the first pass makes the buffers (uploads)
        del calls[:]
        loss = net.forward_backward()
    finally:
        for name in waits + queued:
            delattr(gpu, name)
    first_wait = min(i for i, name in enumerate(calls) if name in waits)
    last_queued = max(i for i, name in enumerate(calls) if name in queued)
    assert first_wait > last_queued, calls
    cpu, _ = both_losses(loss_net_text(aux=aux))
    np.testing.assert_allclose(loss, cpu, rtol=1e-5)


@pytest.mark.parametrize("method", ["forward_backward", "forward_from_to"])
def test_a_bad_label_in_a_gpu_pass_is_the_cpu_error(gpu, method):
    text = loss_net_text(aux="0.3")
    bad = np.float32([0, 1, 2, 7, 1, 0])
    errors = []
    for on_gpu in (False, True):
        with pytest.raises(NetError) as info:
            getattr(loss_net(text, on_gpu, bad), method)()
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "label 7 at position 3" in errors[0]


def test_a_loss_top_a_later_layer_rewrites_is_read_before(gpu):
    """A layer in place on a loss top after its loss layer: the loss is the top as the loss layer left it (read at
    once, as Caffe's Layer::Forward), on the GPU too."""
    after = 'layer { name: "double" type: "Power" bottom: "loss" top: "loss" power_param { scale: 2 } }'
    cpu, dev = both_losses(loss_net_text(after_loss=after), "forward_from_to")
    np.testing.assert_allclose(dev, cpu, rtol=1e-5)
    plain_cpu, _ = both_losses(loss_net_text(), "forward_from_to")
    np.testing.assert_allclose(cpu, plain_cpu, rtol=1e-6)       # not the doubled top


@pytest.mark.parametrize("normalization", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_the_device_normalizer_with_ignored_labels(gpu, normalization):
    """SoftmaxWithLoss's normalizer on the device (VALID with an ignore_label: the valid count of the labels), in
    the loss and in the gradient, as the CPU's."""
    text = loss_net_text().replace(
        'bottom: "fc" bottom: "label" top: "loss" }',
        'bottom: "fc" bottom: "label" top: "loss" loss_param { ignore_label: 1 normalization: %s } }'
        % normalization)
    values = np.float32([0, 1, 2, 1, 1, 0])
    results = []
    for on_gpu in (False, True):
        net = loss_net(text, on_gpu, values)
        results.append((net.forward_backward(), net.blob_by_name("fc").diff.copy()))
    from pycaffe_dist import common
    common.set_mode_gpu()
    (cpu_loss, cpu_diff), (dev_loss, dev_diff) = results
    np.testing.assert_allclose(dev_loss, cpu_loss, rtol=1e-5)
    np.testing.assert_allclose(dev_diff, cpu_diff, rtol=1e-4, atol=1e-6)
