"""Blobs with no elements through every layer, on the CPU and the GPU path: an empty batch (a Filter that keeps
nothing, a BatchReindex of no indices) or an empty axis.

Both paths must do the same thing, and it must be what Caffe's arithmetic does: tops of no elements, a loss of 0
where Caffe's normalizer is at least 1 (SoftmaxWithLoss, SigmoidCrossEntropyLoss, InfogainLoss), NaN where it
divides by the batch size (EuclideanLoss, ContrastiveLoss: 0 / 0 in float). Where Caffe divides an int count by 0
and stops with SIGFPE (HingeLoss, MultinomialLogisticLoss, ArgMax without an axis, MVN, BatchNorm), both paths run:
empty tops, NaN for the two losses, and a BatchNorm that keeps its statistics (docs/differences.md). A
configuration Caffe refuses gets the same NetError on both paths; any other exception is a bug."""
import json

import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text, read_text
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2
from tests.layers.golden_cases import LAYER_CASES, layer_case_names

SEED = 1234
# 0 / 0 and x / 0 in float are the values wanted here (NaN, inf), which numpy warns of
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def tolerance(dev, net=False):
    """A layer of empty blobs leaves only fillers' values and sums over the non-empty axes (bias-only outputs, bias
    gradients); a net of several layers also sums its batches' gradients, in other orders on the two paths (as
    tests/gpu/test_gpu_fusion_gpu.py)."""
    emulated = dev.name.startswith("emulated")
    if net:
        return dict(rtol=1e-4, atol=1e-5) if emulated else dict(rtol=1e-3, atol=1e-4)
    return dict(rtol=1e-5, atol=1e-6) if emulated else dict(rtol=1e-4, atol=1e-5)


def outcome(param, phase, on_gpu, runs=1, feed=None):
    """Build `param` on one path, forward and backward `runs` times (feed(net, run) first, where given): every
    blob's data and diff and every parameter's data and diff afterwards, or the NetError's message."""
    (common.set_mode_gpu if on_gpu else common.set_mode_cpu)()
    try:
        common.set_random_seed(SEED)
        try:
            net = Net(param, phase=phase)
            for run in range(runs):
                if feed:
                    feed(net, run)
                net.forward_from_to()
                net.backward_from_to()
        except NetError as exc:
            return str(exc)
        got = {}
        for name, blob in zip(net.blob_names, net.blob_list):
            got["data " + name], got["diff " + name] = blob.data.copy(), blob.diff.copy()
        for i, blob in enumerate(net.param_blobs):
            got["param %d" % i], got["param diff %d" % i] = blob.data.copy(), blob.diff.copy()
        return got
    finally:
        common.set_mode_gpu()


def assert_same(cpu, gpu_result, dev, what, net=False):
    if isinstance(cpu, str) or isinstance(gpu_result, str):
        assert gpu_result == cpu, what
        return
    assert gpu_result.keys() == cpu.keys(), what
    for key in cpu:
        assert gpu_result[key].shape == cpu[key].shape, "%s: %s" % (what, key)
        np.testing.assert_allclose(gpu_result[key], cpu[key], equal_nan=True, err_msg="%s: %s" % (what, key),
                                   **tolerance(dev, net))


def _case_axes():
    """(case, axis) for each golden layer case and each axis its inputs have."""
    out = []
    for name in layer_case_names():
        net = read_text(LAYER_CASES / name / "net.prototxt", caffe_pb2.NetParameter())
        axes = max(len(s.dim) for l in net.layer if l.type == "Input" for s in l.input_param.shape)
        out += [(name, axis) for axis in range(axes)]
    return out


@pytest.mark.parametrize("name,axis", _case_axes())
def test_a_golden_layer_case_with_an_empty_axis(gpu, monkeypatch, name, axis):
    """Each golden case's layer (Caffe's configurations of every type) with axis `axis` of every input set to 0."""
    case = LAYER_CASES / name
    monkeypatch.chdir(case)       # files the case names (InfogainLoss's H) are relative to it
    meta = json.loads((case / "case.json").read_text())
    param = read_text(case / "net.prototxt", caffe_pb2.NetParameter())
    for layer in param.layer:
        if layer.type == "Input":
            for shape in layer.input_param.shape:
                if len(shape.dim) > axis:
                    shape.dim[axis] = 0
    phase = caffe_pb2.TRAIN if meta["phase"] == "TRAIN" else caffe_pb2.TEST
    assert_same(outcome(param, phase, False), outcome(param, phase, True), gpu, "%s, axis %d" % (name, axis))


# (loss layer, bottom shapes with an empty batch, the loss Caffe's arithmetic gives)
EMPTY_LOSSES = [
    ('type: "SoftmaxWithLoss"', [(0, 5), (0,)], 0.0),
    ('type: "SoftmaxWithLoss" loss_param { normalization: FULL }', [(0, 5, 2), (0, 2)], 0.0),
    ('type: "SoftmaxWithLoss" loss_param { normalization: BATCH_SIZE ignore_label: 1 }', [(0, 5), (0,)], 0.0),
    ('type: "SoftmaxWithLoss" loss_param { normalization: NONE }', [(0, 5), (0,)], 0.0),
    ('type: "SigmoidCrossEntropyLoss"', [(0, 5), (0, 5)], 0.0),
    ('type: "InfogainLoss"', [(0, 5), (0,), (1, 1, 5, 5)], 0.0),
    ('type: "EuclideanLoss"', [(0, 5), (0, 5)], np.nan),
    ('type: "ContrastiveLoss"', [(0, 5, 1, 1), (0, 5, 1, 1), (0, 1, 1, 1)], np.nan),
    ('type: "HingeLoss"', [(0, 5), (0,)], np.nan),
    ('type: "MultinomialLogisticLoss"', [(0, 5), (0, 1, 1, 1)], np.nan),
]


@pytest.mark.parametrize("text,shapes,loss", EMPTY_LOSSES)
def test_a_loss_of_an_empty_batch(gpu, text, shapes, loss):
    names = ["b%d" % i for i in range(len(shapes))]
    param = parse_text('force_backward: true layer { name: "in" type: "Input" %s input_param { %s } } '
                       'layer { name: "loss" %s %s top: "loss" }'
                       % (" ".join('top: "%s"' % n for n in names),
                          " ".join("shape { %s }" % " ".join("dim: %d" % d for d in s) for s in shapes),
                          text, " ".join('bottom: "%s"' % n for n in names)), caffe_pb2.NetParameter())
    for on_gpu in (False, True):
        got = outcome(param, caffe_pb2.TRAIN, on_gpu)
        np.testing.assert_array_equal(got["data loss"], np.float32(loss), err_msg="%s, %s" % (text, on_gpu))


# A Filter before a ResNet-like block: Convolution, BatchNorm + Scale + ReLU, Convolution + ReLU, Eltwise SUM + ReLU
# (the three runs the GPU fuses, net/gpu_fusion.py), then LRN, MVN, Pooling, Dropout, InnerProduct and the loss.
FILTERED_NET = '''
layer { name: "in" type: "Input" top: "data" top: "label" top: "keep"
        input_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 } shape { dim: 4 } } }
layer { name: "filter" type: "Filter" bottom: "data" bottom: "label" bottom: "keep" top: "kept" top: "kept_label" }
layer { name: "conv1" type: "Convolution" bottom: "kept" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.1 }
                            bias_filler { type: "constant" value: 0.2 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "sum" type: "Eltwise" bottom: "conv1" bottom: "conv2" top: "sum" }
layer { name: "relu3" type: "ReLU" bottom: "sum" top: "sum" }
layer { name: "lrn" type: "LRN" bottom: "sum" top: "lrn" }
layer { name: "mvn" type: "MVN" bottom: "lrn" top: "mvn" }
layer { name: "pool" type: "Pooling" bottom: "mvn" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "drop" type: "Dropout" bottom: "pool" top: "pool" }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "kept_label" top: "loss" }
'''
KEEP = [[1, 0, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0]]     # the second batch keeps nothing


def feed_filtered(statistics_before_the_empty_batch):
    """feed(net, run) for outcome(): batch `run` of random images and labels, KEEP[run] as the Filter's selector;
    the BatchNorm's statistics as the empty batch finds them are put in the list given."""
    def feed(net, run):
        rng = np.random.default_rng(run)
        net.blob_by_name("data").data[...] = rng.random((4, 3, 8, 8))
        net.blob_by_name("label").data[...] = rng.integers(0, 5, 4)
        net.blob_by_name("keep").data[...] = KEEP[run]
        if run == 1:
            statistics_before_the_empty_batch[:] = [b.data.copy()
                                                    for b in net.layers[net.layer_index("bn1")].blobs]
    return feed


def test_a_filter_that_keeps_nothing(gpu):
    """Three batches, the second emptied by the Filter: the same on both paths; after the empty batch the loss is
    0 and the BatchNorm's statistics are as the first batch left them."""
    param = parse_text(FILTERED_NET, caffe_pb2.NetParameter())
    results = []
    for on_gpu in (False, True):
        before = []
        results.append(outcome(param, caffe_pb2.TRAIN, on_gpu, runs=2, feed=feed_filtered(before)))
        assert len(before) == 3
        for i, statistic in enumerate(before):
            np.testing.assert_array_equal(results[-1]["param %d" % (2 + i)], statistic)    # conv1's 2, then bn1's
        assert results[-1]["data kept"].shape == (0, 3, 8, 8)
        assert float(results[-1]["data loss"]) == 0.0
    assert_same(*results, gpu, "two batches", net=True)
    assert_same(outcome(param, caffe_pb2.TRAIN, False, runs=3, feed=feed_filtered([])),
                outcome(param, caffe_pb2.TRAIN, True, runs=3, feed=feed_filtered([])), gpu, "three batches", net=True)
