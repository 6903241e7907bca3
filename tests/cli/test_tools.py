"""The tool verbs (cli/tools.py: net-info, upgrade, device-query) as a user runs them: real processes, one-line
errors, no tracebacks."""
import json

import pytest

from pycaffe_dist.io.prototxt import read_text
from pycaffe_dist.proto import caffe_pb2
from tests.cli.commands import assert_clean_error, dist_caffe
from tests.conftest import GOLDEN, ZOO

UPGRADE = json.loads((GOLDEN / "upgrade" / "manifest.json").read_text())["files"]


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


PIPELINE_NET = """
name: "small"
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 8 dim: 1 dim: 12 dim: 12 } shape { dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "ip1" type: "InnerProduct" bottom: "conv1" top: "ip1" inner_product_param { num_output: 16 } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def test_net_info_pipeline_shows_each_layers_stage_and_each_cut(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text(PIPELINE_NET)
    run = dist_caffe("net-info", net, "--pipeline", "2")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    stages = {line.split()[2]: int(line.split()[1]) for line in lines if line.startswith("  stage ")}
    assert stages["input"] == 0 and stages["loss"] == 1 and sorted(set(stages.values())) == [0, 1]
    assert sum(line.startswith("stage ") for line in lines) == 2
    cut = [line for line in lines if line.startswith("cut 0|1 after ")]
    assert len(cut) == 1 and "label(8) no diff" in cut[0] and "B forward" in cut[0], run.stdout


def test_net_info_pipeline_of_more_stages_than_layers_is_one_line(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text(PIPELINE_NET)
    assert_clean_error(dist_caffe("net-info", net, "--pipeline", "7"),
                       "cannot be cut into 7 stages", "at most 6 stages")


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
