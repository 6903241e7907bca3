"""An LMDB data file checked page by page before LMDB maps it, so that a damaged file is a DataError and not a
crash.

LMDB trusts its file: it reads pages and nodes through a memory map without checking where they point, and a
damaged node size or page number reads past the end of the file, a SIGBUS (or SIGSEGV) that kills the process
(found by tests/fuzz; Caffe, on the same LMDB, dies the same way). `check(data_path)` walks the main database's
B-tree as LMDB would (lmdb's mdb.c; a 64-bit build, the only kind Caffe writes on x86-64 or ARM64) and refuses
anything that would make it read outside a page or outside the file:

- the meta pages (0 and 1): the one with the larger txnid is used; its page size is a power of two, and its last
  page (mm_last_pg) lies inside the file;
- every branch and leaf page reachable from the root: its number is in 2..mm_last_pg and in its own header, each
  page is reached once, its node pointers and nodes (header, key, inline value) lie inside the page, a branch
  page has two nodes or more (LMDB asserts it: an abort);
- every value in overflow pages: the first page is in range and is an overflow page, its run of pages ends by
  mm_last_pg, and the value fits in it;
- the number of records the meta page gives (md_entries, which len() reports) is the number the leaves hold.

Caffe's databases are plain key/value B-trees; sub-databases and duplicate keys (LMDB's DUPSORT) are refused as
not Caffe's. The walk reads every branch and leaf page once (not the overflow pages' values), with numpy per page:
about 0.3 s for a Fashion-MNIST LMDB of 60000 records (once per process: handles are shared).
"""
import mmap
import os
import struct

import numpy as np

from ..errors import DataError

# A meta page: the page header (pgno, pad, flags, lower, upper), then MDB_meta: magic, version, address, mapsize,
# the free DB (md_pad holds the page size, flags, depth, branch/leaf/overflow pages, entries, root), the main DB
# (the same), mm_last_pg, mm_txnid.
_META = struct.Struct("<QHHHH IIQQ IHH5Q IHH5Q QQ")
_MAGIC = 0xBEEFC0DE
_HEADER = 16                        # PAGEHDRSZ
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_LEAF2, _P_SUBP = 0x01, 0x02, 0x04, 0x08, 0x20, 0x40
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_P_INVALID = 2 ** 64 - 1
_PAGE = struct.Struct("<QHHHH")


def check(data_path):
    """Raise DataError naming the file and the page where the LMDB file at `data_path` would make LMDB read out
    of bounds; return quietly for a sound file, and for one LMDB refuses by itself (missing, not LMDB)."""
    try:
        with open(data_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _META.size:
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                _Walk(data_path, data, size).run()
    except DataError:
        raise                       # what the walk found (a ValueError too: errors.py)
    except (OSError, ValueError):
        return                      # unreadable or empty: lmdb.open says what is wrong


class _Walk:
    def __init__(self, path, data, size):
        self.path, self.data, self.size = path, data, size

    def fail(self, message, *args):
        raise DataError("%s: is damaged: %s" % (self.path, message % args))

    def run(self):
        metas = [_META.unpack_from(self.data, 0)]
        psize = metas[0][9]
        if psize >= _META.size and psize + _META.size <= self.size:
            metas.append(_META.unpack_from(self.data, psize))
        metas = [m for m in metas if m[5] == _MAGIC]
        if not metas:
            return                  # not LMDB: lmdb.open refuses it
        meta = max(metas, key=lambda m: m[-1])
        psize, last_page = meta[9], meta[-2]
        if psize < 512 or psize > 65536 or psize & (psize - 1):
            self.fail("page size %d in its meta page", psize)
        if (last_page + 1) * psize > self.size:
            self.fail("its meta page says %d pages of %d bytes, the file holds %d bytes (truncated?)",
                      last_page + 1, psize, self.size)
        self.psize, self.last_page = psize, last_page
        flags, root = meta[18], meta[24]
        if flags & 0x04:            # MDB_DUPSORT on the main database
            self.fail("its main database has duplicate keys (DUPSORT): not a Caffe database")
        self.records = 0
        if root != _P_INVALID:
            self.tree(root)
        if self.records != meta[23]:    # md_entries: what len() of the source says
            self.fail("its meta page says %d records, its leaf pages hold %d", meta[23], self.records)

    def page(self, pgno, what):
        if not 2 <= pgno <= self.last_page:
            self.fail("%s refers to page %d, outside pages 2..%d", what, pgno, self.last_page)
        number, _, flags, lower, upper = _PAGE.unpack_from(self.data, pgno * self.psize)
        if number != pgno:
            self.fail("page %d says it is page %d", pgno, number)
        return flags, lower, upper

    def tree(self, root):
        seen, todo = set(), [(root, "the root")]
        while todo:
            pgno, what = todo.pop()
            if pgno in seen:
                self.fail("page %d is reached twice", pgno)
            seen.add(pgno)
            flags, lower, upper = self.page(pgno, what)
            kind = flags & (_P_BRANCH | _P_LEAF | _P_LEAF2 | _P_SUBP | _P_OVERFLOW | _P_META)
            if kind not in (_P_BRANCH, _P_LEAF):
                self.fail("page %d has flags 0x%x, expected a branch or leaf page", pgno, flags)
            lo, hi, node_flags, ksize, ptrs = self.nodes(pgno, lower, upper)
            if kind == _P_BRANCH:
                if len(ptrs) < 2:        # mdb_page_search_root asserts it (an abort, not an error)
                    self.fail("branch page %d has %d node(s), fewer than 2", pgno, len(ptrs))
                children = lo.astype(np.uint64) | (hi.astype(np.uint64) << 16) | (node_flags.astype(np.uint64) << 32)
                todo.extend((int(child), "branch page %d" % pgno) for child in children)
            else:
                self.leaf(pgno, lo.astype(np.int64) | (hi.astype(np.int64) << 16), node_flags, ksize, ptrs)

    def nodes(self, pgno, lower, upper):
        """The node headers of a page, each inside the page: (lo, hi, flags, key size, node offset) arrays."""
        psize = self.psize
        if not _HEADER <= lower <= upper <= psize or (lower - _HEADER) % 2:
            self.fail("page %d: lower %d, upper %d do not fit a page of %d bytes", pgno, lower, upper, psize)
        base = pgno * psize
        count = (lower - _HEADER) // 2
        ptrs = np.frombuffer(self.data, "<u2", count, base + _HEADER).astype(np.int64)
        if count and (ptrs.min() < upper or ptrs.max() + 8 > psize):
            self.fail("page %d: a node lies outside the page", pgno)
        heads = np.frombuffer(self.data, np.uint8, psize, base)[ptrs[:, None] + np.arange(8)].copy()
        lo, hi, node_flags, ksize = heads.view("<u2").T
        if count and (ptrs + 8 + ksize).max() > psize:
            self.fail("page %d: a key runs past the page", pgno)
        return lo, hi, node_flags, ksize, ptrs

    def leaf(self, pgno, dsize, node_flags, ksize, ptrs):
        self.records += len(ptrs)
        if (node_flags & (_F_SUBDATA | _F_DUPDATA)).any():
            self.fail("page %d: sub-databases or duplicate keys: not a Caffe database", pgno)
        big = (node_flags & _F_BIGDATA) != 0
        ends = ptrs + 8 + ksize + np.where(big, 8, dsize)
        if len(ends) and ends.max() > self.psize:
            self.fail("page %d: a value runs past the page", pgno)
        base = pgno * self.psize
        for i in np.flatnonzero(big):
            start = base + int(ptrs[i]) + 8 + int(ksize[i])
            (first,) = struct.unpack_from("<Q", self.data, start)
            flags, _, _ = self.page(first, "a value on page %d" % pgno)
            (pages,) = struct.unpack_from("<I", self.data, first * self.psize + 12)
            if not flags & _P_OVERFLOW or pages < 1 or first + pages > self.last_page + 1:
                self.fail("page %d: a value in overflow pages %d.. (%d pages) that are not", pgno, first, pages)
            if dsize[i] > pages * self.psize - _HEADER:
                self.fail("page %d: a value of %d bytes in %d overflow pages", pgno, dsize[i], pages)
