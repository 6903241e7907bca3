"""Data sources: the record stores Caffe reads (LMDB, LevelDB, datumfile), image lists and HDF5 lists.

This module opens a source and reads its first record, which is all a data layer needs at setup to know its top
shapes; streaming batches with prefetch is built on the same readers.
"""
import os
import struct

from google.protobuf.message import DecodeError

from ..errors import DataError
from ..proto import caffe_pb2

DB = caffe_pb2.DataParameter
DATUMFILE_MAX_BUF = 104857600   # 100 MiB: larger length fields are corruption (reference/datumfile.md)


def parse_datum(value, where):
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except DecodeError as exc:
        raise DataError("%s: record is not a Caffe Datum: %s" % (where, exc)) from None
    return datum


def iter_lmdb(path):
    try:
        import lmdb
    except ImportError:
        raise DataError("%s: reading LMDB needs the 'lmdb' package (pip install lmdb)" % path) from None
    try:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=os.path.isdir(path))
    except lmdb.Error as exc:
        raise DataError("%s: cannot open LMDB: %s" % (path, exc)) from None
    with env, env.begin(buffers=False) as txn:
        for key, value in txn.cursor():
            yield key, value


def iter_leveldb(path):
    try:
        import plyvel
    except ImportError:
        raise DataError("%s: reading LevelDB needs the 'plyvel' package (pip install plyvel)" % path) from None
    try:
        db = plyvel.DB(path, create_if_missing=False)
    except plyvel.Error as exc:
        raise DataError("%s: cannot open LevelDB: %s" % (path, exc)) from None
    try:
        yield from db.iterator()
    finally:
        db.close()


def iter_datumfile(path):
    """Records of a datumfile: (uint32 LE record size, key size, key, value size, value) back to back."""
    def read_u32(f, what, offset, eof_ok=False):
        raw = f.read(4)
        if eof_ok and not raw:
            return None
        if len(raw) < 4:
            raise DataError("%s: truncated record at byte %d (reading %s)" % (path, offset, what))
        (n,) = struct.unpack("<I", raw)
        if n > DATUMFILE_MAX_BUF:
            raise DataError("%s: record at byte %d: %s %d exceeds %d; not a datumfile or corrupt"
                            % (path, offset, what, n, DATUMFILE_MAX_BUF))
        return n

    with open(path, "rb") as f:
        index = 0
        while True:
            offset = f.tell()
            if read_u32(f, "record size", offset, eof_ok=True) is None:
                return
            key = f.read(read_u32(f, "key size", offset))
            size = read_u32(f, "value size", offset)
            value = f.read(size)
            if len(value) < size:
                raise DataError("%s: record %d at byte %d is truncated (value of %d bytes, %d present)"
                                % (path, index, offset, size, len(value)))
            yield key, value
            index += 1


def iter_records(source, backend):
    readers = {DB.LMDB: iter_lmdb, DB.LEVELDB: iter_leveldb, DB.DATUMFILE: iter_datumfile}
    if backend not in readers:
        raise DataError("%s: unknown data backend %r" % (source, backend))
    return readers[backend](source)


def first_datum(source, backend):
    for key, value in iter_records(source, backend):
        return parse_datum(value, "%s: record %r" % (source, key))
    raise DataError("%s: the database holds no records" % source)


def first_image_shape(listing, root_folder, is_color, new_height, new_width):
    """(channels, height, width) of the first image of an ImageData list file."""
    with open(listing) as f:
        first = f.readline().strip()
    if not first:
        raise DataError("%s: the image list is empty" % listing)
    image_path = os.path.join(root_folder, first.rsplit(" ", 1)[0])
    channels = 3 if is_color else 1
    if new_height and new_width:
        return channels, new_height, new_width
    try:
        from PIL import Image
    except ImportError:
        raise DataError("%s: reading images needs the 'Pillow' package" % listing) from None
    try:
        with Image.open(image_path) as img:
            width, height = img.size
    except OSError as exc:
        raise DataError("%s: cannot read the first image %s: %s" % (listing, image_path, exc)) from None
    return channels, height, width


def hdf5_dataset_shapes(listing, names):
    """Shapes of the datasets `names` in the first HDF5 file of an HDF5Data list file."""
    with open(listing) as f:
        files = [line.strip() for line in f if line.strip()]
    if not files:
        raise DataError("%s: the HDF5 file list is empty" % listing)
    try:
        import h5py
    except ImportError:
        raise DataError("%s: reading HDF5 needs the 'h5py' package (pip install h5py)" % listing) from None
    try:
        with h5py.File(files[0], "r") as h5:
            missing = [n for n in names if n not in h5]
            if missing:
                raise DataError("%s: has no dataset %s" % (files[0], ", ".join(missing)))
            return [h5[n].shape for n in names]
    except OSError as exc:
        raise DataError("%s: cannot open %s: %s" % (listing, files[0], exc)) from None
