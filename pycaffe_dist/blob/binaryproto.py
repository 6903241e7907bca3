"""A blob in a .binaryproto file (a binary BlobProto) as a float32 array: Caffe's mean files (1xCxHxW, from
compute_image_mean) and InfogainLoss's H matrix."""
import numpy as np

from ..errors import ModelFileError, NetError
from ..proto import caffe_pb2
from ..proto.binary import read_binary, write_binary
from .blob import Blob


def read_blob_file(path):
    """The file's blob as a float32 array of the blob's shape; a file whose values do not fill its shape is a
    ModelFileError naming it."""
    proto = read_binary(path, caffe_pb2.BlobProto())
    try:
        return Blob.from_proto_new(proto, what=str(path)).data
    except NetError as exc:
        raise ModelFileError("%s: %s" % (path, exc)) from None


def write_blob_file(path, array):
    array = np.asarray(array, dtype=np.float32)
    blob = Blob(array.shape)
    blob.data[...] = array
    write_binary(path, blob.to_proto())
