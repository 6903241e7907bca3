"""IDX files (data/idx.py): headers that declare more than the file or an array can hold."""
import gzip
import struct

import pytest

from pycaffe_dist.data.idx import read_idx
from pycaffe_dist.errors import DataError


def test_a_header_of_more_items_than_an_array_holds(tmp_path):
    """0 x 2^32-1 x 2^32-1 items: the file fits (no items), numpy's reshape raised ValueError (found by
    tests/fuzz)."""
    (tmp_path / "x").write_bytes(struct.pack(">I3I", 0x0803, 0, 2 ** 32 - 1, 2 ** 32 - 1))
    with pytest.raises(DataError, match=r"x: header says 0 x 4294967295 x 4294967295 items: more than an array"):
        read_idx(tmp_path / "x")


def test_gzip_is_read_no_further_than_the_header_declares(tmp_path):
    header = struct.pack(">I3I", 0x0803, 2, 2, 2)
    (tmp_path / "long.gz").write_bytes(gzip.compress(header + bytes(8 + 10 ** 6)))
    with pytest.raises(DataError, match=r"long.gz: header says 2 x 2 x 2 items of 1 bytes: expected 24 bytes "
                       r"\(with the header\), the file holds 25"):
        read_idx(tmp_path / "long.gz")
    (tmp_path / "big.gz").write_bytes(gzip.compress(struct.pack(">I3I", 0x0803, 2 ** 32 - 1, 2 ** 32 - 1, 9)))
    with pytest.raises(DataError, match=r"the file holds 16"):            # read(n) allocated n bytes first
        read_idx(tmp_path / "big.gz")
    (tmp_path / "ok.gz").write_bytes(gzip.compress(header + bytes(range(8))))
    assert read_idx(tmp_path / "ok.gz").tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


def test_a_file_name_with_a_nul_byte():
    with pytest.raises(DataError, match=r"'x\\x00': cannot read: embedded null byte"):
        read_idx("x\0")
