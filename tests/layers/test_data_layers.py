"""Input, DummyData, Data (LMDB from Caffe's convert_mnist_data, datumfile) and Python layers."""
import struct
import sys
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
    before = a.data.copy()
    net.forward_from_to()
    assert not np.array_equal(before, a.data) and b.data.tolist() == [7.0] * 4
    legacy = net_from_text('layer { name: "d" type: "DummyData" top: "x" '
                           'dummy_data_param { num: 2 channels: 3 height: 4 width: 5 } }')
    assert legacy.blob_by_name("x").shape == (2, 3, 4, 5)
    with pytest.raises(NetError, match="both shape and legacy fields"):
        net_from_text('layer { name: "d" type: "DummyData" top: "x" dummy_data_param { num: 2 shape { dim: 1 } } }')


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


PYLAYER = '''
import pycaffe_dist as caffe

class Doubler(caffe.Layer):
    def setup(self, bottom, top):
        self.factor = float(self.param_str or 2)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.factor * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = self.factor * top[0].diff
'''


def test_python_layer_runs_users_class(tmp_path, monkeypatch):
    (tmp_path / "my_layers.py").write_text(PYLAYER)
    monkeypatch.syspath_prepend(str(tmp_path))
    net = net_from_text("""
        force_backward: true
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 2 } } }
        layer { name: "dbl" type: "Python" bottom: "x" top: "y"
                python_param { module: "my_layers" layer: "Doubler" param_str: "3" } }
    """)
    net.blob_by_name("x").data[...] = [[1, 2], [3, 4]]
    net.forward_from_to()
    assert net.blob_by_name("y").data.tolist() == [[3, 6], [9, 12]]
    net.blob_by_name("y").diff[...] = 1
    net.backward_from_to()
    assert net.blob_by_name("x").diff.tolist() == [[3, 3], [3, 3]]
    with pytest.raises(NetError, match="module 'my_layers' has no class 'Nope'"):
        net_from_text('layer { name: "p" type: "Python" python_param { module: "my_layers" layer: "Nope" } }')
    sys.modules.pop("my_layers", None)
