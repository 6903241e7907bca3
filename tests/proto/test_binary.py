"""Binary proto files (proto/binary.py) written by Caffe itself (golden fixtures): read, round-trip, and refuse bad
files clearly."""
import numpy as np
import pytest

from pycaffe_dist.errors import ModelFileError
from pycaffe_dist.io.load import read_net_binary
from pycaffe_dist.proto.binary import parse_binary, read_binary, write_binary
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, load_npz

SGD = GOLDEN / "solvers" / "sgd_momentum"


def test_caffe_written_snapshot_and_solverstate():
    state = read_binary(SGD / "snap_iter_10.solverstate", caffe_pb2.SolverState())
    assert state.iter == 10 and state.learned_net.endswith("snap_iter_10.caffemodel")
    history = load_npz(SGD / "solverstate_iter10.npz")
    assert len(state.history) == len([k for k in history if k.startswith("history/")])
    for i, blob in enumerate(state.history):
        np.testing.assert_array_equal(Blob.from_proto_new(blob).data, history["history/%d" % i])
    net = read_net_binary(SGD / "snap_iter_10.caffemodel")
    params = load_npz(SGD / "params_iter10.npz")
    ip1 = next(l for l in net.layer if l.name == "ip1")
    np.testing.assert_array_equal(Blob.from_proto_new(ip1.blobs[0]).data, params["param/ip1/0"])


def test_round_trip_is_byte_identical(tmp_path):
    original = (GOLDEN / "nets" / "lenet" / "weights.caffemodel").read_bytes()
    net = read_binary(GOLDEN / "nets" / "lenet" / "weights.caffemodel", caffe_pb2.NetParameter())
    write_binary(tmp_path / "w.caffemodel", net)
    assert (tmp_path / "w.caffemodel").read_bytes() == original


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"\xff" * 64, "is not a Caffe solver state"),
    (b"\x0a\x05hello" + b"\x99\x99\x99", "is not a Caffe solver state"),
])
def test_bad_solverstate(tmp_path, content, message):
    path = tmp_path / "x.solverstate"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match=message):
        read_binary(path, caffe_pb2.SolverState())


def test_truncated_caffemodel_and_foreign_fields(tmp_path):
    data = (SGD / "snap_iter_10.caffemodel").read_bytes()
    (tmp_path / "cut.caffemodel").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="cut.caffemodel: .*truncated"):
        read_net_binary(tmp_path / "cut.caffemodel")
    # a well-formed protobuf of another schema (field 200, varint) is not a NetParameter
    (tmp_path / "other.caffemodel").write_bytes(b"\xc0\x0c\x01")
    with pytest.raises(ModelFileError, match="unknown top-level field"):
        read_net_binary(tmp_path / "other.caffemodel")
    (tmp_path / "w.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 32)
    with pytest.raises(ModelFileError, match="HDF5"):
        read_net_binary(tmp_path / "w.h5")


def test_a_string_field_that_is_not_utf8_names_the_file_and_the_field(tmp_path):
    """protobuf parses it and hands it back as bytes; the upgrade of a V1 net raised UnicodeDecodeError."""
    (tmp_path / "v1.caffemodel").write_bytes(bytes.fromhex("0a054c654e657412092205636f6e76fc2804"))
    with pytest.raises(ModelFileError, match=r"v1.caffemodel: is not a Caffe model .*: the string field "
                       r"layers\[0\].name is not UTF-8 \(byte 0xfc at position 4\)"):
        read_net_binary(tmp_path / "v1.caffemodel")
    layer = caffe_pb2.LayerParameter(name="ok", top=["a", "b"]).SerializeToString() + b"\x22\x02\xc3\x28"
    net = b"\xa2\x06" + bytes([len(layer)]) + layer                 # field 100 (layer): a third top, not UTF-8
    (tmp_path / "v2.caffemodel").write_bytes(net)
    with pytest.raises(ModelFileError, match=r"string field layer\[0\].top\[2\] is not UTF-8"):
        read_net_binary(tmp_path / "v2.caffemodel")
    state = caffe_pb2.SolverState(iter=3).SerializeToString() + b"\x12\x01\xff"      # learned_net
    with pytest.raises(ModelFileError, match=r"<state>: is not a Caffe solver state .*learned_net is not UTF-8"):
        parse_binary(state, caffe_pb2.SolverState(), "<state>")


def test_a_file_name_with_a_nul_byte(tmp_path):
    """From a prototxt string ("mean_file: \"m\\000\"") or a solver state's learned_net: open() raised
    ValueError."""
    with pytest.raises(ModelFileError, match=r"m\\x00.binaryproto': cannot read: embedded null byte"):
        read_binary(str(tmp_path / "m\0.binaryproto"), caffe_pb2.BlobProto())
