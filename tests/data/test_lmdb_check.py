"""LMDB files checked page by page before LMDB maps them (data/lmdb_check.py): damage that would make LMDB read
outside a page or the file (a SIGBUS or an abort) is a DataError naming the file and the page."""
import struct

import pytest

from pycaffe_dist.data import lmdb_check
from pycaffe_dist.data.sources import open_writer
from pycaffe_dist.errors import DataError
from tests.conftest import GOLDEN

PAGE = 4096
LAST_PAGE, TXNID, ENTRIES, ROOT = 136, 144, 120, 128       # offsets of MDB_meta fields in a meta page


def database(tmp_path, values):
    with open_writer(tmp_path / "db", "lmdb") as writer:
        for i, value in enumerate(values):
            writer.put(b"%08d" % i, value)
    return tmp_path / "db" / "data.mdb"


def current_meta(data):
    """The offset of the meta page LMDB uses: the one with the larger txnid."""
    return max((0, PAGE), key=lambda at: struct.unpack_from("<Q", data, at + TXNID)[0])


def damaged(path, edit):
    data = bytearray(path.read_bytes())
    edit(data, current_meta(data))
    path.write_bytes(bytes(data))
    return path


def test_sound_files_pass(tmp_path):
    lmdb_check.check(GOLDEN / "solvers" / "sgd_momentum" / "train_lmdb" / "data.mdb")        # Caffe's own
    lmdb_check.check(database(tmp_path, [bytes(10000)] * 3 + [b"x"] * 500))    # overflow pages, branch pages
    lmdb_check.check(tmp_path / "none.mdb")          # missing: left to lmdb.open, which says so


def test_truncated_file(tmp_path):
    path = database(tmp_path, [bytes(100)] * 200)
    path.write_bytes(path.read_bytes()[:-PAGE])
    with pytest.raises(DataError, match=r"data.mdb: is damaged: its meta page says \d+ pages of 4096 bytes, the "
                       r"file holds \d+ bytes \(truncated\?\)"):
        lmdb_check.check(path)


def test_record_count_and_page_numbers(tmp_path):
    path = database(tmp_path, [bytes(100)] * 200)
    good = path.read_bytes()

    def set_u64(offset, value):
        return lambda data, meta: data.__setitem__(slice(meta + offset, meta + offset + 8), struct.pack("<Q", value))

    with pytest.raises(DataError, match=r"its meta page says 18446744073709551615 records, its leaf pages hold 200"):
        lmdb_check.check(damaged(path, set_u64(ENTRIES, 2 ** 64 - 1)))     # len() raised OverflowError
    path.write_bytes(good)
    with pytest.raises(DataError, match=r"the root refers to page 99999, outside pages 2\.\.\d+"):
        lmdb_check.check(damaged(path, set_u64(ROOT, 99999)))


def test_nodes_and_overflow_values(tmp_path):
    path = database(tmp_path, [bytes(10000)])
    good = path.read_bytes()
    meta = current_meta(good)
    root = struct.unpack_from("<Q", good, meta + ROOT)[0]
    (pointer,) = struct.unpack_from("<H", good, root * PAGE + 16)
    data = bytearray(good)
    data[root * PAGE + pointer:root * PAGE + pointer + 4] = struct.pack("<I", 10 ** 6)   # the value's size
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"page %d: a value of 1000000 bytes in 3 overflow pages" % root):
        lmdb_check.check(path)
    data = bytearray(good)
    data[root * PAGE + 16:root * PAGE + 18] = struct.pack("<H", PAGE - 4)                # a node past the page
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"page %d: a node lies outside the page" % root):
        lmdb_check.check(path)
