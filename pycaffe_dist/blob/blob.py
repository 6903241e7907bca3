"""Blob: an N-d float32 array with its gradient, as Caffe's Blob (include/caffe/blob.hpp).

Memory is allocated on first access of `data` or `diff`, so building a net to infer shapes (net-info, upgrade
checks) costs no memory. Like Caffe's SyncedMemory, fresh memory is zero; a reshape that keeps the element count
keeps the values. A parameter blob may carry an initializer (its filler) that runs on that first access, unless
weights are loaded into it first.

Data and diff each live in a SyncedMemory (synced_memory.py) with a host and a device copy: `data`/`diff` are
the host arrays (reading or writing them makes the host copy current), `cpu_data`/`cpu_diff` read the host copy
without claiming it, and `gpu_data`/`gpu_diff` (read) and `mutable_gpu_data`/`mutable_gpu_diff` (write) are the
device copies, as Caffe's Blob accessors of the same names.
"""
import numpy as np

from ..errors import NetError
from ..proto import caffe_pb2
from .synced_memory import SyncedMemory

MAX_BLOB_AXES = 32  # Caffe's kMaxBlobAxes
INT_MAX = 2 ** 31 - 1   # Caffe counts a blob's values in an int


def canonical_axis(axis, num_axes, what="axis"):
    """Caffe's Blob::CanonicalAxisIndex: negative axes count from the end; out of range is an error."""
    if not -num_axes <= axis < num_axes:
        raise NetError("%s %d out of range for a blob with %d axes" % (what, axis, num_axes))
    return axis + num_axes if axis < 0 else axis


def count(shape, start=0, end=None):
    """Product of shape[start:end], 1 for an empty range (Caffe's Blob::count(start, end))."""
    n = 1
    for d in shape[start:end]:
        n *= int(d)
    return n


class Blob:
    __slots__ = ("_shape", "_data", "_diff", "_init", "_dtype")

    def __init__(self, shape=(), init=None, dtype=np.float32):
        # Nets hold float32, as Caffe's Net<float>; the gradient checker runs layers on float64 blobs, as
        # Caffe's tests do with Dtype = double. Layers compute in their bottoms' dtype.
        self._shape = ()
        self._data = self._diff = None
        self._init = init
        self._dtype = np.dtype(dtype)
        self.reshape(shape)

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_BLOB_AXES:
            raise NetError("blob shape %s has more than %d axes" % (shape, MAX_BLOB_AXES))
        if any(d < 0 for d in shape):
            raise NetError("blob shape %s has a negative dimension" % (shape,))
        # Caffe's Blob::Reshape: "blob size exceeds INT_MAX". Counted without zero axes, whose blobs hold nothing
        # but which numpy cannot describe either (a damaged file's (0, 2^40, 2^40) raised ValueError).
        if count([d for d in shape if d]) > INT_MAX:
            raise NetError("blob shape %s: blob size exceeds INT_MAX" % (shape,))
        if shape == self._shape:
            return
        keep = count(shape) == count(self._shape)
        self._shape = shape
        if not keep:
            self._data = self._diff = None

    @property
    def shape(self):
        return self._shape

    @property
    def count(self):
        return count(self._shape)

    @property
    def dtype(self):
        return self._dtype

    def astype(self, dtype):
        """Convert data and diff (keeping values) to `dtype`; used by the float64 gradient checker."""
        self._dtype = np.dtype(dtype)
        for mem in (self._data, self._diff):
            if mem is not None:
                mem.astype(dtype)
        return self

    def count_range(self, start, end=None):
        return count(self._shape, start, end)

    def _legacy(self, index):
        """Caffe's LegacyShape: num/channels/height/width of a blob of at most 4 axes (missing axes are 1)."""
        if len(self._shape) > 4:
            raise NetError("legacy accessors (num/channels/height/width) need a blob of at most 4 axes")
        if index >= len(self._shape) or index < -len(self._shape):
            return 1
        return self._shape[index]

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    @property
    def data_memory(self):
        """The SyncedMemory holding the data (its `head` says which copy is current), or None while unallocated:
        Caffe's Blob::data()."""
        return self._data

    @property
    def diff_memory(self):
        """The SyncedMemory holding the diff, or None while unallocated: Caffe's Blob::diff()."""
        return self._diff

    def _data_mem(self):
        if self._data is None:
            self._data = SyncedMemory(count(self._shape), self._dtype)
            init, self._init = self._init, None
            if init is not None:
                init(self)
        return self._data

    def _diff_mem(self):
        if self._diff is None:
            self._diff = SyncedMemory(count(self._shape), self._dtype)
        return self._diff

    @property
    def data(self):
        return self._data_mem().host().reshape(self._shape)

    @data.setter
    def data(self, value):
        self.data[...] = value

    @property
    def diff(self):
        return self._diff_mem().host().reshape(self._shape)

    @diff.setter
    def diff(self, value):
        self.diff[...] = value

    @property
    def cpu_data(self):
        """The host data, to read only: unlike `data`, it leaves a current device copy current."""
        return self._data_mem().host(write=False).reshape(self._shape)

    @property
    def cpu_diff(self):
        return self._diff_mem().host(write=False).reshape(self._shape)

    @property
    def gpu_data(self):
        """The device data (a flat DeviceArray), to read only."""
        return self._data_mem().device(write=False)

    @property
    def mutable_gpu_data(self):
        return self._data_mem().device()

    @property
    def gpu_diff(self):
        return self._diff_mem().device(write=False)

    @property
    def mutable_gpu_diff(self):
        return self._diff_mem().device()

    def share_data(self, other):
        """Use other's data memory (Caffe's ShareData), e.g. for in-place layers and shared weights."""
        self._shape = other.shape
        self._data = other._data_mem()

    def share_diff(self, other):
        self._shape = other.shape
        self._diff = other._diff_mem()

    def share_reshaped(self, other):
        """View other's data and diff in this blob's own shape (same count): Reshape and Flatten share memory with
        their bottom, as Caffe's ShareData/ShareDiff do, so neither forward nor backward copies anything."""
        if count(self._shape) != other.count:
            raise NetError("cannot share a blob of shape %s as shape %s" % (other.shape, self._shape))
        self._dtype = other.dtype
        self._data = other._data_mem()
        self._diff = other._diff_mem()

    def __repr__(self):
        return "Blob(%s)" % (self._shape,)

    # --- protobuf conversion (Caffe's Blob::FromProto / ToProto) ---------------------------------------

    @staticmethod
    def proto_shape(proto):
        """The shape a BlobProto describes: `shape.dim`, or the legacy num/channels/height/width (4 axes)."""
        if proto.HasField("num") or proto.HasField("channels") or proto.HasField("height") or \
                proto.HasField("width"):
            return (proto.num, proto.channels, proto.height, proto.width)
        return tuple(proto.shape.dim)

    def shape_matches_proto(self, proto):
        """Caffe's Blob::ShapeEquals: legacy 4-D protos match from the end, missing leading axes being 1."""
        if proto.HasField("num") or proto.HasField("channels") or proto.HasField("height") or \
                proto.HasField("width"):
            if len(self._shape) > 4:
                return False
            legacy = (proto.num, proto.channels, proto.height, proto.width)
            return tuple(self._legacy(i) for i in (-4, -3, -2, -1)) == legacy
        return tuple(proto.shape.dim) == self._shape

    def from_proto(self, proto, reshape=True, what="blob"):
        self._init = None    # loaded values replace the filler
        if reshape:
            self.reshape(self.proto_shape(proto))
        elif not self.shape_matches_proto(proto):
            raise NetError("%s: shape mismatch: target %s, source %s" % (what, self._shape, self.proto_shape(proto)))
        values = proto.double_data if len(proto.double_data) else proto.data
        if len(values) != self.count:
            raise NetError("%s: holds %d values but its shape %s needs %d"
                           % (what, len(values), self.proto_shape(proto), self.count))
        self.data[...] = np.asarray(values, dtype=np.float32).reshape(self._shape)
        diffs = proto.double_diff if len(proto.double_diff) else proto.diff
        if len(diffs):
            if len(diffs) != self.count:
                raise NetError("%s: holds %d diff values, expected %d" % (what, len(diffs), self.count))
            self.diff[...] = np.asarray(diffs, dtype=np.float32).reshape(self._shape)
        return self

    @classmethod
    def from_proto_new(cls, proto, what="blob"):
        return cls().from_proto(proto, what=what)

    def to_proto(self, write_diff=False, proto=None):
        """Caffe's Blob::ToProto: shape, data and (if asked) diff as packed float32."""
        proto = proto if proto is not None else caffe_pb2.BlobProto()
        proto.Clear()
        proto.shape.dim.extend(self._shape)
        # Merging the packed wire bytes is ~10x faster than extending the repeated field from a Python list.
        proto.MergeFromString(_packed_floats(_DATA_TAG, self.data) +
                              (_packed_floats(_DIFF_TAG, self.diff) if write_diff else b""))
        return proto


_DATA_TAG, _DIFF_TAG = b"\x2a", b"\x32"   # BlobProto.data = 5, diff = 6, wire type 2 (packed)


def _varint(n):
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packed_floats(tag, array):
    raw = np.ascontiguousarray(array, dtype="<f4").tobytes()
    return tag + _varint(len(raw)) + raw if raw else b""
