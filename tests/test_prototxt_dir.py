"""prototxt/: every ready-made net and solver parses with our schema, needs no upgrade, and says what the README
says: deploy nets build in both phases with the known parameter counts of their models; training nets read the
datumfiles the converters make and differ from Caffe's examples only in their data paths; solvers point at nets
in prototxt/ and keep Caffe's numbers."""
import logging
import os
import re
import struct

import numpy as np
import pytest

from pycaffe_dist.io import upgrade
from pycaffe_dist.blob.binaryproto import write_blob_file
from pycaffe_dist.io.load import describe_net_upgrade, read_net, read_solver
from pycaffe_dist.io.prototxt import read_text
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import REPO, ZOO

PROTOTXT = REPO / "prototxt"
FILES = sorted(p.name for p in PROTOTXT.glob("*.prototxt"))
SOLVERS = [f for f in FILES if "_solver" in f]
NETS = [f for f in FILES if f not in SOLVERS]

# name -> (input shape, output `prob` shape, number of parameters of all param blobs). The counts are the
# models' published sizes: CaffeNet 60,965,224; GoogLeNet 6,998,552 (main classifier only, as deploy);
# VGG-16 138,357,544; SqueezeNet v1.1 1,235,496; ResNet-50 25,610,269 = torchvision's 25,557,032 + Caffe's
# BatchNorm mean/variance/factor blobs (2 x 26,560 + 53) + the bias of conv1 (64), which Caffe's ResNet keeps.
DEPLOY = {
    "caffenet_deploy.prototxt": ((10, 3, 227, 227), (10, 1000), 60965224),
    "lenet_deploy.prototxt": ((64, 1, 28, 28), (64, 10), 431080),
    "googlenet_deploy.prototxt": ((10, 3, 224, 224), (10, 1000), 6998552),
    "vgg16_deploy.prototxt": ((10, 3, 224, 224), (10, 1000), 138357544),
    "resnet50_deploy.prototxt": ((1, 3, 224, 224), (1, 1000), 25610269),
    "squeezenet_v1.1_deploy.prototxt": ((10, 3, 227, 227), (10, 1000, 1, 1), 1235496),
}

# training net -> (Caffe's original in tests/fixtures/zoo, {phase: (source, batch_size)}, mean_file, datum C x H x W)
TRAINING = {
    "lenet_train_test.prototxt": ("bvlc/examples/mnist/lenet_train_test.prototxt",
                                  {caffe_pb2.TRAIN: ("data/fashion-mnist/train.datumfile", 64),
                                   caffe_pb2.TEST: ("data/fashion-mnist/test.datumfile", 100)}, "", (1, 28, 28)),
    "cifar10_quick_train_test.prototxt": ("bvlc/examples/cifar10/cifar10_quick_train_test.prototxt",
                                          {caffe_pb2.TRAIN: ("data/cifar10/train.datumfile", 100),
                                           caffe_pb2.TEST: ("data/cifar10/test.datumfile", 100)},
                                          "data/cifar10/mean.binaryproto", (3, 32, 32)),
    "cifar10_full_train_test.prototxt": ("bvlc/examples/cifar10/cifar10_full_train_test.prototxt",
                                         {caffe_pb2.TRAIN: ("data/cifar10/train.datumfile", 100),
                                          caffe_pb2.TEST: ("data/cifar10/test.datumfile", 100)},
                                         "data/cifar10/mean.binaryproto", (3, 32, 32)),
}

# solver -> (Caffe's original in tests/fixtures/zoo, net, snapshot_prefix)
SOLVER_SOURCES = {
    "lenet_solver.prototxt": ("bvlc/examples/mnist/lenet_solver.prototxt", "lenet_train_test.prototxt", "out/lenet"),
    "cifar10_quick_solver.prototxt": ("bvlc/examples/cifar10/cifar10_quick_solver.prototxt",
                                      "cifar10_quick_train_test.prototxt", "out/cifar10_quick"),
    "cifar10_quick_solver_lr1.prototxt": ("bvlc/examples/cifar10/cifar10_quick_solver_lr1.prototxt",
                                          "cifar10_quick_train_test.prototxt", "out/cifar10_quick"),
    "cifar10_full_solver.prototxt": ("bvlc/examples/cifar10/cifar10_full_solver.prototxt",
                                     "cifar10_full_train_test.prototxt", "out/cifar10_full"),
    "cifar10_full_solver_lr1.prototxt": ("bvlc/examples/cifar10/cifar10_full_solver_lr1.prototxt",
                                         "cifar10_full_train_test.prototxt", "out/cifar10_full"),
    "cifar10_full_solver_lr2.prototxt": ("bvlc/examples/cifar10/cifar10_full_solver_lr2.prototxt",
                                         "cifar10_full_train_test.prototxt", "out/cifar10_full"),
}


def zoo_file(rel):
    path = ZOO / rel
    if not path.is_file():
        pytest.fail("tests/fixtures/zoo/%s is missing" % rel)
    return path


def test_the_directory_holds_exactly_the_listed_files():
    assert NETS == sorted(list(DEPLOY) + list(TRAINING))
    assert SOLVERS == sorted(SOLVER_SOURCES)


def test_readme_has_one_line_per_file():
    readme = (PROTOTXT / "README.md").read_text()
    listed = re.findall(r"^- `([^`]+)`:", readme, flags=re.M)
    assert sorted(listed) == FILES


@pytest.mark.parametrize("name", NETS)
def test_net_parses_and_needs_no_upgrade(name, caplog):
    path = PROTOTXT / name
    assert describe_net_upgrade(read_text(path, caffe_pb2.NetParameter())) == []
    with caplog.at_level(logging.WARNING, logger="pycaffe_dist"):
        read_net(path)
    assert caplog.records == []


@pytest.mark.parametrize("name", SOLVERS)
def test_solver_parses_and_needs_no_upgrade(name, caplog):
    path = PROTOTXT / name
    solver = read_text(path, caffe_pb2.SolverParameter())
    assert not upgrade.solver_needs_upgrade(solver)
    with caplog.at_level(logging.WARNING, logger="pycaffe_dist"):
        read_solver(path)
    assert caplog.records == []


@pytest.mark.parametrize("name", sorted(DEPLOY))
@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
def test_deploy_net_builds_with_its_shapes_and_parameter_count(name, phase):
    in_shape, out_shape, n_params = DEPLOY[name]
    net = Net(read_net(PROTOTXT / name), phase=phase, fill_params=False)
    assert net.blob_by_name("data").shape == in_shape
    assert {n: net.blob_by_name(n).shape for n in net.outputs} == {"prob": out_shape}
    assert sum(int(np.prod(b.shape)) for b in net.learnable_params) == n_params


def data_layers(param):
    return {layer.include[0].phase: layer for layer in param.layer if layer.type == "Data"}


@pytest.mark.parametrize("name", sorted(TRAINING))
def test_training_net_reads_the_converted_datumfiles(name):
    _, sources, mean_file, _ = TRAINING[name]
    layers = data_layers(read_net(PROTOTXT / name))
    assert {phase: (l.data_param.source, l.data_param.batch_size) for phase, l in layers.items()} == sources
    for layer in layers.values():
        assert layer.data_param.backend == caffe_pb2.DataParameter.DATUMFILE
        assert layer.transform_param.mean_file == mean_file
        assert not layer.transform_param.mirror and not layer.transform_param.crop_size


@pytest.mark.parametrize("name", sorted(TRAINING))
def test_training_net_is_caffes_example_but_for_its_data_paths(name):
    """Only source, backend and mean_file may differ from BVLC's examples (same layers, fillers, lr_mults)."""
    ours = read_net(PROTOTXT / name)
    caffe = read_net(zoo_file(TRAINING[name][0]))
    for param in (ours, caffe):
        for layer in data_layers(param).values():
            layer.data_param.ClearField("source")
            layer.data_param.ClearField("backend")
            layer.transform_param.ClearField("mean_file")
    assert ours == caffe


def write_datumfile(path, shape, count):
    """`count` random records in the datumfile layout (uint32 LE record size, key size, key, value size, value)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    with open(path, "wb") as f:
        for k in range(count):
            key = b"%08d" % k
            value = caffe_pb2.Datum(channels=shape[0], height=shape[1], width=shape[2], label=k % 10,
                                    data=rng.integers(0, 256, shape, dtype=np.uint8).tobytes()).SerializeToString()
            f.write(struct.pack("<II", 8 + len(key) + len(value), len(key)) + key
                    + struct.pack("<I", len(value)) + value)


@pytest.mark.parametrize("name", sorted(TRAINING))
@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
def test_training_net_builds_and_runs_on_tiny_datumfiles(name, phase, tmp_path, monkeypatch):
    """The paths are relative to the repo root, so a run from tmp_path reads tmp_path/data/..."""
    _, sources, mean_file, shape = TRAINING[name]
    param = read_net(PROTOTXT / name)
    for source, _ in sources.values():
        write_datumfile(tmp_path / source, shape, 3)
    if mean_file:
        write_blob_file(tmp_path / mean_file, np.full((1,) + shape, 127.0, np.float32))
    monkeypatch.chdir(tmp_path)
    net = Net(param, phase=phase, fill_params=True)
    batch = sources[phase][1]
    assert net.blob_by_name("data").shape == (batch,) + shape
    net.forward_from_to()
    outputs = {n: net.blob_by_name(n) for n in net.outputs}
    assert sorted(outputs) == (["loss"] if phase == caffe_pb2.TRAIN else ["accuracy", "loss"])
    assert np.isfinite(outputs["loss"].data) and outputs["loss"].data > 0
    # The labels cycle through the 3 records: label k % 3 of record k, wrapped around the batch.
    np.testing.assert_array_equal(net.blob_by_name("label").data, np.arange(batch) % 3)


@pytest.mark.parametrize("name", SOLVERS)
def test_solver_points_at_a_net_here_and_keeps_caffes_numbers(name):
    """Only net, snapshot_prefix and solver_mode differ from BVLC's example solver."""
    source, net, prefix = SOLVER_SOURCES[name]
    ours = read_solver(PROTOTXT / name)
    assert ours.net == "prototxt/" + net and (REPO / ours.net).is_file()
    assert ours.snapshot_prefix == prefix and ours.solver_mode == caffe_pb2.SolverParameter.CPU
    caffe = read_text(zoo_file(source), caffe_pb2.SolverParameter())
    caffe.net, caffe.snapshot_prefix, caffe.solver_mode = ours.net, ours.snapshot_prefix, ours.solver_mode
    assert read_text(PROTOTXT / name, caffe_pb2.SolverParameter()) == caffe


def test_lenet_solver_is_caffes_lenet_solver():
    s = read_solver(PROTOTXT / "lenet_solver.prototxt")
    assert (s.base_lr, s.momentum, s.weight_decay, s.lr_policy, s.gamma, s.power) == \
        (pytest.approx(0.01), pytest.approx(0.9), pytest.approx(5e-4), "inv", pytest.approx(1e-4), 0.75)
    assert (list(s.test_iter), s.test_interval, s.display, s.max_iter, s.snapshot) == ([100], 500, 100, 10000, 5000)
    test_batch = data_layers(read_net(REPO / s.net))[caffe_pb2.TEST].data_param.batch_size
    assert s.test_iter[0] * test_batch == 10000           # the whole Fashion-MNIST test set


def test_paths_are_relative_to_the_repo_root():
    for name in FILES:
        text = (PROTOTXT / name).read_text()
        for path in re.findall(r'^\s*(?:source|mean_file|net|snapshot_prefix): "([^"]*)"', text, flags=re.M):
            assert not os.path.isabs(path) and path.split("/")[0] in ("data", "prototxt", "out"), (name, path)
