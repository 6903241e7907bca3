"""pycaffe_dist.io.upgrade against the real Caffe: its upgrade tools' outputs on the whole zoo
(tests/fixtures/golden/upgrade) and the fixtures of Caffe's own test_upgrade_proto.cpp
(tests/fixtures/zoo/bvlc_upgrade_tests)."""
import difflib
import functools
import json
import re

import pytest

from pycaffe_dist.errors import PrototxtError, UpgradeError
from pycaffe_dist.io import upgrade
from pycaffe_dist.io.load import read_net_binary
from pycaffe_dist.io.prototxt import parse_text, read_text, to_text
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, ZOO

UPGRADE = GOLDEN / "upgrade"
MANIFEST = json.loads((UPGRADE / "manifest.json").read_text())
FILES = MANIFEST["files"]
CHECKED = sorted(p for p, e in FILES.items() if e["status"] in ("upgraded", "already_latest"))
PARSE_FAILED = sorted(p for p, e in FILES.items() if e["status"] == "parse_failed")
FIXED_POINTS = set(MANIFEST["verification"]["reupgrade_still_flagged_but_fixed_point"])
UPGRADE_TESTS = ZOO / "bvlc_upgrade_tests"
CONSOLIDATED = "bvlc/examples/mnist/lenet_consolidated_solver.prototxt"
NET, SOLVER = caffe_pb2.NetParameter, caffe_pb2.SolverParameter


@functools.lru_cache(maxsize=None)
def _serialized(path, kind):
    return read_text(path, (NET if kind == "net" else SOLVER)()).SerializeToString()


def load(path, kind="net"):
    """A fresh message parsed from a prototxt (each file is parsed once per session)."""
    return (NET if kind == "net" else SOLVER).FromString(_serialized(str(path), kind))


def zoo_input(rel):
    return load(ZOO / rel, FILES[rel]["kind"])


def golden_output(rel):
    return load(UPGRADE / FILES[rel]["output"], FILES[rel]["kind"])


def assert_same(got, expected):
    if got != expected:
        diff = difflib.unified_diff(to_text(expected).splitlines(True), to_text(got).splitlines(True),
                                    "expected", "got")
        pytest.fail("messages differ:\n" + "".join(diff))


def caffe_upgrade_lines(rel):
    """The lines upgrade_proto.cpp logged for this file, without glog's 'I upgrade_proto.cpp:NN] ' prefix."""
    return [re.sub(r"^[IWEF] upgrade_proto\.cpp:\d+\] ", "", line)
            for line in FILES[rel]["messages"] if " upgrade_proto.cpp:" in line]


def run_upgrade(msg, source, kind, nested_nets=False):
    if kind == "net":
        return upgrade.upgrade_net(msg, source)
    return upgrade.upgrade_solver(msg, source, nested_nets=nested_nets)


# ------------------------------------------------------------------------------------------------ golden zoo

def test_manifest_covers_the_statuses():
    assert len(CHECKED) == MANIFEST["counts"]["upgraded"] + MANIFEST["counts"]["already_latest"]
    assert len(PARSE_FAILED) == MANIFEST["counts"]["parse_failed"] == 1


@pytest.mark.parametrize("rel", CHECKED)
def test_golden_upgrade(rel):
    """Our upgrade of every zoo prototxt equals Caffe's tool output, with the same log lines."""
    kind = FILES[rel]["kind"]
    msg = zoo_input(rel)
    ok, messages = run_upgrade(msg, rel, kind)          # solvers: nested nets left alone, as Caffe's tool
    assert ok
    assert_same(msg, golden_output(rel))
    assert messages == caffe_upgrade_lines(rel)
    if FILES[rel]["status"] == "already_latest":
        assert not messages
        assert not (upgrade.net_needs_upgrade if kind == "net" else upgrade.solver_needs_upgrade)(zoo_input(rel))


@pytest.mark.parametrize("rel", PARSE_FAILED)
def test_golden_parse_failure(rel):
    line = int(re.search(r": (\d+):\d+: ", FILES[rel]["messages"][0]).group(1))
    with pytest.raises(PrototxtError) as info:
        read_text(ZOO / rel, SOLVER())
    assert info.value.line == line
    assert info.value.filename.endswith(rel)
    assert rel in str(info.value) and ":%d" % line in str(info.value)


@pytest.mark.parametrize("rel", CHECKED)
def test_upgraded_output_is_a_fixed_point(rel):
    kind = FILES[rel]["kind"]
    msg = golden_output(rel)
    ok, messages = run_upgrade(msg, rel, kind)
    assert ok
    assert_same(msg, golden_output(rel))
    if rel in FIXED_POINTS:      # BatchNorm with 3 param specs: still flagged, upgrading it again changes nothing
        assert upgrade.net_needs_upgrade(msg) and upgrade.net_needs_batchnorm_upgrade(msg)
        assert messages
    else:
        assert messages == []


def test_nested_nets_of_consolidated_solver():
    """Deliberate improvement: nets inside a solver are upgraded too (Caffe's tool keeps lenet's V1 layers)."""
    solver = zoo_input(CONSOLIDATED)
    ok, messages = upgrade.upgrade_solver(solver, CONSOLIDATED, nested_nets=True)
    assert ok
    golden = golden_output(CONSOLIDATED)
    assert len(golden.net_param.layers) > 0                  # Caffe left them as they were
    expected_net = NET()
    expected_net.CopyFrom(golden.net_param)
    assert upgrade.upgrade_net(expected_net, "x")[0]
    assert len(solver.net_param.layers) == 0 and len(solver.net_param.layer) > 0
    assert_same(solver.net_param, expected_net)
    solver.ClearField("net_param")
    golden.ClearField("net_param")
    assert_same(solver, golden)
    assert any("V1LayerParameter: %s (net_param)" % CONSOLIDATED in m for m in messages)


def test_nested_train_and_test_nets():
    v1_net = load(UPGRADE_TESTS / "NetUpgradeTest.TestSimple.expected_v1_proto.prototxt")
    v2_net = load(UPGRADE_TESTS / "NetUpgradeTest.TestSimple.expected_v2_proto.prototxt")
    solver = SOLVER(solver_type=SOLVER.NESTEROV)
    solver.train_net_param.CopyFrom(v1_net)
    solver.test_net_param.add().CopyFrom(v2_net)
    solver.test_net_param.add().CopyFrom(v1_net)
    ok, messages = upgrade.upgrade_solver(solver, "s.prototxt")
    assert ok and solver.type == "Nesterov" and not solver.HasField("solver_type")
    for net in (solver.train_net_param, *solver.test_net_param):
        assert_same(net, v2_net)
    assert any("(test_net_param[1])" in m for m in messages)
    assert not any("(test_net_param[0])" in m for m in messages)


# ------------------------------------------------------------------------------------------------ Caffe's own tests

def fixture(name):
    return load(UPGRADE_TESTS / (name + ".prototxt"))


@pytest.mark.parametrize("case", ["TestSimple", "TestTwoTops", "TestImageNet"])
def test_padding_layer_upgrade(case):
    padded = fixture("PaddingLayerUpgradeTest.%s.input_proto" % case)
    expected = fixture("PaddingLayerUpgradeTest.%s.expected_output_proto" % case)
    out = NET()
    upgrade.upgrade_v0_padding_layers(padded, out)
    assert_same(out, expected)
    again = NET()                                           # idempotent, as Caffe's test checks
    upgrade.upgrade_v0_padding_layers(out, again)
    assert_same(again, expected)


@pytest.mark.parametrize("case", ["TestSimple", "TestImageNet"])
def test_net_upgrade(case):
    v0 = fixture("NetUpgradeTest.%s.v0_proto" % case)
    v1 = fixture("NetUpgradeTest.%s.expected_v1_proto" % case)
    v2 = fixture("NetUpgradeTest.%s.expected_v2_proto" % case)
    out = NET()
    assert upgrade.upgrade_v0_net(v0, out)
    assert_same(out, v1)
    out = NET()
    assert upgrade.upgrade_v1_net(v1, out)
    assert_same(out, v2)
    ok, messages = upgrade.upgrade_net(v0, "v0.prototxt")
    assert ok
    assert_same(v0, v2)
    assert messages[0].endswith("V0LayerParameter: v0.prototxt") and len(messages) == 5


def test_all_v0_params():
    out, log = NET(), []
    assert upgrade.upgrade_v0_net(fixture("NetUpgradeTest.TestAllParams.input_proto"), out, log)
    assert log == []
    assert_same(out, fixture("NetUpgradeTest.TestAllParams.expected_output_proto"))


# ------------------------------------------------------------------------------------------------ errors

def net(text):
    return parse_text(text, NET())


def test_layer_and_layers_refused():
    mixed = net('layer { name: "a" type: "ReLU" } layers { name: "b" type: RELU }')
    with pytest.raises(UpgradeError, match="both 'layer' and 'layers'"):
        upgrade.upgrade_net(mixed)
    with pytest.raises(UpgradeError, match="both 'layer' and 'layers'"):
        upgrade.upgrade_v1_net(mixed, NET())
    v0_mixed = net('layer { name: "a" type: "ReLU" } layers { layer { name: "b" type: "relu" } }')
    with pytest.raises(UpgradeError, match="both 'layer' and 'layers'"):
        upgrade.upgrade_net(v0_mixed)


def test_unknown_v0_layer_type():
    v0 = net('layers { layer { name: "mystery" type: "frobnicate" } }')
    with pytest.raises(UpgradeError, match=r"'mystery'.*Unknown layer name: 'frobnicate'"):
        upgrade.upgrade_net(v0)


def test_unknown_v1_enum_from_binary():
    layer = caffe_pb2.V1LayerParameter(name="odd", bottom=["x"], top=["x"]).SerializeToString()
    layer += b"\x28\x63"                                 # field 5 (type), varint 99: no such LayerType
    raw = NET.FromString(b"\x12" + bytes([len(layer)]) + layer)   # NetParameter field 2 (layers)
    assert not raw.layers[0].HasField("type")             # protobuf keeps it as an unknown field
    with pytest.raises(UpgradeError, match=r"'odd'.*Unknown V1LayerParameter layer type: 99"):
        upgrade.upgrade_net(raw)
    with pytest.raises(UpgradeError, match="99"):
        upgrade.upgrade_v1_layer_type(99)
    assert upgrade.upgrade_v1_layer_type(39) == "Deconvolution"


def test_a_v1_type_of_the_wrong_wire_type_is_refused(tmp_path):
    """type as a length-delimited field, which protobuf sets aside as unknown: formatting its bytes as an enum
    number raised TypeError."""
    (tmp_path / "v1.caffemodel").write_bytes(bytes.fromhex("0a054c654e6574120a2205636f6e76312a0104"))
    with pytest.raises(UpgradeError, match=r"v1.caffemodel: cannot be upgraded from V1 layers: layers\[0\]: layer "
                       r"'conv1': field 'type' \(5\) has wire type 2, not a varint enum"):
        read_net_binary(tmp_path / "v1.caffemodel")


def test_solver_type_and_type_refused():
    solver = parse_text('solver_type: ADAM type: "Adam"', SOLVER())
    with pytest.raises(UpgradeError, match="cannot be both specified"):
        upgrade.upgrade_solver(solver)


def test_unknown_blob_input():
    v0 = net('layers { layer { name: "c" type: "conv" } bottom: "nowhere" top: "c" }')
    with pytest.raises(UpgradeError, match=r"Unknown blob input 'nowhere' to layer 'c'"):
        upgrade.upgrade_net(v0)


@pytest.mark.parametrize("consumer, match", [
    ('layers { layer { name: "r" type: "relu" } bottom: "p" top: "r" }', "non-convolutional"),
    ('layers { layer { name: "c" type: "conv" } bottom: "p" bottom: "data" top: "c" }', "single blob as input"),
])
def test_padding_checks(consumer, match):
    v0 = net('input: "data" layers { layer { name: "pad" type: "padding" pad: 1 } bottom: "data" top: "p" } '
             + consumer)
    with pytest.raises(UpgradeError, match=match):
        upgrade.upgrade_net(v0)


def test_unknown_v0_parameter_is_an_error_not_an_abort():
    v0 = net('input: "d" layers { layer { name: "r" type: "relu" num_output: 3 shuffle_images: true } '
             'bottom: "d" top: "r" }')
    ok, messages = upgrade.upgrade_net(v0, "old.prototxt")
    assert not ok
    assert "Unknown parameter num_output for layer type relu" in messages
    assert "Unknown parameter shuffle for layer type relu" in messages
    assert any(m.startswith("Warning: had one or more problems upgrading V0NetParameter") for m in messages)
    assert [l.type for l in v0.layer] == ["ReLU"] and not v0.layer[0].HasField("inner_product_param")


def test_v0_layer_left_in_v1_net():
    v0 = net('layers { layer { name: "r" type: "relu" } }')
    log = []
    assert not upgrade.upgrade_v1_net(v0, NET(), log)
    assert log == ["Input NetParameter has V0 layer -- ignoring.", "Upgrade of input layer 0 failed."]


# ------------------------------------------------------------------------------------------------ input, solver

def test_input_fields():
    n = net('input: "a" input: "b" input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 4 '
            'input_dim: 5 input_dim: 6 input_dim: 7 input_dim: 8 layer { name: "x" type: "ReLU" }')
    upgrade.upgrade_net_input(n)
    assert [l.name for l in n.layer] == ["input", "x"]
    assert list(n.layer[0].top) == ["a", "b"]
    assert [list(s.dim) for s in n.layer[0].input_param.shape] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert not n.input and not n.input_dim
    names_only = net('input: "a" layer { name: "x" type: "ReLU" }')   # legacy caffemodel: names are dropped
    upgrade.upgrade_net_input(names_only)
    assert [l.name for l in names_only.layer] == ["x"] and not names_only.input
    with pytest.raises(UpgradeError, match="input_dim"):
        upgrade.upgrade_net_input(net('input: "a" input_dim: 1 input_dim: 2'))


def test_solver_type_enum():
    for enum, name in [("SGD", "SGD"), ("NESTEROV", "Nesterov"), ("ADAGRAD", "AdaGrad"), ("RMSPROP", "RMSProp"),
                       ("ADADELTA", "AdaDelta"), ("ADAM", "Adam")]:
        solver = parse_text("solver_type: %s" % enum, SOLVER())
        assert upgrade.solver_needs_upgrade(solver)
        ok, messages = upgrade.upgrade_solver(solver, "s")
        assert ok and solver.type == name and not solver.HasField("solver_type") and len(messages) == 3
        assert not upgrade.solver_needs_upgrade(solver)


def test_default_snapshot_prefix(tmp_path):
    solver = SOLVER()
    assert upgrade.default_snapshot_prefix(solver, "examples/mnist/lenet_solver.prototxt") == \
        "examples/mnist/lenet_solver"
    assert upgrade.default_snapshot_prefix(SOLVER(), "a.b/solver") == "a.b/solver"
    into_dir = SOLVER(snapshot_prefix=str(tmp_path))
    assert upgrade.default_snapshot_prefix(into_dir, "x/lenet_solver.prototxt") == str(tmp_path / "lenet_solver")
    kept = SOLVER(snapshot_prefix=str(tmp_path / "snap"))
    assert upgrade.default_snapshot_prefix(kept, "x/lenet_solver.prototxt") == str(tmp_path / "snap")
