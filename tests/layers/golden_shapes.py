"""Shape checks of one layer against a golden case of tests/fixtures/golden/layers (made by the real Caffe)."""
import json

from pycaffe_dist.io.prototxt import read_text
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, load_npz

LAYER_CASES = GOLDEN / "layers"


def cases_of(*types):
    """Names of golden layer cases whose layer under test has one of the given Caffe types."""
    out = []
    for case in sorted(p for p in LAYER_CASES.iterdir() if (p / "net.prototxt").exists()):
        net = read_text(case / "net.prototxt", caffe_pb2.NetParameter())
        if any(l.name == "layer" and l.type in types for l in net.layer):
            out.append(case.name)
    return out


def check_case_shapes(name):
    """Set the layer up on the golden inputs' shapes; compare top shapes and param shapes with Caffe's."""
    case = LAYER_CASES / name
    meta = json.loads((case / "case.json").read_text())
    net = read_text(case / "net.prototxt", caffe_pb2.NetParameter())
    lp = next(l for l in net.layer if l.name == "layer")
    lp.phase = caffe_pb2.TRAIN if meta["phase"] == "TRAIN" else caffe_pb2.TEST
    inputs = load_npz(case / "inputs.npz")
    outputs = load_npz(case / "outputs.npz")
    bottom = [Blob(inputs[b].shape if b in inputs else outputs[b].shape) for b in lp.bottom]
    top = [Blob() for _ in lp.top]
    layer = create_layer(lp, lp.phase)
    layer.setup(bottom, top)
    for tname, blob in zip(lp.top, top):
        if tname in outputs:
            assert blob.shape == outputs[tname].shape, "%s: top %s is %s, Caffe %s" % (
                name, tname, blob.shape, outputs[tname].shape)
    if (case / "params.npz").exists():
        params = load_npz(case / "params.npz")
        expect = [params["param/layer/%d" % i].shape for i in range(len(params))]
        got = [b.shape for b in layer.blobs]
        assert got == expect, "%s: param shapes %s, Caffe %s" % (name, got, expect)
    return layer, bottom, top
