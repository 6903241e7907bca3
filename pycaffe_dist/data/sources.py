"""Data sources: the record stores Caffe reads (LMDB, LevelDB, datumfile).

A record store holds (key, value) pairs whose values are serialized `caffe.Datum`s. `open_records(path, backend)`
gives a `RecordSource` for any of the three stores:

- one pass in store order (`iter(source)`), the number of records (`len(source)`);
- `cycle(skip, shard, num_shards)`: the endless stream a Data layer reads. Caffe's DataReader/DataLayer reads the
  store front to back and seeks to the first record when its cursor runs off the end. Ours does the same over one
  shard: the records whose position p in store order has p % num_shards == shard. Deliberate difference: Caffe's
  multi-GPU Data layer deals records out by a running counter (offset % solver_count), so when the store size is
  not a multiple of the solver count a record moves to another solver at each epoch; our shards are fixed sets,
  the same in every epoch, as the distributed workers need.

`open_writer(path, backend)` creates a store and batches its writes as Caffe's db wrappers do (one LMDB transaction
or LevelDB write batch per 1000 puts).

The datumfile (SpeeDO's format, BVLC/caffe PR #2193, layout in tests/fixtures/reference/datumfile.md) is a plain file
of records back to back with no index; we keep an optional index side-file beside it (see `DatumFileSource`) so a
shard or a skip can seek straight to its records.
"""
import os
import shutil
import struct
import threading
import time

import numpy as np
from google.protobuf.message import DecodeError

from .._kernels import datum as _datum
from ..errors import DataError
from ..proto import caffe_pb2
from . import lmdb_check

DB = caffe_pb2.DataParameter
DATUMFILE_MAX_BUF = 104857600   # 100 MiB: larger length fields are corruption (reference/datumfile.md)
COMMIT_EVERY = 1000             # puts per transaction, as Caffe's convert tools commit
RECORDS_PER_GIL_RELEASE = 8     # see RecordSource.batches
_BACKENDS = {"lmdb": DB.LMDB, "leveldb": DB.LEVELDB, "datumfile": DB.DATUMFILE}
BACKEND_NAMES = {number: name for name, number in _BACKENDS.items()}


def backend_number(backend, where=""):
    """DataParameter.DB value of `backend`, given as that number or as "lmdb", "leveldb" or "datumfile"."""
    if isinstance(backend, str):
        number = _BACKENDS.get(backend.lower())
    else:
        number = backend if backend in BACKEND_NAMES else None
    if number is None:
        raise DataError("%s: unknown data backend %r (expected one of lmdb, leveldb, datumfile)"
                        % (where or "<source>", backend))
    return number


def parse_datum(value, where):
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except DecodeError as exc:
        raise DataError("%s: record is not a Caffe Datum: %s" % (where, exc)) from None
    return datum


class _SharedHandles:
    """Open LMDB environments and LevelDB handles, one per database per process, counted by their users.

    py-lmdb refuses to open an environment twice in one process and LevelDB locks a database to one handle, yet
    a TRAIN and a TEST net (Caffe's solvers/* goldens among them) read the same database, and a Data layer opens
    it once for its first record and again for its stream. Handles are shared for reading; threads each run
    their own read transactions or iterators.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._open = {}     # (kind of store, real path) -> [handle, users]

    def acquire(self, kind, path, opener):
        """(key for release, the shared handle), opening it with opener() for its first user. One path opened
        as two kinds of store gets two handles, so that the wrong kind fails in its own opener."""
        key = (kind, os.path.realpath(path))
        with self._lock:
            if key not in self._open:
                self._open[key] = [opener(), 0]
            entry = self._open[key]
            entry[1] += 1
            return key, entry[0]

    def release(self, key):
        with self._lock:
            entry = self._open[key]
            entry[1] -= 1
            if entry[1] == 0:
                del self._open[key]
                entry[0].close()


_HANDLES = _SharedHandles()


class RecordSource:
    """A record store opened for reading: len(), one pass by iter(), endless sharded passes by cycle().
    Attributes: path, backend (the DataParameter.DB number)."""
    kind = ""
    backend = None

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise DataError("%s: no such %s (file or directory not found)" % (self.path, self.kind))
        self._len = None

    def __len__(self):
        if self._len is None:
            self._len = self._count()
        return self._len

    def __iter__(self):
        return self._scan()

    def cycle(self, skip=0, shard=0, num_shards=1):
        """Endless (key, value) over shard `shard` of `num_shards`, from its skip-th record (mod its size)."""
        return self._cycle(self._first(skip, shard, num_shards), shard, num_shards, len(self))

    def batches(self, batch_size, skip=0, shard=0, num_shards=1):
        """Endless lists of `batch_size` (key, value) records, in cycle()'s order. The store is checked here, in
        the caller's thread (a data layer's setup), not at the first batch."""
        return self._batches(self.cycle(skip, shard, num_shards), batch_size)

    @staticmethod
    def _batches(cursor, batch_size):
        while True:
            batch = []
            for i in range(batch_size):
                batch.append(next(cursor))
                # The prefetch thread reads in Python, holding the GIL between records, and the training thread,
                # back from a kernel that released it, would wait for the whole batch (CPython hands the GIL
                # over only every 5 ms). Give it up for a moment now and then.
                if i % RECORDS_PER_GIL_RELEASE == RECORDS_PER_GIL_RELEASE - 1:
                    time.sleep(0)
            yield batch

    def _first(self, skip, shard, num_shards):
        """The position cycle() starts at, after checking the shard exists and is not empty."""
        if num_shards < 1 or not 0 <= shard < num_shards:
            raise DataError("%s: shard %d of %d does not exist (0 <= shard < num_shards)"
                            % (self.path, shard, num_shards))
        count = len(self)
        size = len(range(shard, count, num_shards))
        if size == 0:
            raise DataError("%s: shard %d of %d is empty: the %s holds %d records"
                            % (self.path, shard, num_shards, self.kind, count))
        return shard + (skip % size) * num_shards

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<%s %s>" % (type(self).__name__, self.path)


class LmdbSource(RecordSource):
    """An LMDB environment (Caffe's: a directory with data.mdb; a single-file LMDB works too), read-only, no lock.

    Caffe opens it MDB_RDONLY | MDB_NOTLS; lock=False here also lets readers use read-only media (the golden
    databases) and other threads (the prefetcher) without a lock file.
    """
    kind = "LMDB database"
    backend = DB.LMDB
    env = None

    def __init__(self, path):
        super().__init__(path)
        self._key, self.env = _HANDLES.acquire(self.kind, self.path, self._open_env)

    def _open_env(self):
        import lmdb
        subdir = os.path.isdir(self.path)
        # LMDB trusts its file: a damaged one could crash the process (SIGBUS) where it should be a DataError
        lmdb_check.check(os.path.join(self.path, "data.mdb") if subdir else self.path)
        try:
            return lmdb.open(self.path, readonly=True, lock=False, readahead=False, subdir=subdir)
        except lmdb.Error as exc:
            raise DataError("%s: cannot open LMDB: %s" % (self.path, exc)) from None

    def _damaged(self, position, exc):
        """LMDB's error reading a damaged database (MDB_CORRUPTED, MDB_PAGE_NOTFOUND, ...) as ours."""
        return DataError("%s: the LMDB database is damaged (at record %d): %s" % (self.path, position, exc))

    def _count(self):
        import lmdb
        try:
            return self.env.stat()["entries"]
        except lmdb.Error as exc:
            raise self._damaged(0, exc) from None

    def _scan(self):
        import lmdb
        position = 0
        try:
            with self.env.begin(buffers=False) as txn:
                for record in txn.cursor():
                    yield record
                    position += 1
        except lmdb.Error as exc:
            raise self._damaged(position, exc) from None

    def _cycle(self, start, shard, step, count):
        """Cursor steps over foreign records without copying their values."""
        import lmdb
        position = 0
        try:
            with self.env.begin(buffers=False) as txn:
                cursor = txn.cursor()
                position, wanted = 0, start
                cursor.first()
                while True:
                    while position < wanted:
                        cursor.next()
                        position += 1
                    if not cursor.key():
                        raise DataError("%s: LMDB ended at record %d although it says it holds %d"
                                        % (self.path, position, count))
                    yield cursor.key(), cursor.value()
                    wanted += step
                    if wanted >= count:
                        cursor.first()
                        position, wanted = 0, shard
        except lmdb.Error as exc:
            raise self._damaged(position, exc) from None

    def close(self):
        if self.env is not None:
            self.env = None
            _HANDLES.release(self._key)

    __del__ = close


class LevelDBSource(RecordSource):
    """A LevelDB directory (plyvel). LevelDB locks a database to one process, as in Caffe."""
    kind = "LevelDB database"
    backend = DB.LEVELDB
    db = None

    def __init__(self, path):
        super().__init__(path)
        self._key, self.db = _HANDLES.acquire(self.kind, self.path, self._open_db)

    def _open_db(self):
        import plyvel
        try:
            return plyvel.DB(self.path, create_if_missing=False)
        except plyvel.Error as exc:
            raise DataError("%s: cannot open LevelDB: %s" % (self.path, exc)) from None

    def _damaged(self, position, exc):
        """LevelDB's error reading a damaged database (plyvel.CorruptionError, IOError) as ours."""
        return DataError("%s: the LevelDB database is damaged (at record %d): %s" % (self.path, position, exc))

    def _count(self):
        import plyvel
        count = 0
        try:
            for _ in self.db.iterator(include_value=False):
                count += 1
        except plyvel.Error as exc:
            raise self._damaged(count, exc) from None
        return count

    def _scan(self):
        import plyvel
        position = 0
        try:
            for record in self.db.iterator():
                yield record
                position += 1
        except plyvel.Error as exc:
            raise self._damaged(position, exc) from None

    def _cycle(self, start, shard, step, count):
        """A raw iterator steps over foreign records without copying their values."""
        import plyvel
        position = 0
        try:
            it = self.db.raw_iterator()
            position, wanted = 0, start
            it.seek_to_first()
            while True:
                while position < wanted:
                    it.next()
                    position += 1
                if not it.valid():
                    raise DataError("%s: LevelDB ended at record %d although it held %d"
                                    % (self.path, position, count))
                yield it.key(), it.value()
                wanted += step
                if wanted >= count:
                    it.seek_to_first()
                    position, wanted = 0, shard
        except plyvel.Error as exc:
            raise self._damaged(position, exc) from None

    def close(self):
        if self.db is not None:
            self.db = None
            _HANDLES.release(self._key)

    __del__ = close


_U32 = struct.Struct("<I")
_INDEX_MAGIC = b"PCDIDX01"
_INDEX_HEAD = struct.Struct("<8sQqQ")   # magic, source size, source mtime_ns, record count


class DatumFileSource(RecordSource):
    """A datumfile: records (u32 record_size, u32 key_size, key, u32 value_size, value), little-endian, no header.

    Reading checks every length field against DATUMFILE_MAX_BUF before reading what it announces, and that
    record_size == key_size + value_size + 8 (deliberate difference: Caffe's reader ignores record_size except at
    end of file; the only writers, Caffe's and ours, always write it so, and the check catches corruption). A
    partial record, even a 1-3 byte tail, is an error naming the file and the byte offset (Caffe takes a tail of
    fewer than 4 bytes for end of file).

    Index side-file `<path>.idx`, built on demand (first len() or cycle()) and rebuilt when stale: a 32-byte
    header struct "<8sQqQ" = (magic b"PCDIDX01", size of the datumfile in bytes, its st_mtime_ns, record count N),
    then N uint64 LE byte offsets of the records. It is stale when the datumfile's size or mtime_ns differ or its
    length is not 32 + 8 N, and damaged when its offsets do not start at 0, grow by 12 bytes or more, and stay
    inside the datumfile; either way it is rebuilt. Building it walks the record_size fields only. Where it cannot
    be written (read-only directory) the offsets are kept in memory only.
    """
    kind = "datumfile"
    backend = DB.DATUMFILE

    def __init__(self, path):
        super().__init__(path)
        if not os.path.isfile(self.path):
            raise DataError("%s: a datumfile is a single regular file, not a directory" % self.path)
        self._offsets = None

    # -- reading records -------------------------------------------------------------------------------------
    def _length(self, raw, what, offset, index):
        """A length field: all 4 bytes present and at most DATUMFILE_MAX_BUF, checked before anything is read."""
        if len(raw) < 4:
            raise DataError("%s: record %d at byte %d is truncated (reading its %s)" % (self.path, index, offset, what))
        (n,) = _U32.unpack(raw)
        if n > DATUMFILE_MAX_BUF:
            raise DataError("%s: record %d at byte %d: %s %d exceeds %d; not a datumfile or corrupt"
                            % (self.path, index, offset, what, n, DATUMFILE_MAX_BUF))
        return n

    def _read_record(self, f, offset, index):
        """The record at `offset` (f positioned there) as (key, value), or None at a clean end of file."""
        head = f.read(8)
        if not head:
            return None
        record_size = self._length(head[:4], "record size", offset, index)
        key = f.read(self._length(head[4:], "key size", offset, index))
        value_size = self._length(f.read(4), "value size", offset, index)
        value = f.read(value_size)
        if len(value) < value_size:
            raise DataError("%s: record %d at byte %d is truncated (value of %d bytes, %d present)"
                            % (self.path, index, offset, value_size, len(value)))
        if record_size != len(key) + value_size + 8:
            raise DataError("%s: record %d at byte %d: record size %d but key (%d bytes) and value (%d bytes) "
                            "take %d; corrupt" % (self.path, index, offset, record_size, len(key), value_size,
                                                  len(key) + value_size + 8))
        return key, value

    def _open(self):
        try:
            return open(self.path, "rb", buffering=1 << 20)
        except OSError as exc:
            raise DataError("%s: cannot open datumfile: %s" % (self.path, exc.strerror)) from None

    def _scan(self):
        with self._open() as f:
            index, offset = 0, 0
            while True:
                record = self._read_record(f, offset, index)
                if record is None:
                    return
                yield record
                index, offset = index + 1, offset + 12 + len(record[0]) + len(record[1])

    def _cycle(self, start, shard, step, count):
        offsets = self.offsets()
        with self._open() as f:
            position = start
            while True:
                yield self._record_at(f, offsets, position)
                position += step
                if position >= count:
                    position = shard

    def batches(self, batch_size, skip=0, shard=0, num_shards=1):
        """cycle()'s records, batch_size at a time: each run of consecutive records is one read, split in C
        (csrc/datum.pyx) with the checks _read_record makes; where one fails, record by record for its message."""
        position = self._first(skip, shard, num_shards)
        offsets = self.offsets()
        return self._run_batches(offsets, position, batch_size, shard, num_shards)

    def _run_batches(self, offsets, position, batch_size, shard, num_shards):
        count = len(offsets)
        with self._open() as f:
            file_size = os.fstat(f.fileno()).st_size
            while True:
                batch = []
                while len(batch) < batch_size:
                    # consecutive records up to the batch's end or the file's (a shard's are apart: one each)
                    n = min(batch_size - len(batch), count - position) if num_shards == 1 else 1
                    batch.extend(self._read_run(f, offsets, position, n, file_size))
                    position += n * num_shards
                    if position >= count:
                        position = shard
                yield batch

    def _read_run(self, f, offsets, first, n, file_size):
        begin = int(offsets[first])
        end = int(offsets[first + n]) if first + n < len(offsets) else file_size
        f.seek(begin)
        run = f.read(max(0, end - begin))
        records = _datum.split_records(run, n, DATUMFILE_MAX_BUF) if len(run) == end - begin else None
        if records is not None:
            return records
        # a check failed: record by record, for the message that names the bad one
        return [self._record_at(f, offsets, position) for position in range(first, first + n)]

    def _record_at(self, f, offsets, position):
        offset = int(offsets[position])
        f.seek(offset)
        record = self._read_record(f, offset, position)
        if record is None:
            raise DataError("%s: ends before record %d at byte %d; the datumfile changed while read"
                            % (self.path, position, offset))
        return record

    def __len__(self):
        return len(self.offsets())

    # -- the index -------------------------------------------------------------------------------------------
    def offsets(self):
        """Byte offsets of all records (uint64 array), from the index side-file or a fresh scan."""
        stat = os.stat(self.path)
        if self._offsets is not None and self._offsets_for == (stat.st_size, stat.st_mtime_ns):
            return self._offsets
        offsets = self._load_index(stat)
        if offsets is None:
            offsets = self._build_index(stat.st_size)
            self._save_index(stat, offsets)
        self._offsets, self._offsets_for = offsets, (stat.st_size, stat.st_mtime_ns)
        return offsets

    @property
    def index_path(self):
        return self.path + ".idx"

    def _load_index(self, stat):
        try:
            with open(self.index_path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        if len(data) < _INDEX_HEAD.size:
            return None
        magic, size, mtime_ns, count = _INDEX_HEAD.unpack_from(data)
        if (magic != _INDEX_MAGIC or (size, mtime_ns) != (stat.st_size, stat.st_mtime_ns)
                or len(data) != _INDEX_HEAD.size + 8 * count):
            return None
        offsets = np.frombuffer(data, dtype="<u8", offset=_INDEX_HEAD.size)
        # A damaged index with a fitting header: records start at 0, each at least 12 bytes after the one before,
        # all inside the file. Otherwise it is rebuilt, as a stale one is.
        # (in uint64, all below the size first, so that adding 12 cannot wrap: int64 differences could)
        if count and (offsets[0] != 0 or not (offsets < size).all() or not (offsets[1:] >= offsets[:-1] + 12).all()):
            return None
        return offsets

    def _build_index(self, file_size):
        """Walk the record_size fields; a record running past the end of the file is reported here."""
        offsets = []
        with self._open() as f:
            offset = 0
            while offset < file_size:
                record_size = self._length(f.read(4), "record size", offset, len(offsets))
                if record_size < 8:
                    raise DataError("%s: record %d at byte %d: record size %d is less than 8; corrupt"
                                    % (self.path, len(offsets), offset, record_size))
                end = offset + 4 + record_size
                if end > file_size:
                    raise DataError("%s: record %d at byte %d is truncated (%d bytes announced, %d present)"
                                    % (self.path, len(offsets), offset, record_size, file_size - offset - 4))
                offsets.append(offset)
                f.seek(end)
                offset = end
        return np.array(offsets, dtype="<u8")

    def _save_index(self, stat, offsets):
        temp = "%s.%d.tmp" % (self.index_path, os.getpid())
        try:
            with open(temp, "wb") as f:
                f.write(_INDEX_HEAD.pack(_INDEX_MAGIC, stat.st_size, stat.st_mtime_ns, len(offsets)))
                f.write(offsets.tobytes())
            os.replace(temp, self.index_path)
        except OSError:
            try:
                os.unlink(temp)
            except OSError:
                pass


_SOURCES = {DB.LMDB: LmdbSource, DB.LEVELDB: LevelDBSource, DB.DATUMFILE: DatumFileSource}


def open_records(path, backend):
    """The record store at `path` for reading; backend: DataParameter.DB number or its lower-case name."""
    return _SOURCES[backend_number(backend, path)](path)


def iter_records(source, backend):
    """(key, value) of every record of a store, in store order, closing the store at the end."""
    with open_records(source, backend) as records:
        yield from records


def first_datum(records):
    """The first Datum of an open RecordSource (what a Data layer learns its shapes from)."""
    for key, value in records:
        return parse_datum(value, "%s: record %r" % (records.path, key))
    raise DataError("%s: the database holds no records" % records.path)


# -- writers ---------------------------------------------------------------------------------------------------
class RecordWriter:
    """A new record store: put(key, value) in order, close() (also as a context manager) to finish it.

    The store must not exist, as Caffe's db wrappers refuse (LMDB: mkdir fails; LevelDB: error_if_exists), unless
    overwrite=True, which removes an existing store of the same kind first (and nothing else).
    """
    kind = ""

    def __init__(self, path, overwrite=False):
        self.path = os.fspath(path)
        if os.path.lexists(self.path):
            if not overwrite:
                raise DataError("%s: already exists; refusing to overwrite it" % self.path)
            if not self._is_own_kind():
                raise DataError("%s: exists and is not a %s; refusing to overwrite it" % (self.path, self.kind))
            self._remove()
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise DataError("%s: cannot create the %s: no directory %s" % (self.path, self.kind, parent))
        self.count = 0
        self._batch = []

    def put(self, key, value):
        self._batch.append((key, value))
        self.count += 1
        if len(self._batch) >= COMMIT_EVERY:
            self.commit()

    def commit(self):
        if self._batch:
            self._write(self._batch)
            self._batch = []

    def close(self):
        self.commit()
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is None:
            self.close()
        else:
            self._close()

    def _remove(self):
        shutil.rmtree(self.path)


class LmdbWriter(RecordWriter):
    """A new LMDB directory (data.mdb, lock.mdb) as Caffe's db_lmdb: when a commit finds the map full, the map
    size is doubled and the batch written again (Caffe's LMDBTransaction::DoubleMapSize)."""
    kind = "LMDB database"

    def __init__(self, path, overwrite=False, map_size=1 << 26):
        super().__init__(path, overwrite)
        import lmdb
        self._lmdb = lmdb
        try:
            os.mkdir(self.path)
            self.env = lmdb.open(self.path, map_size=map_size, subdir=True, readahead=False)
        except (OSError, lmdb.Error) as exc:
            raise DataError("%s: cannot create LMDB: %s" % (self.path, exc)) from None

    def _is_own_kind(self):
        return os.path.isfile(os.path.join(self.path, "data.mdb"))

    def _write(self, batch):
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in batch:
                        txn.put(key, value)
                return
            except self._lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def _close(self):
        self.env.close()


class LevelDBWriter(RecordWriter):
    """A new LevelDB directory, with Caffe's options (64 KiB blocks, 256 MiB write buffer) and a write batch
    per commit."""
    kind = "LevelDB database"

    def __init__(self, path, overwrite=False):
        super().__init__(path, overwrite)
        import plyvel
        try:
            self.db = plyvel.DB(self.path, create_if_missing=True, error_if_exists=True, block_size=65536,
                                write_buffer_size=268435456, max_open_files=100)
        except plyvel.Error as exc:
            raise DataError("%s: cannot create LevelDB: %s" % (self.path, exc)) from None

    def _is_own_kind(self):
        return os.path.isfile(os.path.join(self.path, "CURRENT"))

    def _write(self, batch):
        with self.db.write_batch() as wb:
            for key, value in batch:
                wb.put(key, value)

    def _close(self):
        self.db.close()


class DatumFileWriter(RecordWriter):
    """A new datumfile, records appended in put order (Caffe's DatumFileTransaction::Put); a stale index
    side-file of an overwritten datumfile is removed."""
    kind = "datumfile"

    def __init__(self, path, overwrite=False):
        super().__init__(path, overwrite)
        try:
            self.file = open(self.path, "xb")
        except OSError as exc:
            raise DataError("%s: cannot create datumfile: %s" % (self.path, exc.strerror)) from None

    def _is_own_kind(self):
        return os.path.isfile(self.path)

    def _remove(self):
        os.unlink(self.path)
        if os.path.exists(self.path + ".idx"):
            os.unlink(self.path + ".idx")

    def _write(self, batch):
        parts = []
        for key, value in batch:
            if len(key) > DATUMFILE_MAX_BUF or len(value) > DATUMFILE_MAX_BUF:
                raise DataError("%s: record %r of %d bytes exceeds the datumfile limit %d"
                                % (self.path, key, len(value), DATUMFILE_MAX_BUF))
            parts += [_U32.pack(len(key) + len(value) + 8), _U32.pack(len(key)), key, _U32.pack(len(value)), value]
        self.file.write(b"".join(parts))

    def _close(self):
        self.file.close()


_WRITERS = {DB.LMDB: LmdbWriter, DB.LEVELDB: LevelDBWriter, DB.DATUMFILE: DatumFileWriter}


def open_writer(path, backend, overwrite=False):
    """A new record store at `path`; backend: DataParameter.DB number or its lower-case name."""
    return _WRITERS[backend_number(backend, path)](path, overwrite)


# -- shapes for layer setup ------------------------------------------------------------------------------------
