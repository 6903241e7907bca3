"""IDX files (MNIST, Fashion-MNIST), plain or gzip-compressed.

Layout (big-endian): 2 zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32,
0x0E float64), the number of dimensions, one uint32 per dimension, then the items. MNIST's image files have magic
0x00000803 (2051: uint8, 3 dims: count, rows, cols) and label files 0x00000801 (2049: uint8, 1 dim), the numbers
Caffe's convert_mnist_data checks. Files are recognised as gzip by their first two bytes, not by their name.
"""
import gzip
import io
import math
import struct
import zlib

import numpy as np

from ..errors import DataError

_TYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049


def _read_bytes(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DataError("%s: no such IDX file" % path) from None
    except OSError as exc:
        raise DataError("%s: cannot read: %s" % (path, exc.strerror)) from None
    except ValueError as exc:      # a name with a NUL byte
        raise DataError("%r: cannot read: %s" % (path, exc)) from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = _decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError("%s: is not a readable gzip file (truncated or corrupt): %s" % (path, exc)) from None
    return data


def _decompress(data):
    """The gzip stream's bytes, no more than its IDX header declares (plus one, to tell a longer file): a small
    damaged or hostile .gz could otherwise expand to any size."""
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
        head = f.read(4)
        if len(head) < 4:
            return head
        head += f.read(4 * head[3])
        if len(head) < 4 + 4 * head[3] or (head[2] not in _TYPES):
            return head
        dims = struct.unpack(">%dI" % head[3], head[4:])
        left = math.prod(dims) * np.dtype(_TYPES[head[2]]).itemsize + 1
        parts = [head]
        while left > 0:           # in steps: read(n) would allocate all n bytes at once
            part = f.read(min(left, 1 << 24))
            if not part:
                break
            parts.append(part)
            left -= len(part)
        return b"".join(parts)


def read_idx(path, magic=None):
    """The array held by the IDX file at `path` (native byte order); `magic`, if given, must match the header's."""
    path = str(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise DataError("%s: is not an IDX file: %d bytes, shorter than the 4-byte magic number" % (path, len(data)))
    (found,) = struct.unpack(">I", data[:4])
    zeros, type_code, ndim = found >> 16, (found >> 8) & 0xFF, found & 0xFF
    if zeros != 0 or type_code not in _TYPES:
        raise DataError("%s: is not an IDX file (magic number 0x%08x)" % (path, found))
    if magic is not None and found != magic:
        raise DataError("%s: magic number %d, expected %d (%s)"
                        % (path, found, magic, "images" if magic == IMAGES_MAGIC else "labels"))
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError("%s: truncated header: %d dimensions need %d bytes, the file has %d"
                        % (path, ndim, header, len(data)))
    dims = struct.unpack(">%dI" % ndim, data[4:header])
    dtype = np.dtype(_TYPES[type_code])
    expected = header + math.prod(dims) * dtype.itemsize      # Python ints: an int64 product could wrap
    if len(data) != expected:
        raise DataError("%s: header says %s items of %d bytes: expected %d bytes (with the header), the file holds %d"
                        % (path, " x ".join(map(str, dims)), dtype.itemsize, expected, len(data)))
    if math.prod(d for d in dims if d) * dtype.itemsize >= 2 ** 63:
        # possible with a zero dimension among them, but no array numpy can describe
        raise DataError("%s: header says %s items: more than an array can hold" % (path, " x ".join(map(str, dims))))
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=False)


def read_mnist(images_path, labels_path):
    """(images uint8 (N, rows, cols), labels uint8 (N,)) of an MNIST-style pair, with convert_mnist_data's checks."""
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if len(images) != len(labels):
        raise DataError("%s holds %d images but %s holds %d labels"
                        % (images_path, len(images), labels_path, len(labels)))
    return images, labels
