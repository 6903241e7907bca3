"""draw: every net we ship and every zoo net draws; the graph has a node per drawn layer and per blob, Caffe's
labels and colours, phase filtering; pictures in the formats asked; one-line errors; `dist_caffe draw`."""
import subprocess
import sys

import pytest

from pycaffe_dist import draw
from pycaffe_dist.io.load import read_net
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import REPO, ZOO

pytest.importorskip("pydot")
NETS = sorted(p for p in list((REPO / "prototxt").glob("*.prototxt")) + list(ZOO.rglob("*.prototxt"))
              if "solver" not in p.name)

LENET = REPO / "prototxt" / "lenet_train_test.prototxt"


def _nodes(graph):
    return {node.get_name(): node for node in graph.get_nodes()}


@pytest.mark.parametrize("path", NETS, ids=[p.relative_to(REPO).as_posix() for p in NETS])
def test_every_net_draws(path):
    try:
        net = read_net(str(path))
    except Exception:                       # the zoo holds nets that are meant not to parse: not draw's concern
        pytest.skip("does not read")
    text = draw.get_pydot_graph(net, "LR").to_string()
    assert text.startswith("digraph") and text.count("->") >= sum(len(l.bottom) + len(l.top) for l in net.layer)


def test_the_graph_has_caffes_labels_and_colours():
    net = read_net(str(LENET))
    graph = draw.get_pydot_graph(net, "LR", phase=caffe_pb2.TEST, display_lrm=True)
    labels = {n.get("label"): n for n in _nodes(graph).values()}
    conv = labels[r'"conv1\n(Convolution)\nkernel size: 5\nstride: 1\npad: 0\nlr mult: 1.0, 2.0"']
    assert conv.get("fillcolor") == "#FF5050"
    assert labels[r'"pool1\n(Pooling MAX)\nkernel size: 2\nstride: 2\npad: 0"'].get("fillcolor") == "#FF9900"
    assert labels[r'"relu1\n(ReLU)"'].get("fillcolor") == "#90EE90"          # in place
    # TEST phase: one data layer (batch 100), so one mnist box
    assert sum(1 for label in labels if label and label.startswith('"mnist')) == 1
    edges = {e.get("label") for e in graph.get_edges()}
    assert {"Batch 100", "20", "50", "500", "10"} <= edges and "Batch 64" not in edges
    top_bottom = draw.get_layer_label(net.layer[2], "TB")
    assert top_bottom == '"conv1 (Convolution) kernel size: 5 stride: 1 pad: 0"'


def test_lr_mult_of_a_layer_without_parameters_is_refused():
    net = parse_text('layer { name: "r" type: "ReLU" bottom: "x" top: "x" }', caffe_pb2.NetParameter())
    with pytest.raises(ValueError, match="ReLU layers do not have a learning rate multiplier"):
        draw.get_layer_lr_mult(net.layer[0])


def test_include_and_exclude_together_are_refused():
    net = parse_text('layer { name: "r" type: "ReLU" bottom: "x" top: "x" include { phase: TRAIN } '
                     'exclude { phase: TEST } }', caffe_pb2.NetParameter())
    with pytest.raises(ValueError, match="layer r has both include and exclude"):
        draw.get_pydot_graph(net, "LR", phase=caffe_pb2.TEST)


@pytest.mark.parametrize("ext,magic", [("png", b"\x89PNG"), ("svg", b"<?xml"), ("raw", b"digraph")])
def test_draw_net_to_file_writes_the_format_of_the_extension(tmp_path, ext, magic):
    out = tmp_path / ("lenet." + ext)
    draw.draw_net_to_file(read_net(str(LENET)), str(out), "TB")
    assert out.read_bytes().startswith(magic)


def test_an_unknown_format_is_one_line(tmp_path):
    with pytest.raises(draw.DrawError, match=r"cannot draw into a \.xyz file: Graphviz writes .*png"):
        draw.draw_net(read_net(str(LENET)), "LR", "xyz")


def test_the_draw_verb(tmp_path):
    out = tmp_path / "lenet.svg"
    run = subprocess.run([sys.executable, "-m", "pycaffe_dist", "draw", str(LENET), str(out), "--phase", "train",
                          "--rankdir", "TB"], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "drawn into" in run.stdout and b"conv1" in out.read_bytes() and b"Batch 64" in out.read_bytes()
    run = subprocess.run([sys.executable, "-m", "pycaffe_dist", "draw", str(tmp_path / "none.prototxt"),
                          str(out)], capture_output=True, text=True, cwd=REPO)
    assert run.returncode != 0 and run.stderr.strip().endswith("none.prototxt: no such file")
    assert len(run.stderr.strip().splitlines()) == 1
