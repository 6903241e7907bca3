"""HDF5 reading (data/hdf5.py): h5py's errors on damaged files become ours, datasets are checked from their header
before they are read."""
import h5py
import numpy as np
import pytest

from pycaffe_dist.data import hdf5
from pycaffe_dist.errors import DataError, ModelFileError


def test_files_that_are_not_hdf5(tmp_path):
    with pytest.raises(DataError, match=r"none.h5: no such file"):
        hdf5.open_file(tmp_path / "none.h5")
    (tmp_path / "bad.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    with pytest.raises(ModelFileError, match=r"bad.h5: is not a readable HDF5 file"):
        hdf5.open_file(tmp_path / "bad.h5", ModelFileError)
    with pytest.raises(DataError, match=r"is not a readable HDF5 file"):
        hdf5.open_file(tmp_path)                          # a directory


def test_datasets_are_checked_before_they_are_read(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f["ints"] = np.arange(6, dtype=np.int16).reshape(2, 3)
        f["text"] = np.array([b"x", b"y"])
        f["null"] = h5py.Empty("f4")
        f.create_dataset("unwritten", shape=(2000, 1000), dtype=np.float32, chunks=(10, 10))
        f.create_dataset("huge", shape=(2 ** 20, 2 ** 12), dtype=np.uint8, chunks=(1, 1))
        f.create_group("group")
    with hdf5.open_file(path) as f:
        got = hdf5.read_array(f["ints"], path, "ints", dtype=np.float32)
        assert got.dtype == np.float32 and got.tolist() == [[0, 1, 2], [3, 4, 5]]
        with pytest.raises(DataError, match=r"f.h5: text: has datatype \|S1; expected numbers"):
            hdf5.read_array(f["text"], path, "text")
        with pytest.raises(DataError, match=r"null: is an empty \(null\) dataset"):
            hdf5.read_array(f["null"], path, "null")
        with pytest.raises(DataError, match=r"group: is a group, expected a dataset"):
            hdf5.read_array(f["group"], path, "group")
        # 8 MB of fill values from a file of a few KB: HDF5 would allocate and fill them
        with pytest.raises(DataError, match=r"unwritten: declares shape \(2000, 1000\) \(8000000 bytes\) but takes "
                           r"only 0 bytes in the file"):
            hdf5.read_array(f["unwritten"], path, "unwritten")
        with pytest.raises(DataError, match=r"huge: has shape \(1048576, 4096\), 4294967296 values: more than a "
                           r"Caffe blob holds"):
            hdf5.read_array(f["huge"], path, "huge")
        assert hdf5.get(f, "missing", path) is None


def test_strings(tmp_path):
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f["name"] = np.array(b"net.caffemodel\0\0")
        f["bad"] = np.array(b"\xffnet")
        f["number"] = np.array(3)
    with hdf5.open_file(path) as f:
        assert hdf5.read_string(f["name"], path, "name") == "net.caffemodel"
        with pytest.raises(DataError, match=r"s.h5: bad: is not UTF-8 \(byte 0xff at position 0\)"):
            hdf5.read_string(f["bad"], path, "bad")
        with pytest.raises(DataError, match=r"number: expected one string"):
            hdf5.read_string(f["number"], path, "number")


def test_layer_groups_walks_each_group_once(tmp_path):
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f["data/conv1/0"] = np.zeros(2)
        f["data/fire2/squeeze/0"] = np.zeros(2)          # a layer named "fire2/squeeze"
        f.create_group("data/empty")
        f["data/fire2/back"] = f["data"]                  # hard links can make a group its own descendant
        f["data"].create_group(b"\xfcber")                # h5py gives a name that is not UTF-8 as bytes
    with hdf5.open_file(path) as f:
        assert sorted(hdf5.layer_groups(f["data"], path)) == ["conv1", "empty", "fire2/squeeze"]
