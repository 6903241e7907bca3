"""Run a golden case of tests/fixtures/golden/layers (one Caffe layer, forward and backward) through our Net.

The recipe is the golden README's: build the net in the case's phase, load Caffe's weights, copy the inputs,
forward, compare every output; then set the output diffs to top_diff.npz (loss tops keep their loss weight),
backward without clearing bottom diffs, and compare the bottom and parameter diffs.
"""
import contextlib
import json
import os

import numpy as np

from pycaffe_dist.pycaffe import Net
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, load_npz

LAYER_CASES = GOLDEN / "layers"


def layer_case_names():
    return sorted(p.name for p in LAYER_CASES.iterdir() if (p / "case.json").exists())


@contextlib.contextmanager
def _cwd(path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _close(what, got, want, tol, exact):
    assert got.shape == want.shape, "%s: shape %s, Caffe %s" % (what, got.shape, want.shape)
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=tol["rtol"], atol=tol["atol"], err_msg=what)


def param_of(net, key, diff):
    _, layer, index = key.split("/")
    blob = net.layers[net.layer_index(layer)].blobs[int(index)]
    return blob.diff if diff else blob.data


def run_layer_case(name):
    case = LAYER_CASES / name
    meta = json.loads((case / "case.json").read_text())
    tol = meta["tolerance"]     # every case meets its own tolerance: none is loosened
    exact = tol.get("exact", False) or (tol["rtol"] == 0 and tol["atol"] == 0)
    phase = caffe_pb2.TRAIN if meta["phase"] == "TRAIN" else caffe_pb2.TEST
    with _cwd(case):
        net = Net(str(case / "net.prototxt"), phase=phase)
        if (case / "weights.caffemodel").exists():
            net.copy_from(str(case / "weights.caffemodel"))
        for blob_name, x in load_npz(case / "inputs.npz").items():
            net.blobs[blob_name].data[...] = x
        net.forward()
    for blob_name, y in load_npz(case / "outputs.npz").items():
        _close("%s: output %s" % (name, blob_name), net.blobs[blob_name].data, y, tol, exact)
    if (case / "params_after_forward.npz").exists():
        for key, p in load_npz(case / "params_after_forward.npz").items():
            _close("%s: %s after forward" % (name, key), param_of(net, key, diff=False), p, tol, exact)
    if not meta["backward"]["performed"]:
        return net
    for blob_name, d in load_npz(case / "top_diff.npz").items():
        net.blobs[blob_name].diff[...] = d
    net.backward()
    for key, g in load_npz(case / "grads.npz").items():
        got = param_of(net, key, diff=True) if key.startswith("param/") else net.blobs[key].diff
        _close("%s: diff of %s" % (name, key), got, g, tol, exact)
    return net
