"""Whole nets against the real Caffe: LeNet and CIFAR-10 quick (TRAIN forward + backward, TEST outputs), and the
forward of two zoo deploy nets (SqueezeNet v1.1, ResNet-50) with weights made by the fixtures' rule."""
import json
import zlib

import numpy as np
import pytest

from pycaffe_dist.pycaffe import Net
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, load_npz

NETS = GOLDEN / "nets"


def _run_train(case):
    net = Net(str(case / "net.prototxt"), phase=caffe_pb2.TRAIN, weights=str(case / "weights.caffemodel"))
    for name, x in load_npz(case / "inputs.npz").items():
        net.blobs[name].data[...] = x
    net.forward()
    return net


@pytest.mark.parametrize("name", ["lenet", "cifar10_quick"])
def test_train_forward_and_backward_match_caffe(name):
    case = NETS / name
    meta = json.loads((case / "case.json").read_text())
    tol = meta["tolerance"]
    net = _run_train(case)
    for blob, y in load_npz(case / "forward.npz").items():
        t = tol["loss"] if blob == "loss" else tol["forward"]
        np.testing.assert_allclose(net.blobs[blob].data, y, rtol=t["rtol"], atol=t["atol"], err_msg=blob)
    net.backward()
    for key, g in load_npz(case / "grads.npz").items():
        if key.startswith("param/"):
            _, layer, index = key.split("/")
            got = net.params[layer][int(index)].diff
        else:
            got = net.blobs[key].diff
        np.testing.assert_allclose(got, g, rtol=tol["grads"]["rtol"], atol=tol["grads"]["atol"], err_msg=key)


@pytest.mark.parametrize("name", ["lenet", "cifar10_quick"])
def test_test_phase_outputs_match_caffe(name):
    case = NETS / name
    net = Net(str(case / "net.prototxt"), phase=caffe_pb2.TEST, weights=str(case / "weights.caffemodel"))
    for blob, x in load_npz(case / "inputs.npz").items():
        net.blobs[blob].data[...] = x
    out = net.forward()
    for blob, y in load_npz(case / "test_outputs.npz").items():
        np.testing.assert_allclose(out[blob], y, rtol=1e-5, atol=1e-6, err_msg=blob)


def rule_weights(net):
    """The fixtures' weight rule (zoo_forward case.json 'weights.rule'), in float32 as they made it."""
    for name, layer in zip(net._layer_names, net.layers):
        for j, blob in enumerate(layer.blobs):
            n = np.random.default_rng(zlib.crc32(("%s/%d" % (name, j)).encode())).standard_normal(
                blob.shape).astype(np.float32)
            kind = layer.param.type
            if kind == "BatchNorm":
                value = [n * np.float32(0.1), np.float32(1) + np.abs(n) * np.float32(0.1),
                         np.ones(blob.shape, np.float32)][j]
            elif kind == "Scale":
                value = np.float32(1) + n * np.float32(0.1) if j == 0 else n * np.float32(0.01)
            elif j == 0:
                value = n * np.float32(np.sqrt(1.0 / (blob.count // blob.shape[0])))
            else:
                value = n * np.float32(0.01)
            blob.data[...] = value


@pytest.mark.parametrize("name", ["squeezenet_v1.1", "resnet50_kaiminghe"])
def test_zoo_deploy_forward_matches_caffe(name):
    case = NETS / "zoo_forward" / name
    meta = json.loads((case / "case.json").read_text())
    net = Net(str(case / "net.prototxt"), phase=caffe_pb2.TEST)
    rule_weights(net)
    # The weights are the fixtures' own (every blob's shape, sum and first values), so a mismatch below is ours.
    for key, entry in json.loads((case / "param_fingerprint.json").read_text()).items():
        layer, j = key.rsplit("/", 1)
        blob = net.params[layer][int(j)]
        assert list(blob.shape) == entry["shape"], key
        np.testing.assert_allclose(float(blob.data.astype(np.float64).sum()), entry["sum"], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(blob.data.reshape(-1)[:3], np.float32(entry["first"]))
    for blob, x in load_npz(case / "input.npz").items():
        net.blobs[blob].data[...] = x
    net.forward()
    tol = meta["tolerance"]
    for blob, y in load_npz(case / "outputs.npz").items():
        got = net.blobs[blob].data
        bound = tol["atol"] * np.abs(y).max() + tol["rtol"] * np.abs(y)
        worst = np.max(np.abs(got - y) - bound)
        assert worst <= 0, "%s: %s exceeds the tolerance by %g" % (name, blob, worst)
