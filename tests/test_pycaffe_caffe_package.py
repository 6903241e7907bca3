"""`import caffe`: Caffe's module layout and every name of Caffe's pycaffe, each the project's own object; errors
that are the built-in types pycaffe raises; Net.save_hdf5/load_hdf5; the solver count, rank and multiprocess
settings of a Caffe built without NCCL."""
import subprocess
import sys

import h5py
import numpy as np
import pytest

import caffe
import pycaffe_dist
from tests.conftest import REPO

# python/caffe/__init__.py's names (BVLC 9b89154), and the submodules a pycaffe script imports.
CAFFE_NAMES = ["Net", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver", "AdamSolver",
               "NCCL", "Timer", "init_log", "log", "set_mode_cpu", "set_mode_gpu", "set_device", "Layer", "get_solver",
               "layer_type_list", "set_random_seed", "solver_count", "set_solver_count", "solver_rank",
               "set_solver_rank", "set_multiprocess", "has_nccl", "__version__", "TRAIN", "TEST", "io", "layers",
               "params", "NetSpec", "to_proto", "Classifier", "Detector"]
SUBMODULES = ["io", "net_spec", "pycaffe", "coord_map", "draw", "classifier", "detector", "proto.caffe_pb2"]

NET = """name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 }
                            bias_filler { type: "constant" value: 0.5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
"""


@pytest.fixture
def net_file(tmp_path):
    path = tmp_path / "tiny.prototxt"
    path.write_text(NET)
    return str(path)


def test_every_name_of_caffes_init_is_there():
    missing = [name for name in CAFFE_NAMES if not hasattr(caffe, name)]
    assert not missing
    assert caffe.Net is pycaffe_dist.Net and caffe.TRAIN == 0 and caffe.TEST == 1


@pytest.mark.parametrize("name", SUBMODULES)
def test_submodules_are_the_projects_own(name):
    import importlib
    ours = importlib.import_module("pycaffe_dist." + name)
    assert importlib.import_module("caffe." + name) is ours


def test_a_message_of_caffe_proto_is_one_of_ours():
    from caffe.proto import caffe_pb2
    message = caffe_pb2.NetParameter(name="x")
    assert isinstance(message, pycaffe_dist.caffe_pb2.NetParameter)
    # The net_spec layers are Caffe's NetSpec helpers, not the layer library's package.
    assert caffe.layers.Convolution(num_output=1).fn.type_name == "Convolution"


def test_a_script_that_imports_caffe_runs_in_a_fresh_interpreter(tmp_path, net_file):
    script = tmp_path / "script.py"
    script.write_text("import caffe, caffe.draw\nfrom caffe.coord_map import crop\n"
                      "net = caffe.Net(%r, caffe.TEST)\nprint(sorted(net.params), net.blobs['ip'].data.shape)\n"
                      % net_file)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['conv', 'ip'] (2, 3)"


def test_errors_are_the_builtin_types_pycaffe_raises(tmp_path, net_file):
    blob = caffe.proto.caffe_pb2.BlobProto()
    blob.data.extend([0.0] * 4)
    with pytest.raises(ValueError, match="shape"):
        caffe.io.blobproto_to_array(blob)
    with pytest.raises(FileNotFoundError, match="nope.prototxt: no such file"):      # pycaffe: IOError
        caffe.Net(str(tmp_path / "nope.prototxt"), caffe.TEST)
    with pytest.raises(FileNotFoundError, match="nope.caffemodel: no such file"):
        caffe.Net(net_file, caffe.TEST, weights=str(tmp_path / "nope.caffemodel"))
    bad = tmp_path / "bad.prototxt"
    bad.write_text("layer { name: 'x' type: 'ReLU' bottom: 'nothing' top: 'x' }")
    with pytest.raises(ValueError, match="nothing"):
        caffe.Net(str(bad), caffe.TEST)
    bad.write_text("layer { name: ")
    with pytest.raises(ValueError, match="bad.prototxt:1"):
        caffe.Net(str(bad), caffe.TEST)
    assert issubclass(pycaffe_dist.errors.DeviceError, RuntimeError)
    assert issubclass(pycaffe_dist.errors.DivergedError, FloatingPointError)


def test_save_hdf5_then_load_hdf5_gives_the_same_weights(tmp_path, net_file):
    net = caffe.Net(net_file, caffe.TEST)
    path = str(tmp_path / "w.h5")
    net.save_hdf5(path)
    with h5py.File(path, "r") as f:       # Caffe's Net::ToHDF5: data/<layer>/<blob index>, every layer, no diffs
        assert sorted(f["data"]) == ["conv", "data", "ip"] and not len(f["data/data"]) and "diff" not in f
        assert sorted(f["data/conv"]) == ["0", "1"]
        np.testing.assert_array_equal(f["data/ip/0"][()], net.params["ip"][0].data)
    other = caffe.Net(net_file, caffe.TEST)
    assert not np.array_equal(other.params["ip"][0].data, net.params["ip"][0].data)
    other.load_hdf5(path)
    for name in net.params:
        for mine, theirs in zip(net.params[name], other.params[name]):
            np.testing.assert_array_equal(mine.data, theirs.data)


def test_load_hdf5_refuses_a_binary_caffemodel(tmp_path, net_file):
    net = caffe.Net(net_file, caffe.TEST)
    path = str(tmp_path / "w.caffemodel")
    net.save(path)
    with pytest.raises(ValueError, match="w.caffemodel: not an HDF5 file"):
        net.load_hdf5(path)


def test_solver_count_rank_and_multiprocess_keep_what_is_set():
    assert (caffe.solver_count(), caffe.solver_rank()) == (1, 0)
    try:
        caffe.set_solver_count(4)
        caffe.set_solver_rank(3)
        caffe.set_multiprocess(True)
        assert (caffe.solver_count(), caffe.solver_rank()) == (4, 3)
    finally:
        caffe.set_solver_count(1)
        caffe.set_solver_rank(0)
        caffe.set_multiprocess(False)
    assert not caffe.has_nccl()
