"""`dist_caffe` as a user runs it: real processes, one-line errors, no tracebacks."""
import json
import subprocess
import sys

import pytest

from pycaffe_dist.io.prototxt import read_text
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, REPO, ZOO

UPGRADE = json.loads((GOLDEN / "upgrade" / "manifest.json").read_text())["files"]


def dist_caffe(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pycaffe_dist", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={"PYTHONPATH": str(REPO)})


def assert_clean_error(run, *fragments):
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    lines = [l for l in run.stderr.splitlines() if l.startswith("dist_caffe: error:")]
    assert len(lines) == 1, run.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_net_info_lenet_table():
    run = dist_caffe("net-info", ZOO / "bvlc" / "examples" / "mnist" / "lenet.prototxt")
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines() if line.strip()}
    assert rows["conv1"][1] == "Convolution" and "conv1(64,20,24,24)" in rows["conv1"]
    assert rows["ip1"][-2] == "400.50K"          # 500*800 + 500 parameters
    # LeNet: 431,080 parameters; conv1 is 2*20*25*576*64 + bias adds ...
    assert "431080" in run.stdout and "inputs: data; outputs: prob" in run.stdout


def test_net_info_train_phase_of_data_net_fails_cleanly():
    run = dist_caffe("net-info", ZOO / "bvlc" / "examples" / "mnist" / "lenet_train_test.prototxt", "--phase",
                     "TRAIN")
    assert_clean_error(run, "layer 'mnist' (Data)", "cannot open data source 'examples/mnist/mnist_train_lmdb'")


@pytest.mark.parametrize("rel", [r for r, e in sorted(UPGRADE.items()) if e["status"] == "upgraded"][::6])
def test_upgrade_command_matches_caffe_tools(rel, tmp_path):
    entry = UPGRADE[rel]
    solver = entry["kind"] == "solver"
    out = tmp_path / "out.prototxt"
    run = dist_caffe("upgrade", *(["--solver"] if solver else []), ZOO / rel, out)
    assert run.returncode == 0, run.stderr
    cls = caffe_pb2.SolverParameter if solver else caffe_pb2.NetParameter
    assert read_text(out, cls()) == read_text(GOLDEN / "upgrade" / entry["output"], cls())


def test_upgrade_binary_caffemodel(tmp_path):
    # A V1 caffemodel (binary `layers` with enum types) upgrades to V2 with the weights carried along.
    net = read_text(ZOO / "bvlc_history" / "v1-11a4c1655-2015-02" / "examples" / "mnist" / "lenet.prototxt",
                    caffe_pb2.NetParameter())
    conv1 = next(l for l in net.layers if l.name == "conv1")
    blob = conv1.blobs.add()
    blob.num, blob.channels, blob.height, blob.width = 1, 1, 1, 3
    blob.data.extend([1.0, 2.0, 3.0])
    (tmp_path / "v1.caffemodel").write_bytes(net.SerializeToString())
    run = dist_caffe("upgrade", tmp_path / "v1.caffemodel", tmp_path / "v2.caffemodel")
    assert run.returncode == 0, run.stderr
    out = caffe_pb2.NetParameter()
    out.ParseFromString((tmp_path / "v2.caffemodel").read_bytes())
    assert not len(out.layers) and out.layer[0].type == "Input"
    conv1 = next(l for l in out.layer if l.name == "conv1")
    assert conv1.type == "Convolution" and list(conv1.blobs[0].data) == [1.0, 2.0, 3.0]


def test_already_latest_is_said(tmp_path):
    run = dist_caffe("upgrade", ZOO / "bvlc" / "examples" / "mnist" / "lenet.prototxt", tmp_path / "o.prototxt")
    assert run.returncode == 0 and "already in latest proto format" in run.stderr


def test_syntax_error_names_file_line_column_token(tmp_path):
    bad = tmp_path / "bad.prototxt"
    bad.write_text('name: "x"\nlayer {\n  name: "a"\n  typo_field: 3\n}\n')
    run = dist_caffe("net-info", bad)
    assert_clean_error(run, "bad.prototxt:4:3:", "has no field named \"typo_field\"", "(at 'typo_field')")
    bad.write_text('layer { name: "a" type: "Input" top: "x" input_param { shape { dim: 2 } }\n')
    assert_clean_error(dist_caffe("net-info", bad), "bad.prototxt:1:73: unexpected end of file: Expected \"}\"")


@pytest.mark.parametrize("args, fragments", [
    (["net-info", "/nonexistent/net.prototxt"], ["/nonexistent/net.prototxt", "no such file"]),
    (["upgrade", "/nonexistent/old.caffemodel", "x"], ["/nonexistent/old.caffemodel", "no such file"]),
])
def test_missing_files(args, fragments):
    assert_clean_error(dist_caffe(*args), *fragments)


def test_garbage_caffemodel_is_refused(tmp_path):
    bad = tmp_path / "junk.caffemodel"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    run = dist_caffe("net-info", ZOO / "bvlc" / "examples" / "mnist" / "lenet.prototxt", "--weights", bad)
    assert_clean_error(run, "junk.caffemodel: is not a Caffe model")


def test_unknown_layer_type_is_one_line(tmp_path):
    net = tmp_path / "odd.prototxt"
    net.write_text('layer { name: "roi" type: "ROIPooling" }\n')
    assert_clean_error(dist_caffe("net-info", net), "layer 'roi': unknown layer type: 'ROIPooling'")


def test_time_prints_caffe_style_per_layer_timings(tmp_path):
    net = GOLDEN / "nets" / "lenet" / "net.prototxt"
    plot = tmp_path / "layers.png"
    run = dist_caffe("time", "--model", net, "--iterations", 2, "--threads", 1, "--plot", plot)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "Testing for 2 iterations." in out and "Iteration: 2 forward-backward time:" in out
    for layer in ("conv1", "pool1", "conv2", "ip1", "relu1", "ip2", "loss"):
        assert "%s\tforward:" % layer in out and "%s\tbackward:" % layer in out, layer
    assert "Average Forward-Backward:" in out and "Total Time:" in out
    loss = float(next(l for l in out.splitlines() if l.startswith("Initial loss:")).split()[-1])
    assert abs(loss - 2.302585) < 1e-3          # zero inputs: every class equally likely, loss = ln 10
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_shows_the_wait_for_prefetched_data(tmp_path):
    case = GOLDEN / "solvers" / "sgd_momentum"            # a Data layer on the LMDB Caffe wrote
    run = dist_caffe("time", "--model", case / "net.prototxt", "--iterations", 3, "--threads", 1, cwd=case)
    assert run.returncode == 0, run.stderr
    line = next(l for l in run.stdout.splitlines() if l.startswith("Average wait for prefetched data:"))
    wait_ms, share = float(line.split()[5]), float(line.split("(")[1].split("%")[0])
    assert wait_ms >= 0 and 0 <= share <= 100


def test_time_rejects_zero_iterations():
    run = dist_caffe("time", "--model", GOLDEN / "nets" / "lenet" / "net.prototxt", "--iterations", 0)
    assert_clean_error(run, "--iterations must be at least 1")
