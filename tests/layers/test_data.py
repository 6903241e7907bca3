"""The data layers of pycaffe_dist/layers/data.py: Input, DummyData, MemoryData, Data (LMDB from Caffe's
convert_mnist_data, datumfile), ImageData, HDF5Data and HDF5Output."""
import struct
import textwrap

import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.errors import DataError, NetError
from pycaffe_dist.io.load import read_net
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, load_npz

SOLVER_CASE = GOLDEN / "solvers" / "sgd_momentum"


def net_from_text(text, phase=caffe_pb2.TRAIN):
    return Net(parse_text(textwrap.dedent(text), caffe_pb2.NetParameter()), phase=phase)


def test_data_layer_reads_shape_from_caffe_written_lmdb(monkeypatch):
    monkeypatch.chdir(SOLVER_CASE)               # the net names its source relative to the case dir
    net = Net(read_net("net.prototxt"), phase=caffe_pb2.TRAIN)
    assert net.blob_by_name("data").shape == (32, 1, 4, 4) and net.blob_by_name("label").shape == (32,)


def write_datumfile(path, images, labels):
    with open(path, "wb") as f:
        for i, (image, label) in enumerate(zip(images, labels)):
            datum = caffe_pb2.Datum(channels=image.shape[0], height=image.shape[1], width=image.shape[2],
                                    data=image.tobytes(), label=int(label))
            key, value = b"%08d" % i, datum.SerializeToString()
            f.write(struct.pack("<I", 8 + len(key) + len(value)) + struct.pack("<I", len(key)) + key +
                    struct.pack("<I", len(value)) + value)


DATUMFILE_NET = """
    layer { name: "d" type: "Data" top: "data" top: "label"
            data_param { source: "%s" batch_size: 5 backend: DATUMFILE } transform_param { crop_size: 3 } }
"""


def test_datumfile_source_and_crop(tmp_path):
    records = load_npz(SOLVER_CASE / "records.npz")
    images = next(v for k, v in records.items() if v.ndim >= 3)
    images = images.reshape(len(images), 1, 4, 4)
    write_datumfile(tmp_path / "train.datums", images[:10], np.arange(10))
    net = net_from_text(DATUMFILE_NET % (tmp_path / "train.datums"))
    assert net.blob_by_name("data").shape == (5, 1, 3, 3)
    data = (tmp_path / "train.datums").read_bytes()
    (tmp_path / "cut.datums").write_bytes(data[:30])
    with pytest.raises(DataError, match=r"cut.datums: record 0 at byte 0 is truncated"):
        net_from_text(DATUMFILE_NET % (tmp_path / "cut.datums"))
    (tmp_path / "junk.datums").write_bytes(b"\xff\xff\xff\xff" * 4)
    with pytest.raises(DataError, match="exceeds 104857600; not a datumfile"):
        net_from_text(DATUMFILE_NET % (tmp_path / "junk.datums"))


def test_missing_source_names_layer_and_path():
    with pytest.raises(DataError, match="layer 'd' \\(Data\\): cannot open data source '/no/such/db'"):
        net_from_text(DATUMFILE_NET % "/no/such/db")


def test_dummy_data_shapes_and_refill():
    common.set_random_seed(1)
    net = net_from_text("""
        layer { name: "dummy" type: "DummyData" top: "a" top: "b"
                dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 4 }
                                   data_filler { type: "gaussian" } data_filler { type: "constant" value: 7 } } }
    """)
    a, b = net.blob_by_name("a"), net.blob_by_name("b")
    assert a.shape == (2, 3) and b.data.tolist() == [7.0] * 4
    assert not a.data.any()      # Caffe fills only the constant tops at setup; random ones at each forward
    net.forward_from_to()
    first = a.data.copy()
    net.forward_from_to()
    assert first.any() and not np.array_equal(first, a.data) and b.data.tolist() == [7.0] * 4
    a.reshape(5, 1)              # dummy_data_layer.hpp: Reshape does nothing, so a user's shape stays
    net.forward_from_to()
    assert a.shape == (5, 1) and a.data.all()
    legacy = net_from_text('layer { name: "d" type: "DummyData" top: "x" '
                           'dummy_data_param { num: 2 channels: 3 height: 4 width: 5 } }')
    assert legacy.blob_by_name("x").shape == (2, 3, 4, 5)
    with pytest.raises(NetError, match="both shape and legacy fields"):
        net_from_text('layer { name: "d" type: "DummyData" top: "x" dummy_data_param { num: 2 shape { dim: 1 } } }')
    # every legacy field once or once per top; without them, a shape once or once per top
    with pytest.raises(NetError, match="must specify 'height' once, or once per top blob \\(1\\); specified 0"):
        net_from_text('layer { name: "d" type: "DummyData" top: "x" dummy_data_param { num: 2 channels: 3 } }')
    with pytest.raises(NetError, match="must specify 'num' once, or once per top blob \\(2\\); specified 3"):
        net_from_text('layer { name: "d" type: "DummyData" top: "x" top: "y" dummy_data_param { '
                      'num: 1 num: 2 num: 3 channels: 1 height: 1 width: 1 } }')
    with pytest.raises(NetError, match="must specify 'shape' once, or once per top blob \\(1\\); specified 0"):
        net_from_text('layer { name: "d" type: "DummyData" top: "x" dummy_data_param { data_filler { value: 1 } } }')


def test_input_shape_count_rule():
    with pytest.raises(NetError, match="must specify 'shape' once, once per top blob, or not at all"):
        net_from_text('layer { name: "i" type: "Input" top: "a" top: "b" top: "c" '
                      'input_param { shape { dim: 1 } shape { dim: 2 } } }')
    net = net_from_text('layer { name: "i" type: "Input" top: "a" top: "b" input_param { shape { dim: 3 } } }')
    assert net.blob_by_name("b").shape == (3,)


def test_memory_data_shapes():
    net = net_from_text('layer { name: "m" type: "MemoryData" top: "data" top: "label" '
                        'memory_data_param { batch_size: 8 channels: 3 height: 5 width: 6 } }')
    assert net.blob_by_name("data").shape == (8, 3, 5, 6) and net.blob_by_name("label").shape == (8,)


# --- forward: batches as Caffe's data layers produce them -------------------------------------------------------

def golden_records():
    records = load_npz(SOLVER_CASE / "records.npz")
    return records["images"], records["labels"]


def test_data_layer_reads_caffe_lmdb_in_order_with_wrap_around(monkeypatch):
    monkeypatch.chdir(SOLVER_CASE)
    images, labels = golden_records()
    net = Net(read_net("net.prototxt"), phase=caffe_pb2.TRAIN)
    for k in range(10):                                  # 10 batches of 32 over 256 records: wraps once
        net.forward_from_to()
        rows = (32 * k + np.arange(32)) % 256
        np.testing.assert_array_equal(net.blob_by_name("data").data,
                                      images[rows].astype(np.float32) * np.float32(0.00390625))
        np.testing.assert_array_equal(net.blob_by_name("label").data, labels[rows])


def test_train_data_layer_reads_its_shard_and_test_reads_all(tmp_path):
    images = np.arange(12 * 4, dtype=np.uint8).reshape(12, 1, 2, 2)
    write_datumfile(tmp_path / "d.datums", images, np.arange(12))
    text = """layer { name: "d" type: "Data" top: "data" top: "label"
                      data_param { source: "%s" batch_size: 4 backend: DATUMFILE } }""" % (tmp_path / "d.datums")
    seen = []
    try:
        for shard in range(3):
            common.set_data_shard(shard, 3)
            net = net_from_text(text)
            got = []
            for _ in range(2):                           # 2 batches of 4 from a shard of 4 records: wraps once
                net.forward_from_to()
                got.append(net.blob_by_name("label").data.copy())
            assert got[0].tolist() == list(range(shard, 12, 3)) and np.array_equal(got[0], got[1])
            seen += got[0].tolist()
            test_net = net_from_text(text, phase=caffe_pb2.TEST)
            test_net.forward_from_to()
            assert test_net.blob_by_name("label").data.tolist() == [0, 1, 2, 3]
    finally:
        common.set_data_shard(0, 1)
    assert sorted(seen) == list(range(12))               # disjoint shards that cover every record


def test_corrupt_record_raises_at_its_batch_and_truncation_at_setup(tmp_path):
    images = np.zeros((6, 1, 2, 2), np.uint8)
    write_datumfile(tmp_path / "d.datums", images, np.arange(6))
    data = bytearray((tmp_path / "d.datums").read_bytes())
    record = len(data) // 6
    data[4 * record + 20:5 * record] = b"\xff" * (record - 20)   # record 4's value is no Datum any more
    (tmp_path / "d.datums").write_bytes(bytes(data))
    text = """layer { name: "d" type: "Data" top: "data" top: "label"
        data_param { source: "%s" batch_size: 3 backend: DATUMFILE } }"""
    net = net_from_text(text % (tmp_path / "d.datums"))
    net.forward_from_to()
    assert net.blob_by_name("label").data.tolist() == [0, 1, 2]
    with pytest.raises(DataError, match=r"layer 'd' \(Data\): record b'00000004': record is not a Caffe Datum"):
        net.forward_from_to()
    (tmp_path / "cut.datums").write_bytes(bytes(data[:-3]))   # the last record loses its tail
    with pytest.raises(DataError, match=r"cut.datums: record 5 at byte \d+ is truncated"):
        net_from_text(text % (tmp_path / "cut.datums"))


def test_memory_data_serves_batches_in_turn():
    net = net_from_text('layer { name: "m" type: "MemoryData" top: "data" top: "label" '
                        'memory_data_param { batch_size: 2 channels: 1 height: 1 width: 3 } }')
    with pytest.raises(NetError, match="call net.set_input_arrays"):
        net.forward_from_to()
    data = np.arange(12, dtype=np.float32).reshape(4, 1, 1, 3)
    net.set_input_arrays(data, np.array([5, 6, 7, 8], np.float32))
    for rows in ([0, 1], [2, 3], [0, 1]):
        net.forward_from_to()
        np.testing.assert_array_equal(net.blob_by_name("data").data, data[rows])
        # Caffe's Forward_cpu reshapes the label top to (batch, 1, 1, 1); only its setup shape is (batch,)
        assert net.blob_by_name("label").shape == (2, 1, 1, 1)
        assert net.blob_by_name("label").data.reshape(-1).tolist() == [5 + r for r in rows]
    with pytest.raises(NetError, match=r"number of images \(3\) must be a positive multiple of batch_size \(2\)"):
        net.set_input_arrays(data[:3], np.zeros(3))


def test_image_data_reads_list_resizes_and_labels(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(5)
    pixels = [rng.integers(0, 256, (6, 7, 3), dtype=np.uint8) for _ in range(3)]
    for i, rgb in enumerate(pixels):
        Image.fromarray(rgb).save(tmp_path / ("im%d.png" % i))
    (tmp_path / "list.txt").write_text("".join("im%d.png %d\n" % (i, 10 + i) for i in range(3)))
    net = net_from_text("""layer { name: "img" type: "ImageData" top: "data" top: "label"
        image_data_param { source: "%s" root_folder: "%s/" batch_size: 2 } }""" % (tmp_path / "list.txt", tmp_path))
    assert net.blob_by_name("data").shape == (2, 3, 6, 7)
    net.forward_from_to()
    net.forward_from_to()                                  # images 2, 0: wraps around the list
    assert net.blob_by_name("label").data.tolist() == [12, 10]
    bgr = pixels[2][:, :, ::-1].transpose(2, 0, 1)          # Caffe's OpenCV path gives BGR planes
    np.testing.assert_array_equal(net.blob_by_name("data").data[0], bgr)
    gray = net_from_text("""layer { name: "img" type: "ImageData" top: "data" top: "label"
        image_data_param { source: "%s" root_folder: "%s/" batch_size: 3 is_color: false new_height: 4
                           new_width: 5 } }""" % (tmp_path / "list.txt", tmp_path))
    gray.forward_from_to()
    assert gray.blob_by_name("data").shape == (3, 1, 4, 5)
    (tmp_path / "bad.txt").write_text("im0.png 1\nim1.png one\n")
    with pytest.raises(DataError, match=r"bad.txt:2: the label 'one' is not an integer"):
        net_from_text("""layer { name: "img" type: "ImageData" top: "data" top: "label"
            image_data_param { source: "%s" batch_size: 1 } }""" % (tmp_path / "bad.txt"))


def test_hdf5_data_batches_wrap_over_rows_and_files(tmp_path):
    import h5py
    for i, rows in enumerate((3, 2)):
        with h5py.File(tmp_path / ("f%d.h5" % i), "w") as h5:
            h5["data"] = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + 100 * i
            h5["label"] = np.arange(rows, dtype=np.float32) + 10 * i
    (tmp_path / "list.txt").write_text("%s\n%s\n" % (tmp_path / "f0.h5", tmp_path / "f1.h5"))
    net = net_from_text("""layer { name: "h" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param { source: "%s" batch_size: 4 } }""" % (tmp_path / "list.txt"))
    net.forward_from_to()
    assert net.blob_by_name("label").data.tolist() == [0, 1, 2, 10]
    np.testing.assert_array_equal(net.blob_by_name("data").data[3], [100, 101])
    net.forward_from_to()
    assert net.blob_by_name("label").data.tolist() == [11, 0, 1, 2]


def test_hdf5_data_bad_lists_name_the_file(tmp_path):
    import h5py
    text = """layer { name: "h" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param { source: "%s" batch_size: 2 } }"""
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError, match=r"layer 'h' \(HDF5Data\): the HDF5 file list .*empty.txt is empty"):
        net_from_text(text % (tmp_path / "empty.txt"))
    with h5py.File(tmp_path / "f.h5", "w") as h5:
        h5["data"] = np.zeros((3, 2), np.float32)
    (tmp_path / "list.txt").write_text("%s\n" % (tmp_path / "f.h5"))
    with pytest.raises(DataError, match=r"cannot read datasets data, label from .*f.h5"):
        net_from_text(text % (tmp_path / "list.txt"))


def test_hdf5_data_damaged_sources_name_the_layer_and_the_file(tmp_path):
    import h5py
    text = """layer { name: "h" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param { source: "%s" batch_size: 2 } }"""
    (tmp_path / "binary.txt").write_bytes(b"\x89HDF\xff\n")           # read as text: UnicodeDecodeError
    with pytest.raises(DataError, match=r"layer 'h' \(HDF5Data\): the HDF5 file list .*binary.txt is not UTF-8"):
        net_from_text(text % (tmp_path / "binary.txt"))
    (tmp_path / "list.txt").write_text("%s\n" % (tmp_path / "f.h5"))
    (tmp_path / "f.h5").write_bytes(bytes.fromhex("894844460d0a1a0a2000"))
    with pytest.raises(DataError, match=r"layer 'h' \(HDF5Data\): .*f.h5: is not a readable HDF5 file"):
        net_from_text(text % (tmp_path / "list.txt"))
    with h5py.File(tmp_path / "f.h5", "w") as h5:
        h5["data"], h5["label"] = np.zeros((3, 2), np.float32), np.float32(1)   # len() of a scalar: TypeError
    with pytest.raises(DataError, match=r"layer 'h' \(HDF5Data\): .*f.h5: dataset 'label' is a scalar"):
        net_from_text(text % (tmp_path / "list.txt"))
    with h5py.File(tmp_path / "f.h5", "w") as h5:
        h5["data"], h5["label"] = np.zeros((3, 2), np.float32), np.array([b"a", b"b", b"c"])
    with pytest.raises(DataError, match=r"layer 'h' \(HDF5Data\): .*f.h5: dataset 'label': has datatype"):
        net_from_text(text % (tmp_path / "list.txt"))


def test_hdf5_data_train_shard_keeps_every_nth_row(tmp_path):
    import h5py
    with h5py.File(tmp_path / "f.h5", "w") as h5:
        h5["data"] = np.zeros((7, 1), np.float32)
        h5["label"] = np.arange(7, dtype=np.float32)
    (tmp_path / "list.txt").write_text("%s\n" % (tmp_path / "f.h5"))
    text = """layer { name: "h" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param { source: "%s" batch_size: 3 } }""" % (tmp_path / "list.txt")
    try:
        common.set_data_shard(1, 2)
        net = net_from_text(text)
        labels = []
        for _ in range(3):
            net.forward_from_to()
            labels += net.blob_by_name("label").data.tolist()
        # running positions 1, 3, 5, then 7, 9, 11 (rows 0, 2, 4 of the second pass), 13 (row 6), 15, 17 ...
        assert labels == [1, 3, 5, 0, 2, 4, 6, 1, 3]
        test_net = net_from_text(text, phase=caffe_pb2.TEST)
        test_net.forward_from_to()
        assert test_net.blob_by_name("label").data.tolist() == [0, 1, 2]
    finally:
        common.set_data_shard(0, 1)


def test_hdf5_output_writes_its_bottoms(tmp_path):
    import h5py
    net = net_from_text("""
        layer { name: "i" type: "Input" top: "x" top: "y" input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
        layer { name: "out" type: "HDF5Output" bottom: "x" bottom: "y" hdf5_output_param { file_name: "%s" } }
    """ % (tmp_path / "out.h5"))
    net.blob_by_name("x").data[...] = np.arange(6).reshape(2, 3)
    net.blob_by_name("y").data[...] = [4, 5]
    net.forward_from_to()
    with h5py.File(tmp_path / "out.h5", "r") as h5:
        # Caffe writes the legacy 4-D blobs: (2, 3) -> (2, 3, 1, 1), (2,) -> (2, 1, 1, 1)
        np.testing.assert_array_equal(h5["data"][...], np.arange(6).reshape(2, 3, 1, 1))
        np.testing.assert_array_equal(h5["label"][...], np.reshape([4, 5], (2, 1, 1, 1)))
    odd = net_from_text("""
        layer { name: "i" type: "Input" top: "x" top: "y" input_param { shape { dim: 2 dim: 3 } shape { dim: 3 } } }
        layer { name: "out" type: "HDF5Output" bottom: "x" bottom: "y" hdf5_output_param { file_name: "%s" } }
    """ % (tmp_path / "odd.h5"))
    with pytest.raises(NetError, match=r"layer 'out' \(HDF5Output\): data and label must have the same num"):
        odd.forward_from_to()


def test_hdf5_data_list_splits_at_any_whitespace_and_refuses_a_transform(tmp_path):
    import h5py
    for i in range(2):
        with h5py.File(tmp_path / ("p%d.h5" % i), "w") as h5:
            h5["data"] = np.full((2, 3), i, np.float32)
    (tmp_path / "list.txt").write_text("%s %s\n" % (tmp_path / "p0.h5", tmp_path / "p1.h5"))   # Caffe reads with >>
    text = ('layer { name: "h" type: "HDF5Data" top: "data" hdf5_data_param { source: "%s" batch_size: 4 } %s }'
            % (tmp_path / "list.txt", "%s"))
    net = net_from_text(text % "")
    net.forward_from_to()
    np.testing.assert_array_equal(net.blob_by_name("data").data[:, 0], [0, 0, 1, 1])
    with pytest.raises(NetError, match="HDF5Data does not transform data"):
        net_from_text(text % "transform_param { scale: 2 }")
