"""The export-onnx verb (cli/export.py) through the command line's main: the file, the check's report, the input
shape options and the one-line errors."""
import argparse

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from pycaffe_dist import cli  # noqa: E402
from pycaffe_dist.cli import export  # noqa: E402
from tests.cli.commands import assert_clean_error, dist_caffe  # noqa: E402
from tests.conftest import GOLDEN, ZOO  # noqa: E402

LENET = ZOO / "bvlc" / "examples" / "mnist" / "lenet.prototxt"
WEIGHTS = GOLDEN / "training" / "lenet_fashion_mnist" / "lenet_iter_100.caffemodel"


def _verbs(parser):
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def registered():
    return "export-onnx" in _verbs(cli.build_parser()).choices


@pytest.fixture
def run(monkeypatch, capsys):
    """dist_caffe's main with the export verbs (added here while cli/__init__.py does not list them yet)."""
    build = cli.build_parser

    def with_export():
        parser = build()
        if "export-onnx" not in _verbs(parser).choices:
            export.add_verbs(_verbs(parser))
        return parser
    monkeypatch.setattr(cli, "build_parser", with_export)

    def call(*argv):
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return call


def weights_of(net_path):
    """A .caffemodel of the net's filled weights, beside it."""
    from pycaffe_dist.io.caffemodel import write_model
    from pycaffe_dist.io.load import read_net
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    path = net_path.with_suffix(".caffemodel")
    write_model(Net(read_net(str(net_path)), phase=caffe_pb2.TEST), str(path))
    return path


def dims(value):
    return [d.dim_value for d in value.type.tensor_type.shape.dim]


def test_export_with_check_writes_the_model_and_reports_the_difference(run, tmp_path):
    out = tmp_path / "lenet.onnx"
    code, stdout, stderr = run("export-onnx", "--model", LENET, "--weights", WEIGHTS, "-o", out, "--check")
    assert code == 0, stderr
    model = onnx.load(str(out))
    assert [v.name for v in model.graph.input] == ["data"] and [v.name for v in model.graph.output] == ["prob"]
    assert "wrote %s: 9 nodes" % out in stderr and "inputs: data (64, 1, 28, 28); outputs: prob (64, 10)" in stderr
    (line,) = [l for l in stdout.splitlines() if l.startswith("check: output prob: max relative difference ")]
    assert float(line.split("difference ")[1].split()[0]) <= 1e-4


@pytest.mark.parametrize("option, shape", [("2,1,28,28", [2, 1, 28, 28]), ("data=3,1,28,28", [3, 1, 28, 28])])
def test_input_shape_option(run, tmp_path, option, shape):
    out = tmp_path / "lenet.onnx"
    code, _, stderr = run("export-onnx", "--model", LENET, "--weights", WEIGHTS, "--output", out,
                          "--input-shape", option, "--opset", "13")
    assert code == 0, stderr
    model = onnx.load(str(out))
    assert dims(model.graph.input[0]) == shape and dims(model.graph.output[0]) == [shape[0], 10]
    assert model.opset_import[0].version == 13


def test_an_unnamed_input_shape_needs_a_net_with_one_input(run, tmp_path):
    net = tmp_path / "two.prototxt"
    net.write_text('layer { name: "in" type: "Input" top: "a" top: "b" input_param { shape { dim: 2 dim: 3 } } }'
                   'layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "sum" }')
    weights = weights_of(net)
    code, _, stderr = run("export-onnx", "--model", net, "--weights", weights, "-o", tmp_path / "m.onnx",
                          "--input-shape", "4,3")
    assert code == 1
    assert stderr.strip().splitlines()[-1] == ("dist_caffe: error: %s: the net has 2 inputs (a, b): name the one to "
                                               "reshape, --input-shape NAME=4,3" % net)
    assert not (tmp_path / "m.onnx").exists()


def test_a_bad_input_shape_is_an_argument_error(run, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        run("export-onnx", "--model", LENET, "--weights", WEIGHTS, "-o", tmp_path / "m.onnx", "--input-shape", "x,y")
    assert info.value.code == 2
    assert "input shape must be NAME=D1,D2,... or D1,D2,... (integers), not 'x,y'" in capsys.readouterr().err


def test_an_unsupported_layer_is_one_line_and_no_file(run, tmp_path):
    net = tmp_path / "train.prototxt"
    net.write_text('layer { name: "in" type: "Input" top: "x" top: "label" '
                   'input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }'
                   'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "label" top: "loss" }')
    weights = weights_of(net)
    out = tmp_path / "m.onnx"
    code, _, stderr = run("export-onnx", "--model", net, "--weights", weights, "-o", out)
    assert code == 1
    errors = [l for l in stderr.splitlines() if l.startswith("dist_caffe: error:")]
    assert errors == ["dist_caffe: error: layer 'loss' (SoftmaxWithLoss): cannot be exported to ONNX: a loss layer "
                      "needs labels: export a deploy net (Softmax for the probabilities)"]
    assert sorted(tmp_path.iterdir()) == sorted([net, weights])


def test_a_check_beyond_the_tolerance_fails_but_keeps_the_model(run, tmp_path):
    out = tmp_path / "lenet.onnx"
    code, _, stderr = run("export-onnx", "--model", LENET, "--weights", WEIGHTS, "-o", out, "--check",
                          "--tolerance", "1e-30")
    assert code == 1 and out.exists()
    assert "output 'prob' of the exported model differs from our forward by" in stderr
    assert "the model was written anyway" in stderr


@pytest.mark.skipif(not registered(), reason="export-onnx is not yet listed in pycaffe_dist/cli/__init__.py")
def test_the_real_command_line(tmp_path):
    out = tmp_path / "lenet.onnx"
    ok = dist_caffe("export-onnx", "--model", LENET, "--weights", WEIGHTS, "-o", out, "--check")
    assert ok.returncode == 0, ok.stderr
    assert out.exists() and "check: output prob" in ok.stdout
    bad = dist_caffe("export-onnx", "--model", LENET, "--weights", tmp_path / "missing.caffemodel", "-o", out)
    assert_clean_error(bad, "missing.caffemodel")
