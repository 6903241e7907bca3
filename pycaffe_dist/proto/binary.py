"""Caffe's messages as binary files and bytes: .caffemodel (NetParameter), .binaryproto (BlobProto),
.solverstate (SolverState).

Caffe writes these with SerializeToOstream and reads them with a 2 GiB byte limit. A truncated or foreign file
would otherwise surface as a bare protobuf DecodeError, or even parse as a message full of unknown fields:
both become a ModelFileError naming the file and what was expected.

Protobuf's parser (upb) does not check that proto2 `string` fields hold UTF-8: a bad one parses, reads back as
bytes instead of str, and raises UnicodeDecodeError wherever it is copied into another message (upgrade, net
building). parse_binary reads every string field once,
right after parsing, so that such a file is refused here with the field's path.
"""
import pathlib

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from ..errors import ModelFileError, ModelFileNotFound

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
        raise ModelFileNotFound("%s: no such file" % path) from None
    except OSError as exc:
        raise ModelFileError("%s: cannot read: %s" % (path, exc.strerror)) from None
    except ValueError as exc:      # a name with a NUL byte (a prototxt string may hold one)
        raise ModelFileError("%r: cannot read: %s" % (str(path), exc)) from None
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
    bad = _bad_string(message)
    if bad is not None:
        path, exc = bad
        raise ModelFileError("%s: is not %s: the string field %s is not UTF-8 (byte 0x%02x at position %d)"
                             % (source, what, path, exc.object[exc.start], exc.start))
    return message


_STRING_FIELDS = {}     # message full name -> [(field, is a message)] of fields that are or may hold strings


def _fields_with_strings(descriptor, visiting=()):
    """The fields of a message type that are strings or messages that (transitively) hold strings; BlobProto and
    the other numeric messages have none, so a caffemodel's weights are never walked."""
    name = descriptor.full_name
    if name in _STRING_FIELDS:
        return _STRING_FIELDS[name]
    if name in visiting:                  # a recursive type (caffe.proto has none): assume it may hold strings
        return [None]
    found = []
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            found.append((field, False))
        elif field.type == FieldDescriptor.TYPE_MESSAGE and _fields_with_strings(field.message_type,
                                                                                 visiting + (name,)):
            found.append((field, True))
    _STRING_FIELDS[name] = found
    return found


def _bad_string(message, prefix=""):
    """(field path, UnicodeDecodeError) of the first string field that is not UTF-8, or None. upb hands such a
    field back as bytes (a valid one as str)."""
    for field, is_message in _fields_with_strings(message.DESCRIPTOR):
        repeated = field.is_repeated
        if not repeated and not message.HasField(field.name):
            continue
        path = prefix + field.name
        if is_message:
            children = getattr(message, field.name) if repeated else [getattr(message, field.name)]
            for i, child in enumerate(children):
                bad = _bad_string(child, "%s[%d]." % (path, i) if repeated else path + ".")
                if bad is not None:
                    return bad
            continue
        values = getattr(message, field.name) if repeated else [getattr(message, field.name)]
        for i, value in enumerate(values):
            if isinstance(value, bytes):
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError as exc:
                    return ("%s[%d]" % (path, i) if repeated else path), exc
    return None


def read_binary(path, message):
    return parse_binary(_read_bytes(path), message, str(path))


def write_binary(path, message):
    pathlib.Path(path).write_bytes(message.SerializeToString())
