"""export/onnx_check.py, and through it whole nets: every deploy net of prototxt/, every net of the zoo corpus that
builds without data, a LeNet trained here by our solver and LeNet with the golden weights (against the real
Caffe's outputs) export and run in onnxruntime within 1e-4 of our forward; the corpus nets that do not export say
why in one line."""
import hashlib
import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import pycaffe_dist as caffe  # noqa: E402
from pycaffe_dist.errors import DataError, ExportError, NetError  # noqa: E402
from pycaffe_dist.export import compare, load_net, to_onnx  # noqa: E402
from pycaffe_dist.export.onnx_check import random_inputs, relative_difference, run_onnx  # noqa: E402
from pycaffe_dist.io.caffemodel import load_weights  # noqa: E402
from pycaffe_dist.io.load import read_net  # noqa: E402
from pycaffe_dist.net.net import Net  # noqa: E402
from pycaffe_dist.proto import caffe_pb2  # noqa: E402
from tests.conftest import GOLDEN, REPO, ZOO, load_npz  # noqa: E402
from tests.export.onnx_cases import (TOLERANCE, assert_agrees, batch_of_one, export_and_compare,  # noqa: E402
                                     randomize)

LENET_DEPLOY = ZOO / "bvlc" / "examples" / "mnist" / "lenet.prototxt"


# --- the measure ---------------------------------------------------------------------------------------------

def test_relative_difference_is_relative_to_the_largest_magnitude():
    ours = np.array([100.0, -200.0, 0.5], np.float32)
    assert relative_difference(ours, ours + np.float32(0.02)) == pytest.approx(0.02 / 200, rel=1e-3)
    assert relative_difference(np.zeros(3), np.full(3, 1e-3)) == pytest.approx(1e-3)   # absolute on all zeros
    assert relative_difference(np.zeros(3), np.zeros(3)) == 0.0


def test_relative_difference_is_infinite_where_shapes_or_non_finite_places_differ():
    a = np.array([1.0, np.nan, np.inf])
    assert relative_difference(a, a.copy()) == 0.0
    assert relative_difference(a, np.array([1.0, 2.0, np.inf])) == float("inf")
    assert relative_difference(a, np.array([1.0, np.nan, -np.inf])) == float("inf")
    assert relative_difference(np.zeros((2, 3)), np.zeros((3, 2))) == float("inf")


def test_a_model_of_another_net_is_told_apart(tmp_path):
    lenet = load_net(LENET_DEPLOY)
    model = to_onnx(lenet, tmp_path / "lenet.onnx")
    text = 'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 64 dim: 1 dim: 28 dim: 28 } } }' \
           'layer { name: "a" type: "Sigmoid" bottom: "data" top: "a" }' \
           'layer { name: "b" type: "TanH" bottom: "data" top: "b" }'
    from pycaffe_dist.io.prototxt import parse_text
    other = Net(parse_text(text, caffe_pb2.NetParameter()), phase=caffe_pb2.TEST)
    with pytest.raises(ExportError, match="has 1 outputs, the net 2"):
        compare(other, model)


# --- the ready deploy nets of prototxt/ ----------------------------------------------------------------------

DEPLOY_NETS = sorted(p.name for p in (REPO / "prototxt").glob("*deploy*.prototxt"))
SLOW_DEPLOY = {"vgg16_deploy.prototxt"}      # 138M weights: about half a minute on two cores


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_DEPLOY else n
                                  for n in DEPLOY_NETS])
def test_prototxt_deploy_net_agrees(name, tmp_path):
    net = load_net(REPO / "prototxt" / name)
    batch_of_one(net)
    randomize(net)
    assert_agrees(export_and_compare(net, tmp_path / "net.onnx"), name)


def test_the_prototxt_dir_has_the_deploy_nets():
    assert {"caffenet_deploy.prototxt", "googlenet_deploy.prototxt", "resnet50_deploy.prototxt",
            "squeezenet_v1.1_deploy.prototxt"} <= set(DEPLOY_NETS)


# --- the zoo corpus ------------------------------------------------------------------------------------------

MANIFEST = json.loads((GOLDEN / "upgrade" / "manifest.json").read_text())["files"]
ZOO_NETS = sorted(rel for rel, entry in MANIFEST.items()
                  if entry["kind"] == "net" and entry["status"] != "parse_failed")
_SEEN = {}     # the corpus holds the same nets several times over (the history folders): each is checked once


def _fingerprint(param):
    copy = caffe_pb2.NetParameter()
    copy.CopyFrom(param)
    copy.ClearField("name")
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("rel", ZOO_NETS)
def test_zoo_net_exports_and_agrees_or_says_why_not(rel, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)      # relative data sources resolve (and fail) in an empty folder
    param = read_net(ZOO / rel)
    first = _SEEN.setdefault(_fingerprint(param), rel)
    if first != rel:
        pytest.skip("the same net as %s" % first)
    try:
        net = Net(param, phase=caffe_pb2.TEST)
    except (DataError, NetError) as exc:      # not deploy-able here (no database, a Python layer): not our case
        pytest.skip("does not build without its data: %s" % exc)
    out = tmp_path / "net.onnx"
    try:
        batch_of_one(net)
        randomize(net)
        differences = export_and_compare(net, out)
    except ExportError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith("layer '") and "cannot be exported to ONNX" in message
        assert not out.exists()
        return
    assert_agrees(differences, rel)


def test_the_zoo_has_deploy_nets_to_walk():
    assert sum("deploy" in rel for rel in ZOO_NETS) >= 10


# --- trained LeNets ------------------------------------------------------------------------------------------

LENET_TRAIN = """
name: "LeNet"
layer { name: "mnist" type: "MemoryData" top: "data" top: "label"
        memory_data_param { batch_size: 16 channels: 1 height: 28 width: 28 } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 20 kernel_size: 5 stride: 1 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 50 kernel_size: 5 stride: 1 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1"
        inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def test_lenet_trained_here_exports_its_trained_weights(tmp_path):
    (tmp_path / "train.prototxt").write_text(LENET_TRAIN)
    (tmp_path / "solver.prototxt").write_text(
        'net: "%s" base_lr: 0.01 momentum: 0.9 lr_policy: "fixed" max_iter: 6 display: 0 random_seed: 5 '
        'snapshot_prefix: "%s"' % (tmp_path / "train.prototxt", tmp_path / "lenet"))
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 64)
    images = rng.uniform(0, 0.2, (64, 1, 28, 28)).astype(np.float32)
    images[np.arange(64), 0, 2 * labels + 4, 4:24] = 1.0          # a bar whose row is the label
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    solver.net.set_input_arrays(images, labels.astype(np.float32))
    initial = solver.net.params["ip2"][0].data.copy()
    solver.solve()
    weights = tmp_path / "lenet_iter_6.caffemodel"
    assert weights.exists() and not np.array_equal(solver.net.params["ip2"][0].data, initial)

    out = tmp_path / "lenet.onnx"
    net = load_net(LENET_DEPLOY, weights)
    model = to_onnx(net, out)
    stored = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer}
    for layer in ("conv1", "conv2", "ip1", "ip2"):
        for index, what in enumerate(("weights", "bias")):
            np.testing.assert_array_equal(stored["%s/%s" % (layer, what)], solver.net.params[layer][index].data)
    feeds = {"data": images}
    assert_agrees(compare(net, model, inputs=feeds), "trained LeNet")
    (prob,) = run_onnx(model, feeds)
    assert (prob.argmax(axis=1) == labels).mean() > 0.2      # trained: better than chance on what it saw


def test_lenet_with_caffes_weights_gives_caffes_outputs(tmp_path):
    """The golden LeNet case: weights Caffe filled, Fashion-MNIST images, Caffe's ip2. The deploy net's prob is
    softmax(ip2): the exported model must give it."""
    case = GOLDEN / "nets" / "lenet"
    net = load_net(LENET_DEPLOY, case / "weights.caffemodel")
    data = load_npz(case / "inputs.npz")["data"]
    model = to_onnx(net, tmp_path / "lenet.onnx")
    (prob,) = run_onnx(model, {"data": data})
    ip2 = load_npz(case / "forward.npz")["ip2"].astype(np.float64)
    softmax = np.exp(ip2 - ip2.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    assert relative_difference(softmax, prob) <= TOLERANCE


def test_to_onnx_takes_a_pycaffe_net_paths_or_a_pair(tmp_path):
    weights = GOLDEN / "nets" / "lenet" / "weights.caffemodel"
    pycaffe_net = caffe.Net(str(LENET_DEPLOY), str(weights), caffe.TEST)
    by_net = to_onnx(pycaffe_net, tmp_path / "a.onnx", input_shapes={"data": (2, 1, 28, 28)})
    by_pair = to_onnx((LENET_DEPLOY, weights), tmp_path / "b.onnx", input_shapes={"data": (2, 1, 28, 28)})
    assert by_net.graph == by_pair.graph
    assert_agrees(compare(pycaffe_net, by_pair), "pycaffe's Net")
    by_path = to_onnx(str(LENET_DEPLOY), tmp_path / "c.onnx")       # the prototxt's fillers, its own shapes
    assert [d.dim_value for d in by_path.graph.input[0].type.tensor_type.shape.dim] == [64, 1, 28, 28]


def test_random_inputs_follow_the_input_shapes():
    net = load_net(LENET_DEPLOY)
    inputs = random_inputs(net, seed=1)
    assert list(inputs) == ["data"] and inputs["data"].shape == (64, 1, 28, 28)
    assert inputs["data"].dtype == np.float32
    np.testing.assert_array_equal(inputs["data"], random_inputs(net, seed=1)["data"])


def test_weights_loaded_after_building_are_what_is_exported(tmp_path):
    net = Net(read_net(LENET_DEPLOY), phase=caffe_pb2.TEST)
    load_weights(net, GOLDEN / "training" / "lenet_fashion_mnist" / "lenet_iter_100.caffemodel")
    model = to_onnx(net, tmp_path / "m.onnx")
    stored = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_array_equal(stored["ip1/weights"], net.layers[net.layer_index("ip1")].blobs[0].data)
    assert_agrees(compare(net, model), "LeNet after 100 iterations of Caffe")
