"""Blob semantics (Caffe's blob.cpp): lazy allocation, shapes, legacy accessors and protos."""
import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.blob.blob import Blob, canonical_axis
from pycaffe_dist.proto import caffe_pb2


def test_lazy_allocation_and_reshape_keeps_values_when_count_is_kept():
    blob = Blob((2, 3))
    assert blob.data_memory is None and blob.count == 6
    blob.data[...] = np.arange(6).reshape(2, 3)
    blob.reshape(3, 2)
    assert blob.data.tolist() == [[0, 1], [2, 3], [4, 5]]
    blob.reshape((4, 2))
    assert not blob.data.any()   # new count: fresh zeroed memory, as Caffe's SyncedMemory


def test_legacy_accessors_and_axes():
    blob = Blob((5, 7))
    assert (blob.num, blob.channels, blob.height, blob.width) == (5, 7, 1, 1)
    assert canonical_axis(-1, 4) == 3
    with pytest.raises(NetError, match="axis 4 out of range"):
        canonical_axis(4, 4)
    with pytest.raises(NetError, match="negative dimension"):
        Blob((2, -1))


def test_proto_round_trip_and_legacy_shape_matching():
    blob = Blob((2, 3))
    blob.data[...] = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    proto = blob.to_proto(write_diff=True)
    assert list(proto.shape.dim) == [2, 3] and len(proto.diff) == 6
    again = Blob.from_proto_new(proto)
    np.testing.assert_array_equal(again.data, blob.data)
    legacy = caffe_pb2.BlobProto(num=1, channels=1, height=2, width=3)   # how V1 caffemodels store (2, 3)
    legacy.data.extend(range(6))
    assert blob.shape_matches_proto(legacy) and not Blob((3, 2)).shape_matches_proto(legacy)
    blob.from_proto(legacy, reshape=False)
    assert blob.data.tolist() == [[0, 1, 2], [3, 4, 5]]
    short = caffe_pb2.BlobProto()
    short.shape.dim.extend([2, 3])
    short.data.extend([1.0] * 5)
    with pytest.raises(NetError, match="holds 5 values but its shape"):
        Blob.from_proto_new(short)


def test_to_proto_fast_path_writes_protobufs_own_bytes():
    blob = Blob((3, 4, 5))
    blob.data[...] = np.random.default_rng(1).standard_normal((3, 4, 5))
    blob.diff[...] = -blob.data
    expected = caffe_pb2.BlobProto()
    expected.shape.dim.extend([3, 4, 5])
    expected.data.extend(blob.data.ravel().tolist())
    expected.diff.extend(blob.diff.ravel().tolist())
    assert blob.to_proto(write_diff=True).SerializeToString() == expected.SerializeToString()
    assert Blob((0, 2)).to_proto().SerializeToString() == caffe_pb2.BlobProto(
        shape=caffe_pb2.BlobShape(dim=[0, 2])).SerializeToString()
