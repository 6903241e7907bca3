"""Weights files (io/caffemodel.py): binary and HDF5, and damaged HDF5 files refused with the file named."""
import textwrap

import h5py
import numpy as np
import pytest

from pycaffe_dist.errors import ModelFileError
from pycaffe_dist.io.caffemodel import load_weights, write_model
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2


def small_net():
    return Net(parse_text(textwrap.dedent("""
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }
        layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 3 } }"""),
        caffe_pb2.NetParameter()), phase=caffe_pb2.TEST)


@pytest.mark.parametrize("hdf5", [False, True])
def test_round_trip(tmp_path, hdf5):
    net = small_net()
    net.layers[1].blobs[0].data[...] = np.arange(6).reshape(3, 2)
    write_model(net, tmp_path / "w", hdf5=hdf5)
    other = small_net()
    load_weights(other, tmp_path / "w")
    np.testing.assert_array_equal(other.layers[1].blobs[0].data, np.arange(6).reshape(3, 2))


def test_the_hdf5_magic_without_hdf5_names_the_file(tmp_path):
    """h5py raised OSError (bad superblock)."""
    (tmp_path / "h.caffemodel").write_bytes(bytes.fromhex("894844460d0a1a0a2000"))
    with pytest.raises(ModelFileError, match=r"h.caffemodel: is not a readable HDF5 file"):
        load_weights(small_net(), tmp_path / "h.caffemodel")


def test_damaged_hdf5_models_name_the_file_and_the_object(tmp_path):
    net = small_net()
    path = tmp_path / "w.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/ip/0", data=np.zeros((3, 2), np.float32))
        f.create_dataset("data/ip/1", data=np.array([b"abc"] * 3))
    with pytest.raises(ModelFileError, match=r"w.h5: layer 'ip' blob 1: has datatype \|S3; expected numbers"):
        load_weights(net, path)
    with h5py.File(path, "w") as f:
        f.create_dataset("data/ip/0", data=np.zeros((3, 5), np.float32))
    with pytest.raises(ModelFileError, match=r"cannot load blob 0 of layer 'ip': shape mismatch"):
        load_weights(net, path)
    with h5py.File(path, "w") as f:
        f.create_dataset("data/ip/0", shape=(3, 2), dtype=np.float32, chunks=(1, 1), fillvalue=2)  # none stored
        f.create_dataset("data/ip/1", data=np.ones(3, np.float32))
        f["data/loop"] = f["data"]                       # a group that holds itself: walked once
    load_weights(net, path)
    assert (net.layers[1].blobs[0].data == 2).all()
    with h5py.File(path, "w") as f:
        f["data"] = np.zeros(3)
    with pytest.raises(ModelFileError, match=r"w.h5: is not a Caffe HDF5 model: it has no 'data' group"):
        load_weights(net, path)


def test_a_file_name_with_a_nul_byte():
    """A solver state's learned_net may hold one: open() raised ValueError."""
    with pytest.raises(ModelFileError, match=r"'w\\x00.caffemodel': cannot read: embedded null byte"):
        load_weights(small_net(), "w\0.caffemodel")
