"""Blobs in .binaryproto files (blob/binaryproto.py): mean files and InfogainLoss's H."""
import numpy as np
import pytest

from pycaffe_dist.blob.binaryproto import read_blob_file, write_blob_file
from pycaffe_dist.errors import ModelFileError
from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.proto.binary import write_binary
from tests.conftest import GOLDEN


def test_mean_file_round_trip(tmp_path):
    mean = np.random.default_rng(0).random((1, 3, 4, 5), dtype=np.float32)
    write_blob_file(tmp_path / "mean.binaryproto", mean)
    np.testing.assert_array_equal(read_blob_file(tmp_path / "mean.binaryproto"), mean)
    h = read_blob_file(GOLDEN / "layers" / "infogain_loss" / "H.binaryproto")
    assert h.ndim >= 2


def test_a_blob_whose_values_do_not_fill_its_shape_names_the_file(tmp_path):
    proto = caffe_pb2.BlobProto()
    proto.shape.dim.extend([2, 3])
    proto.data.extend([1.0] * 5)
    write_binary(tmp_path / "short.binaryproto", proto)
    with pytest.raises(ModelFileError, match=r"short.binaryproto: .*holds 5 values but its shape \(2, 3\) needs 6"):
        read_blob_file(tmp_path / "short.binaryproto")


def test_a_blob_beyond_int_max_names_the_file(tmp_path):
    """(0, 2^40, 2^40) holds nothing, yet numpy cannot describe it: ValueError (found by tests/fuzz)."""
    for dims in ([0, 2 ** 40, 2 ** 40], [2 ** 16, 2 ** 16]):
        (tmp_path / "h.binaryproto").write_bytes(caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(dim=dims))
                                                 .SerializeToString())
        with pytest.raises(ModelFileError, match=r"h.binaryproto: blob shape .*: blob size exceeds INT_MAX"):
            read_blob_file(tmp_path / "h.binaryproto")
