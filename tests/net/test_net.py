"""The Net graph against Caffe: golden nets' blob and param shapes, splits, sharing, backward needs, errors."""
import json
import textwrap

import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.io.load import read_net
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, ZOO, load_npz

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def net_from_text(text, phase=TRAIN, **kw):
    return Net(parse_text(textwrap.dedent(text), caffe_pb2.NetParameter()), phase=phase, **kw)


def blob_shapes(net):
    return {n: net.blob_by_name(n).shape for n in net.blob_names}


@pytest.mark.parametrize("case", ["lenet", "cifar10_quick"])
def test_golden_net_shapes_and_weights(case):
    d = GOLDEN / "nets" / case
    net = Net(read_net(d / "net.prototxt"), phase=TRAIN)
    shapes = blob_shapes(net)
    for name, value in load_npz(d / "forward.npz").items():
        assert shapes[name] == value.shape, name
    params = load_npz(d / "params.npz")
    from pycaffe_dist.io.load import read_net_binary
    net.copy_trained_layers_from(read_net_binary(d / "weights.caffemodel"))
    for key, value in params.items():
        _, layer, index = key.split("/")
        blob = net.layers[net.layer_index(layer)].blobs[int(index)]
        np.testing.assert_array_equal(blob.data, value)
    test_net = Net(read_net(d / "net.prototxt"), phase=TEST)
    test_shapes = blob_shapes(test_net)
    for name, value in load_npz(d / "test_outputs.npz").items():
        assert test_shapes[name] == value.shape, name


def test_lenet_test_phase_inserts_caffe_named_splits():
    net = Net(read_net(GOLDEN / "nets" / "lenet" / "net.prototxt"), phase=TEST)
    # label feeds accuracy and loss; ip2 too: Caffe names the splits after blob, producer and top index.
    assert "label_mnist_1_split" in net.layer_names and "ip2_ip2_0_split" in net.layer_names
    split = net.layers[net.layer_index("label_mnist_1_split")]
    assert split.type == "Split" and list(split.param.top) == ["label_mnist_1_split_0", "label_mnist_1_split_1"]
    assert net.outputs == ["accuracy", "loss"]


@pytest.mark.parametrize("case", ["squeezenet_v1.1", "resnet50_kaiminghe"])
def test_zoo_forward_deploy_shapes(case):
    d = GOLDEN / "nets" / "zoo_forward" / case
    meta = json.loads((d / "case.json").read_text())
    net = Net(read_net(d / "net.prototxt"), phase=TEST)
    shapes = blob_shapes(net)
    for name, info in meta["outputs"]["blobs"].items():
        assert shapes[name] == tuple(info["shape"]), name
    for name, value in load_npz(d / "outputs.npz").items():
        assert shapes[name] == value.shape
    fingerprint = json.loads((d / "param_fingerprint.json").read_text())
    for key, info in fingerprint.items():
        layer, index = key.rsplit("/", 1)
        layer_obj = net.layers[net.layer_index(layer)]
        assert layer_obj.type == info["type"]
        assert layer_obj.blobs[int(index)].shape == tuple(info["shape"]), key
    assert sum(b.count for b in net.param_blobs) == meta["weights"]["param_count"]


def test_in_place_layers_share_the_blob():
    net = net_from_text("""
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "relu" type: "ReLU" bottom: "x" top: "x" }
        layer { name: "sig" type: "Sigmoid" bottom: "x" top: "y" }
    """)
    assert net.top_ids[1] == net.bottom_ids[1]
    assert net.blob_names == ["x", "y"] and net.outputs == ["y"] and [net.blob_names[i] for i in net.input_ids] == ["x"]


SHARED = """
    layer { name: "in" type: "Input" top: "a" top: "b" input_param { shape { dim: 4 dim: 5 } } }
    layer { name: "ip_a" type: "InnerProduct" bottom: "a" top: "fa"
            param { name: "w" lr_mult: 1 } param { name: "bias" }
            inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
    layer { name: "ip_b" type: "InnerProduct" bottom: "b" top: "fb"
            param { name: "w" %s } param { name: "bias" }
            inner_product_param { num_output: %d } }
    layer { name: "loss" type: "EuclideanLoss" bottom: "fa" bottom: "fb" top: "loss" }
"""


def test_weight_sharing_by_param_name():
    net = net_from_text(SHARED % ("", 3))
    a, b = net.layers[net.layer_index("ip_a")], net.layers[net.layer_index("ip_b")]
    assert a.blobs[0] is b.blobs[0] and a.blobs[1] is b.blobs[1]
    assert len(net.learnable_params) == 2 and net.learnable_param_ids == [0, 1, 0, 1]
    assert net.param_owner == [-1, -1, 0, 1]


def test_weight_sharing_shape_mismatch_names_both_layers():
    with pytest.raises(NetError, match=r"cannot share param 'w' owned by layer 'ip_a' with layer 'ip_b'; shape "
                                       r"mismatch. Owner layer param shape is \(3, 5\); sharing layer expects "
                                       r"shape \(4, 5\)"):
        net_from_text(SHARED % ("", 4))


def test_permissive_sharing_keeps_each_blob_shape_over_one_memory():
    """PERMISSIVE shares blobs of equal count: the sharer keeps its own shape (Caffe's ShareData and ShareDiff
    share memory, not shapes), so ip_b's (5, 3) weights are ip_a's (3, 5) read in order, and both layers'
    gradients add into the one diff."""
    net = net_from_text("""
        layer { name: "in" type: "Input" top: "a" top: "b"
                input_param { shape { dim: 4 dim: 5 } shape { dim: 4 dim: 3 } } }
        layer { name: "ip_a" type: "InnerProduct" bottom: "a" top: "fa" param { name: "w" }
                inner_product_param { num_output: 3 bias_term: false weight_filler { type: "gaussian" } } }
        layer { name: "ip_b" type: "InnerProduct" bottom: "b" top: "fb" param { name: "w" share_mode: PERMISSIVE }
                inner_product_param { num_output: 5 bias_term: false } }
        layer { name: "ip_c" type: "InnerProduct" bottom: "fa" top: "fc" inner_product_param { num_output: 5 } }
        layer { name: "loss" type: "EuclideanLoss" bottom: "fc" bottom: "fb" top: "loss" }
    """)
    wa, wb = net.layers[net.layer_index("ip_a")].blobs[0], net.layers[net.layer_index("ip_b")].blobs[0]
    assert wa.shape == (3, 5) and wb.shape == (5, 3) and len(net.learnable_params) == 3
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    net.blob_by_name("a").data[...], net.blob_by_name("b").data[...] = a, b
    net.clear_param_diffs()
    net.forward_backward()
    np.testing.assert_array_equal(wb.data, wa.data.reshape(5, 3))
    np.testing.assert_allclose(net.blob_by_name("fb").data, b @ wa.data.reshape(5, 3).T, rtol=1e-6)
    dfa, dfb = net.blob_by_name("fa").diff, net.blob_by_name("fb").diff
    expected = (dfa.T @ a).reshape(-1) + (dfb.T @ b).reshape(-1)
    np.testing.assert_allclose(wa.diff.reshape(-1), expected, rtol=1e-5, atol=1e-6)


def test_weight_sharing_mismatched_lr_mult():
    with pytest.raises(NetError, match="shared param 'w' has mismatched lr_mult"):
        net_from_text(SHARED % ("lr_mult: 2", 3))
    net = net_from_text(SHARED % ("lr_mult: 1 decay_mult: 3", 3))   # owner left decay_mult unset: adopted
    assert net.params_weight_decay[0] == 3


def test_zoo_siamese_net_shares_weights():
    net = Net(read_net(ZOO / "bvlc" / "examples" / "siamese" / "mnist_siamese.prototxt"), phase=TEST)
    assert net.layers[net.layer_index("conv1")].blobs  # deploy half of the siamese pair
    # the train/test net shares conv1_w etc. between the two towers; build its graph with Input data instead
    param = read_net(ZOO / "bvlc" / "examples" / "siamese" / "mnist_siamese_train_test.prototxt")
    data = [l for l in param.layer if l.type == "Data"]
    for layer in data:
        layer.type = "Input"
        layer.input_param.shape.add().dim.extend([64, 2, 28, 28])
        layer.input_param.shape.add().dim.extend([64])
        layer.ClearField("data_param")
        layer.ClearField("transform_param")
    net = Net(param, phase=TRAIN)
    conv1, conv1_p = net.layers[net.layer_index("conv1")], net.layers[net.layer_index("conv1_p")]
    assert conv1.blobs[0] is conv1_p.blobs[0]
    assert len(net.learnable_params) == len(net.param_blobs) // 2


def test_backward_needs_follow_caffe():
    net = net_from_text("""
        force_backward: false
        layer { name: "in" type: "Input" top: "x" top: "label" input_param { shape { dim: 4 dim: 6 } shape { dim: 4 } } }
        layer { name: "frozen" type: "InnerProduct" bottom: "x" top: "h" param { lr_mult: 0 } param { lr_mult: 0 }
                inner_product_param { num_output: 5 } }
        layer { name: "ip" type: "InnerProduct" bottom: "h" top: "out" inner_product_param { num_output: 3 } }
        layer { name: "side" type: "InnerProduct" bottom: "h" top: "unused" inner_product_param { num_output: 2 } }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "out" bottom: "label" top: "loss" }
    """)
    need = dict(zip(net.layer_names, net.layer_need_backward))
    # frozen and its split: nothing below them learns; side: does not lead to the loss
    assert need == {"in": False, "frozen": False, "h_frozen_0_split": False, "ip": True, "side": False, "loss": True}
    assert net.bottom_need_backward[net.layer_index("loss")] == [True, False]
    assert net.bottom_need_backward[net.layer_index("ip")] == [False]
    assert net.outputs == ["loss", "unused"]      # a std::set<string> in net.cpp: by name, not by creation


def test_force_backward_and_propagate_down():
    text = """
        force_backward: %s
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" %s inner_product_param { num_output: 2 } }
        layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "y2" top: "l" }
        layer { name: "in2" type: "Input" top: "y2" input_param { shape { dim: 2 dim: 2 } } }
    """
    with pytest.raises(NetError, match="unknown bottom blob 'y2'"):
        net_from_text(text % ("false", ""))
    text = text.replace('layer { name: "in2"', '#').replace('bottom: "y2"', 'bottom: "x2"')
    text = text.replace('top: "x" input_param { shape { dim: 2 dim: 3 } } }',
                        'top: "x" top: "x2" input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 2 } } }')
    net = net_from_text(text % ("true", ""))
    assert net.bottom_need_backward[net.layer_index("ip")] == [True]
    net = net_from_text(text % ("false", "propagate_down: false"))
    assert net.bottom_need_backward[net.layer_index("ip")] == [False]
    with pytest.raises(NetError, match="propagate_down must be given once per bottom"):
        net_from_text(text % ("false", "propagate_down: false propagate_down: true"))


def test_loss_weight_on_shared_top_goes_through_split():
    net = net_from_text("""
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "r" type: "ReLU" bottom: "x" top: "y" loss_weight: 2 }
        layer { name: "s" type: "Sigmoid" bottom: "y" top: "z" }
    """)
    split = net.layers[net.layer_index("y_r_0_split")]
    assert list(split.param.loss_weight) == [2.0, 0.0]
    assert net.layers[net.layer_index("r")].loss_weights == [0.0]
    assert np.all(net.blob_by_name("y_r_0_split_0").diff == 2.0)   # Caffe keeps the loss weight in the diff


def test_losses_are_summed_in_float_as_caffe_does():
    """Layer::Forward dots each top with its loss weights and Net::ForwardFromTo adds them in Dtype: 1 + 2^-25
    is 1 in float32 (it was 1 + 2^-25 summed in double)."""
    net = net_from_text("""
        layer { name: "in" type: "Input" top: "x" top: "t" input_param { shape { dim: 2 } shape { dim: 1 } } }
        layer { name: "a" type: "Power" bottom: "x" top: "y" loss_weight: 1 }
        layer { name: "b" type: "Power" bottom: "t" top: "z" loss_weight: 1 }
    """)
    net.blob_by_name("x").data[...] = [1.0, 2.0 ** -25]
    net.blob_by_name("t").data[...] = [2.0 ** -25]
    assert net.forward_from_to() == 1.0


@pytest.mark.parametrize("text, message", [
    ('layer { name: "a" type: "Input" top: "x" input_param { shape { dim: 1 } } }'
     'layer { name: "b" type: "Input" top: "x" input_param { shape { dim: 1 } } }',
     "top blob 'x' produced by multiple sources"),
    ('layer { name: "b" type: "ReLU" bottom: "nope" top: "y" }', "unknown bottom blob 'nope'"),
    ('layer { name: "a" type: "Input" top: "x" input_param { shape { dim: 1 } } include { phase: TRAIN } '
     'exclude { phase: TEST } }', "either include rules or exclude rules"),
    ('layer { name: "m" type: "MyFancyLayer" }', "unknown layer type: 'MyFancyLayer'"),
    ('layer { name: "a" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }'
     'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" param {} param {} param {} '
     'inner_product_param { num_output: 2 } }', "too many params specified"),
])
def test_graph_errors(text, message):
    with pytest.raises(NetError, match=message):
        net_from_text(text)


def test_state_rules_level_and_stages():
    text = """
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }
        layer { name: "lv" type: "ReLU" bottom: "x" top: "a" include { min_level: 2 } }
        layer { name: "st" type: "ReLU" bottom: "x" top: "b" include { stage: "deploy" } }
        layer { name: "ns" type: "ReLU" bottom: "x" top: "c" exclude { not_stage: "deploy" } }
        layer { name: "ph" type: "ReLU" bottom: "x" top: "d" include { phase: TRAIN } }
    """
    assert net_from_text(text, TEST).layer_names == ["in"]
    net = net_from_text(text, TRAIN, level=2, stages=["deploy"])
    assert set(net.layer_names) >= {"lv", "st", "ns", "ph"}


def test_net_state_in_prototxt_is_merged():
    net = net_from_text("""
        state { stage: "deploy" }
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }
        layer { name: "st" type: "ReLU" bottom: "x" top: "b" include { stage: "deploy" } }
    """)
    assert "st" in net.layer_names


def test_batchnorm_statistics_are_not_learned():
    # BatchNorm adds lr_mult 0 specs to its own param copy; Caffe's AppendParam reads that copy.
    net = net_from_text("""
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
        layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" }
        layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "x" top: "l" }
    """)
    assert net.params_lr == [0.0, 0.0, 0.0] and net.params_weight_decay == [1.0, 1.0, 1.0]
    bn = net.layer_index("bn")
    assert len(net.layers[bn].param.param) == 3 and not len(net.param.layer[bn].param)


def test_forward_skips_reshapes_only_while_shapes_hold(monkeypatch):
    # Layers whose reshape follows from shapes alone are reshaped again only when a bottom or top changed shape;
    # a Filter (its top follows the selector's values) is reshaped at every forward, as Caffe does.
    net = net_from_text("""
        layer { name: "in" type: "Input" top: "x" top: "sel" input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }
        layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
                inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
        layer { name: "relu" type: "ReLU" bottom: "y" top: "y" }
        layer { name: "filter" type: "Filter" bottom: "y" bottom: "sel" top: "kept" }
    """, phase=TEST)
    calls = []
    for layer in net.layers:
        original = layer.reshape
        monkeypatch.setattr(layer, "reshape", lambda b, t, o=original, n=layer.name: (calls.append(n), o(b, t)))
    net.blob_by_name("sel").data[...] = [1, 0, 1, 1]
    net.forward_from_to()
    assert calls == ["in", "ip", "relu", "filter"] and net.blob_by_name("kept").shape == (3, 2)
    calls.clear()
    net.blob_by_name("sel").data[...] = [0, 0, 1, 0]
    net.forward_from_to()
    assert calls == ["in", "filter"] and net.blob_by_name("kept").shape == (1, 2)
    # a new batch size reaches every layer; so does a top reshaped from outside
    calls.clear()
    net.blob_by_name("x").reshape(6, 3)
    net.blob_by_name("sel").reshape(6)
    net.forward_from_to()
    assert calls == ["in", "ip", "relu", "filter"] and net.blob_by_name("y").shape == (6, 2)
    calls.clear()
    net.blob_by_name("y").reshape(1, 12)
    net.forward_from_to()    # ip's reshape puts y back as relu last saw it
    assert calls == ["in", "ip", "filter"] and net.blob_by_name("y").shape == (6, 2)
    x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    net.blob_by_name("x").data[...] = x
    net.forward_from_to()
    w, b = (blob.data for blob in net.layers[1].blobs)
    np.testing.assert_allclose(net.blob_by_name("y").data, np.maximum(x @ w.T + b, 0), rtol=1e-6)
