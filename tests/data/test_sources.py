"""Record stores: Caffe's own LMDB, round trips per backend, sharded cycles, the datumfile format and its index."""
import os
import struct

import numpy as np
import pytest

from pycaffe_dist.data import sources
from pycaffe_dist.data.sources import DATUMFILE_MAX_BUF, open_records, open_writer
from pycaffe_dist.errors import DataError
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, load_npz

CAFFE_LMDB = GOLDEN / "solvers" / "sgd_momentum" / "train_lmdb"
BACKENDS = ["lmdb", "leveldb", "datumfile"]


def records(n, seed=0):
    """n records with sorted keys (so every backend keeps this order) and binary values of varied length."""
    rng = np.random.default_rng(seed)
    return [(b"%08d_k" % i, rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes())
            for i in range(n)]


def one_pass(source):
    """The records of one pass (a comprehension: list() would ask len() first, building a datumfile's index)."""
    return [record for record in source]


def write(path, backend, recs):
    with open_writer(path, backend) as writer:
        for key, value in recs:
            writer.put(key, value)


def test_caffe_written_lmdb_reads_back_exactly():
    expected = load_npz(CAFFE_LMDB.parent / "records.npz")
    with open_records(CAFFE_LMDB, caffe_pb2.DataParameter.LMDB) as source:
        assert len(source) == 256
        got = [(key, sources.parse_datum(value, key)) for key, value in source]
    assert [key for key, _ in got] == [b"%08d" % i for i in range(256)]
    for i, (key, datum) in enumerate(got):
        assert (datum.channels, datum.height, datum.width, datum.encoded) == (1, 4, 4, False)
        assert np.frombuffer(datum.data, np.uint8).reshape(1, 4, 4).tolist() == expected["images"][i].tolist()
        assert datum.label == expected["labels"][i]


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip(tmp_path, backend):
    recs = records(2500)        # more than one commit batch
    path = tmp_path / backend
    write(path, backend, recs)
    with open_records(str(path), backend) as source:
        assert len(source) == 2500 and source.backend == sources.backend_number(backend)
        assert list(source) == recs
        assert list(source) == recs      # a second pass starts again from the first record
    assert list(sources.iter_records(str(path), backend)) == recs


@pytest.mark.parametrize("backend", BACKENDS)
def test_shards_are_disjoint_cover_all_and_stable_across_epochs(tmp_path, backend):
    recs = records(101)
    path = tmp_path / backend
    write(path, backend, recs)
    num_shards = 4
    seen = []
    with open_records(path, backend) as source:
        for shard in range(num_shards):
            mine = recs[shard::num_shards]
            stream = source.cycle(shard=shard, num_shards=num_shards)
            epochs = [[next(stream) for _ in mine] for _ in range(3)]
            assert epochs[0] == epochs[1] == epochs[2] == mine
            seen += epochs[0]
            skipped = source.cycle(skip=7, shard=shard, num_shards=num_shards)
            assert [next(skipped) for _ in range(len(mine) + 3)] == (mine[7:] + mine + mine)[:len(mine) + 3]
        assert sorted(seen) == recs
        whole = source.cycle(skip=100 + 101)    # skip wraps modulo the shard size, as Caffe's cursor wraps
        assert [next(whole) for _ in range(3)] == [recs[100], recs[0], recs[1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_follow_the_cycle(tmp_path, backend):
    recs = records(101)
    path = tmp_path / backend
    write(path, backend, recs)
    with open_records(path, backend) as source:
        for skip, shard, num_shards, batch_size in [(0, 0, 1, 40), (95, 0, 1, 7), (3, 2, 3, 16), (0, 0, 1, 250)]:
            cycle = source.cycle(skip, shard, num_shards)
            batches = source.batches(batch_size, skip, shard, num_shards)
            for _ in range(4):
                assert next(batches) == [next(cycle) for _ in range(batch_size)]


def test_datumfile_batches_name_a_corrupt_record(tmp_path):
    recs = records(5)
    data = hand_built(recs)
    third = sum(12 + len(k) + len(v) for k, v in recs[:2])
    # record 2's value size says 1 byte more than its record size allows; the index (record sizes) is fine
    key_size = len(recs[2][0])
    corrupt = bytearray(data)
    struct.pack_into("<I", corrupt, third + 8 + key_size, len(recs[2][1]) + 1)
    (tmp_path / "bad").write_bytes(bytes(corrupt))
    batches = open_records(tmp_path / "bad", "datumfile").batches(4)
    with pytest.raises(DataError, match=r"bad: record 2 at byte %d: record size %d but key \(%d bytes\) and value "
                       r"\(%d bytes\)" % (third, 8 + key_size + len(recs[2][1]), key_size, len(recs[2][1]) + 1)):
        next(batches)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_shard_and_bad_shard_are_errors(tmp_path, backend):
    path = tmp_path / backend
    write(path, backend, records(3))
    with open_records(path, backend) as source:
        with pytest.raises(DataError, match=r"%s: shard 3 of 5 is empty: the .* holds 3 records" % path):
            source.cycle(shard=3, num_shards=5)
        with pytest.raises(DataError, match=r"shard 2 of 2 does not exist"):
            source.cycle(shard=2, num_shards=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_source_names_the_path(tmp_path, backend):
    with pytest.raises(DataError, match=r"%s: no such " % (tmp_path / "nope")):
        open_records(tmp_path / "nope", backend)


def test_backend_names_and_numbers(tmp_path):
    write(tmp_path / "d", caffe_pb2.DataParameter.DATUMFILE, records(2))
    source = open_records(tmp_path / "d", "DatumFile")
    assert len(source) == 2 and source.path == str(tmp_path / "d")
    assert source.backend == caffe_pb2.DataParameter.DATUMFILE
    with pytest.raises(DataError, match=r"unknown data backend 'hdf5' \(expected one of lmdb, leveldb, datumfile\)"):
        open_records(tmp_path / "d", "hdf5")
    with pytest.raises(DataError, match=r"unknown data backend 7"):
        open_records(tmp_path / "d", 7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_writer_refuses_to_overwrite(tmp_path, backend):
    path = tmp_path / backend
    write(path, backend, records(5))
    with pytest.raises(DataError, match=r"%s: already exists; refusing to overwrite it" % path):
        open_writer(path, backend)
    write_over = records(2, seed=1)
    with open_writer(path, backend, overwrite=True) as writer:
        for key, value in write_over:
            writer.put(key, value)
    assert list(open_records(path, backend)) == write_over
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(DataError, match=r"notes: exists and is not a .*; refusing to overwrite it"):
        open_writer(tmp_path / "notes", backend, overwrite=True)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_lmdb_map_grows_when_full(tmp_path):
    recs = [(b"%06d" % i, bytes([i % 256]) * 1000) for i in range(3000)]   # ~3 MB into a 64 KiB map
    with sources.LmdbWriter(tmp_path / "db", map_size=1 << 16) as writer:
        for key, value in recs:
            writer.put(key, value)
    assert list(open_records(tmp_path / "db", "lmdb")) == recs


# -- the datumfile format ----------------------------------------------------------------------------------------
def hand_built(recs):
    """The bytes of a datumfile, built from the format note: (u32 8+|k|+|v|, u32 |k|, k, u32 |v|, v), LE."""
    return b"".join(struct.pack("<II", 8 + len(k) + len(v), len(k)) + k + struct.pack("<I", len(v)) + v
                    for k, v in recs)


def note_reader(data):
    """A reader written from tests/fixtures/reference/datumfile.md alone ("Minimal Python reader")."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        (ks,) = struct.unpack("<I", data[pos + 4:pos + 8])
        key = data[pos + 8:pos + 8 + ks]
        (vs,) = struct.unpack("<I", data[pos + 8 + ks:pos + 12 + ks])
        out.append((key, data[pos + 12 + ks:pos + 12 + ks + vs]))
        pos += 12 + ks + vs
    return out


def test_datumfile_is_byte_compatible_with_the_format_note(tmp_path):
    datum = caffe_pb2.Datum(channels=1, height=2, width=2, data=b"\x00\x01\x02\xff", label=7)
    recs = [(b"00000000_a.jpg", datum.SerializeToString()), (b"", b""), (b"k", b"\x00" * 70000)]
    write(tmp_path / "ours", "datumfile", recs)
    ours = (tmp_path / "ours").read_bytes()
    assert ours == hand_built(recs)
    assert ours[:12] == struct.pack("<III", 8 + 14 + len(recs[0][1]), 14, 0x30303030)   # LE, no header
    assert note_reader(ours) == recs
    (tmp_path / "theirs").write_bytes(hand_built(recs))
    assert list(open_records(tmp_path / "theirs", "datumfile")) == recs


def test_datumfile_index_side_file(tmp_path):
    recs = records(50)
    path = tmp_path / "d"
    path.write_bytes(hand_built(recs))
    index = tmp_path / "d.idx"
    assert not index.exists()
    source = open_records(path, "datumfile")
    assert one_pass(source) == recs and not index.exists()      # a plain pass needs no index
    assert len(source) == 50 and index.exists()                 # built on the first len()
    raw = index.read_bytes()
    magic, size, mtime_ns, count = struct.unpack("<8sQqQ", raw[:32])
    stat = os.stat(path)
    assert (magic, size, mtime_ns, count) == (b"PCDIDX01", stat.st_size, stat.st_mtime_ns, 50)
    offsets = struct.unpack("<50Q", raw[32:])
    assert offsets[0] == 0 and offsets[1] == 12 + len(recs[0][0]) + len(recs[0][1])
    assert [note_reader(path.read_bytes()[o:])[0] for o in offsets] == recs
    # stale (the datumfile grew): rebuilt
    more = records(60)
    path.write_bytes(hand_built(more))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1000))
    assert len(open_records(path, "datumfile")) == 60
    assert struct.unpack("<8sQqQ", index.read_bytes()[:32])[3] == 60
    # corrupt index: rebuilt; unwritable index: kept in memory
    index.write_bytes(b"PCDIDX01" + b"\x00" * 10)
    stream = open_records(path, "datumfile").cycle(skip=59)
    assert next(stream) == more[59] and next(stream) == more[0]
    index.unlink()
    index.mkdir()
    assert len(open_records(path, "datumfile")) == 60 and index.is_dir()


def test_a_damaged_index_with_a_fitting_header_is_rebuilt(tmp_path):
    """Offsets past the file or out of order (found by tests/fuzz) made seek() or read() raise OverflowError,
    ValueError or MemoryError."""
    recs = records(5)
    path = tmp_path / "d"
    path.write_bytes(hand_built(recs))
    stat = os.stat(path)
    head = struct.pack("<8sQqQ", b"PCDIDX01", stat.st_size, stat.st_mtime_ns, 5)
    for offsets in ([0, 2 ** 63, 3, 4, 5], [0, 2 ** 64 - 1, 1, 2, 3], [5, 0, 0, 0, 0], [0, 12, 11, 40, 60],
                    [0, 90, 2 ** 63 + 1, 2 ** 64 - 2 ** 48, 598]):      # int64 differences wrapped to look fine
        (tmp_path / "d.idx").write_bytes(head + struct.pack("<5Q", *offsets))
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        source = open_records(path, "datumfile")
        assert len(source) == 5 and next(source.batches(5)) == recs


def test_a_damaged_leveldb_is_a_data_error(tmp_path):
    """plyvel's CorruptionError escaped from iteration (found by tests/fuzz)."""
    import plyvel
    path = tmp_path / "db"
    write(path, "leveldb", [(b"%08d" % i, bytes(3000 + i)) for i in range(40)])
    db = plyvel.DB(str(path))
    db.compact_range()                                     # into a table file, whose blocks we damage
    db.close()
    for table in path.glob("*.ldb"):
        data = bytearray(table.read_bytes())
        for at in range(100, len(data) - 100, 997):
            data[at] ^= 0x5A
        table.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"db: the LevelDB database is damaged \(at record 0\): .*Corruption"):
        len(open_records(path, "leveldb"))


def test_a_damaged_lmdb_is_a_data_error_not_a_crash(tmp_path):
    """LMDB reads through its map without bounds: damaged node sizes were a SIGBUS (found by tests/fuzz); the file
    is checked page by page first (data/lmdb_check.py)."""
    path = tmp_path / "db"
    write(path, "lmdb", [(b"%08d" % i, bytes(300 + i)) for i in range(40)])
    data = bytearray((path / "data.mdb").read_bytes())
    data[2 * 4096 + 16:2 * 4096 + 18] = b"\xff\x0f"          # page 2: its first node pointer, past the page
    (path / "data.mdb").write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"data.mdb: is damaged: page 2: a node lies outside the page"):
        open_records(path, "lmdb")


def test_truncated_datumfile_names_file_and_offset(tmp_path):
    recs = records(3)
    data = hand_built(recs)
    second = 12 + len(recs[0][0]) + len(recs[0][1])
    (tmp_path / "cut").write_bytes(data[:second + 30])
    with pytest.raises(DataError, match=r"cut: record 1 at byte %d is truncated \(value of \d+ bytes" % second):
        one_pass(open_records(tmp_path / "cut", "datumfile"))
    with pytest.raises(DataError, match=r"cut: record 1 at byte %d is truncated \(\d+ bytes announced, 26 present"
                       % second):
        len(open_records(tmp_path / "cut", "datumfile"))
    (tmp_path / "tail").write_bytes(data + b"\x01\x00")      # a partial length field is not a clean end
    with pytest.raises(DataError, match=r"tail: record 3 at byte %d is truncated \(reading its record size\)"
                       % len(data)):
        one_pass(open_records(tmp_path / "tail", "datumfile"))


def test_datumfile_corruption_is_refused_before_reading(tmp_path):
    big = DATUMFILE_MAX_BUF + 1
    (tmp_path / "huge").write_bytes(struct.pack("<III", 20, big, 0) + b"x" * 20)
    with pytest.raises(DataError, match=r"huge: record 0 at byte 0: key size %d exceeds %d; not a datumfile"
                       % (big, DATUMFILE_MAX_BUF)):
        one_pass(open_records(tmp_path / "huge", "datumfile"))
    ok = hand_built(records(1))
    (tmp_path / "hugevalue").write_bytes(ok + struct.pack("<III", 12, 0, 0xFFFFFFFF))
    with pytest.raises(DataError, match=r"record 1 at byte %d: value size 4294967295 exceeds" % len(ok)):
        one_pass(open_records(tmp_path / "hugevalue", "datumfile"))
    (tmp_path / "hugerecord").write_bytes(struct.pack("<I", big))
    with pytest.raises(DataError, match=r"record 0 at byte 0: record size %d exceeds" % big):
        len(open_records(tmp_path / "hugerecord", "datumfile"))
    (tmp_path / "mismatch").write_bytes(struct.pack("<II", 99, 1) + b"k" + struct.pack("<I", 2) + b"vv")
    with pytest.raises(DataError, match=r"mismatch: record 0 at byte 0: record size 99 but key \(1 bytes\) and "
                       r"value \(2 bytes\) take 11; corrupt"):
        one_pass(open_records(tmp_path / "mismatch", "datumfile"))
    (tmp_path / "dir").mkdir()
    with pytest.raises(DataError, match=r"dir: a datumfile is a single regular file"):
        open_records(tmp_path / "dir", "datumfile")


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_one_database_open_twice_in_a_process(tmp_path, backend):
    """A TRAIN and a TEST net read the same store: py-lmdb and LevelDB allow one handle per process, shared."""
    recs = records(10)
    write(tmp_path / "db", backend, recs)
    first = open_records(tmp_path / "db", backend)
    second = open_records(str(tmp_path / "db"), backend)
    stream = second.cycle(shard=1, num_shards=2)
    first.close()
    first.close()                                 # closing twice releases once
    assert [next(stream) for _ in range(6)] == (recs[1::2] * 2)[:6]
    second.close()
    with open_records(tmp_path / "db", backend) as third:     # reopened after the last user closed it
        assert list(third) == recs


@pytest.mark.parametrize("backend,other", [("lmdb", "leveldb"), ("leveldb", "lmdb")])
def test_an_open_store_read_with_the_wrong_backend_is_a_data_error(tmp_path, backend, other):
    """The shared handle of an open store must not be handed to a reader of the other kind (an AttributeError
    traceback before): that reader opens its own, which fails and names the path."""
    write(tmp_path / "db", backend, records(3))
    with open_records(tmp_path / "db", backend) as right:
        with pytest.raises(DataError, match=r"db: cannot open (LevelDB|LMDB)"):
            open_records(tmp_path / "db", other)
        assert len(right) == 3
