"""Caffe's messages as binary files and bytes: .caffemodel (NetParameter), .binaryproto (BlobProto),
.solverstate (SolverState).

Caffe writes these with SerializeToOstream and reads them with a 2 GiB byte limit. A truncated or foreign file
would otherwise surface as a bare protobuf DecodeError, or even parse as a message full of unknown fields:
both become a ModelFileError naming the file and what was expected.
"""
import pathlib

from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from ..errors import ModelFileError

_WHAT = {
    "NetParameter": "a Caffe model (.caffemodel: binary NetParameter)",
    "BlobProto": "a Caffe blob (.binaryproto: binary BlobProto)",
    "SolverState": "a Caffe solver state (.solverstate: binary SolverState)",
}


def _read_bytes(path):
    path = pathlib.Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ModelFileError("%s: no such file" % path) from None
    except OSError as exc:
        raise ModelFileError("%s: cannot read: %s" % (path, exc.strerror)) from None
    if path.suffix == ".h5" or data[:8] == b"\x89HDF\r\n\x1a\n":
        raise ModelFileError("%s: is an HDF5 file; only binaryproto snapshots are read" % path)
    return data


def parse_binary(data, message, source="<bytes>"):
    """Parse serialized bytes into `message`, rejecting truncated data and foreign files."""
    what = _WHAT.get(message.DESCRIPTOR.name, message.DESCRIPTOR.full_name)
    if not data:
        raise ModelFileError("%s: is empty; expected %s" % (source, what))
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise ModelFileError("%s: is not %s, or is truncated (%d bytes): %s" % (source, what, len(data), exc)) \
            from None
    unknown = UnknownFieldSet(message)
    if len(unknown):
        numbers = sorted({f.field_number for f in unknown})
        raise ModelFileError("%s: is not %s: it holds unknown top-level field(s) %s"
                             % (source, what, ", ".join(map(str, numbers[:5]))))
    return message


def read_binary(path, message):
    return parse_binary(_read_bytes(path), message, str(path))


def write_binary(path, message):
    pathlib.Path(path).write_bytes(message.SerializeToString())
