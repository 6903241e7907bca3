"""Converters (convert-idx, convert-imageset, convert-db, compute-mean), IDX reading and progress (the verbs that
run them: tests/cli/test_data.py)."""
import gzip
import io
import struct

import numpy as np
import pytest
from PIL import Image

from pycaffe_dist.data import convert, idx
from pycaffe_dist.data.sources import open_records, open_writer, parse_datum
from pycaffe_dist.errors import DataError
from pycaffe_dist.blob.binaryproto import read_blob_file
from pycaffe_dist.proto.binary import read_binary
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, load_npz

CASE = GOLDEN / "solvers" / "sgd_momentum"


def write_idx(path, array, magic, gz=False):
    data = struct.pack(">I", magic) + struct.pack(">%dI" % array.ndim, *array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture
def golden_idx(tmp_path):
    """IDX files of the records Caffe's convert_mnist_data turned into the golden train_lmdb."""
    records = load_npz(CASE / "records.npz")
    images = write_idx(tmp_path / "images.gz", records["images"].reshape(256, 4, 4), 2051, gz=True)
    labels = write_idx(tmp_path / "labels", records["labels"], 2049)
    return images, labels, records


@pytest.mark.parametrize("backend", ["lmdb", "leveldb", "datumfile"])
def test_convert_idx_writes_what_caffes_convert_mnist_data_wrote(golden_idx, tmp_path, backend):
    images, labels, _ = golden_idx
    log = io.StringIO()
    assert convert.convert_idx(images, labels, tmp_path / "out", backend, stream=log) == 256
    assert log.getvalue().startswith("convert-idx %s: 256 records in " % (tmp_path / "out"))
    with open_records(CASE / "train_lmdb", "lmdb") as caffe, open_records(tmp_path / "out", backend) as ours:
        assert list(ours) == list(caffe)        # same keys, byte-identical serialized Datums


def test_read_idx_checks_magic_dims_and_size(tmp_path):
    pixels = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    assert idx.read_idx(write_idx(tmp_path / "a", pixels, 2051)).tolist() == pixels.tolist()
    assert idx.read_idx(write_idx(tmp_path / "b.gz", pixels, 2051, gz=True)).tolist() == pixels.tolist()
    wide = np.array([1, -2, 300], dtype=">i4")
    assert idx.read_idx(write_idx(tmp_path / "i", wide, 0x0C01)).tolist() == [1, -2, 300]
    with pytest.raises(DataError, match=r"a: magic number 2051, expected 2049 \(labels\)"):
        idx.read_mnist(tmp_path / "b.gz", tmp_path / "a")
    data = (tmp_path / "a").read_bytes()
    (tmp_path / "cut").write_bytes(data[:-5])
    with pytest.raises(DataError, match=r"cut: header says 2 x 3 x 4 items of 1 bytes: expected 40 bytes \(with the "
                       r"header\), the file holds 35"):
        idx.read_idx(tmp_path / "cut")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(data)[:-6])
    with pytest.raises(DataError, match=r"cut.gz: is not a readable gzip file"):
        idx.read_idx(tmp_path / "cut.gz")
    (tmp_path / "text").write_text("hello world")
    with pytest.raises(DataError, match=r"text: is not an IDX file \(magic number 0x68656c6c\)"):
        idx.read_idx(tmp_path / "text")
    write_idx(tmp_path / "labels", np.zeros(3, np.uint8), 2049)
    with pytest.raises(DataError, match=r"a holds 2 images but .*labels holds 3 labels"):
        idx.read_mnist(tmp_path / "a", tmp_path / "labels")
    with pytest.raises(DataError, match=r"%s: no such IDX file" % (tmp_path / "none")):
        idx.read_idx(tmp_path / "none")


def make_images(root):
    rng = np.random.default_rng(5)
    (root / "sub dir").mkdir(parents=True)
    arrays = {}
    for name in ["a.png", "sub dir/b c.png", "d.png"]:
        arrays[name] = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
        Image.fromarray(arrays[name]).save(root / name)
    return arrays


def test_convert_imageset(tmp_path):
    arrays = make_images(tmp_path / "img")
    listing = tmp_path / "list.txt"
    listing.write_text("a.png 3\nsub dir/b c.png 1\n\nmissing.png 4\nd.png 0\n")
    log = io.StringIO()
    assert convert.convert_imageset(str(tmp_path / "img"), listing, tmp_path / "db", "datumfile",
                                    stream=log) == (3, 1)
    assert "list.txt:4: skipping the image: %s: no such image file" % (tmp_path / "img" / "missing.png") \
        in log.getvalue()
    records = list(open_records(tmp_path / "db", "datumfile"))
    # keys number the list's entries; blank lines are no entries
    assert [k for k, _ in records] == [b"00000000_a.png", b"00000001_sub dir/b c.png", b"00000003_d.png"]
    datum = parse_datum(records[1][1], "r")
    assert (datum.channels, datum.height, datum.width, datum.label, datum.encoded) == (3, 6, 5, 1, False)
    assert datum.data == arrays["sub dir/b c.png"][:, :, ::-1].transpose(2, 0, 1).tobytes()      # BGR, CHW

    listing.write_text("a.png 3\nd.png 0\n")
    convert.convert_imageset(str(tmp_path / "img"), listing, tmp_path / "enc", "lmdb", encoded=True, gray=True,
                             stream=log)
    datum = parse_datum(dict(open_records(tmp_path / "enc", "lmdb"))[b"00000000_a.png"], "r")
    assert datum.encoded and datum.data == (tmp_path / "img" / "a.png").read_bytes() and datum.label == 3
    assert not datum.HasField("channels")       # the file's own bytes, as Caffe's ReadFileToDatum

    convert.convert_imageset(str(tmp_path / "img"), listing, tmp_path / "small", "leveldb", resize_height=3,
                             resize_width=2, gray=True, encoded=True, stream=log)
    datum = parse_datum(dict(open_records(tmp_path / "small", "leveldb"))[b"00000001_d.png"], "r")
    pixels = np.asarray(Image.open(io.BytesIO(datum.data)))
    assert datum.encoded and pixels.shape == (3, 2)
    resized = np.asarray(Image.fromarray(arrays["d.png"]).convert("L").resize((2, 3), Image.BILINEAR))
    assert pixels.tolist() == resized.tolist()


def test_convert_imageset_shuffle_is_seeded(tmp_path):
    make_images(tmp_path / "img")
    listing = tmp_path / "list.txt"
    names = ["a.png", "d.png", "sub dir/b c.png"] * 4
    listing.write_text("".join("%s %d\n" % (n, i) for i, n in enumerate(names)))
    orders = []
    for out in ["s1", "s2", "s3"]:
        convert.convert_imageset(str(tmp_path / "img"), listing, tmp_path / out, "datumfile", shuffle=True,
                                 seed=0 if out != "s3" else 1, stream=io.StringIO())
        orders.append([parse_datum(v, "r").label for _, v in open_records(tmp_path / out, "datumfile")])
    assert orders[0] == orders[1] != orders[2] and sorted(orders[0]) == list(range(12))


def test_bad_list_lines_name_the_line(tmp_path):
    (tmp_path / "l1").write_text("a.png 1\nb.png\n")
    with pytest.raises(DataError, match=r"l1:2: expected 'file label', got 'b.png'"):
        convert.convert_imageset(str(tmp_path), tmp_path / "l1", tmp_path / "o", "lmdb")
    (tmp_path / "l2").write_text("a.png 1\n\nb.png x\n")
    with pytest.raises(DataError, match=r"l2:3: the label 'x' is not an integer"):
        convert.convert_imageset(str(tmp_path), tmp_path / "l2", tmp_path / "o", "lmdb")
    with pytest.raises(DataError, match=r"l3: cannot read the image list"):
        convert.convert_imageset(str(tmp_path), tmp_path / "l3", tmp_path / "o", "lmdb")
    assert not (tmp_path / "o").exists()


def test_a_list_that_is_not_utf8_names_the_line(tmp_path):
    """Read as text: UnicodeDecodeError (found by tests/fuzz)."""
    (tmp_path / "list.txt").write_bytes(b"a.png 1\nb\x80.png 2\n")
    with pytest.raises(DataError, match=r"list.txt:2: not UTF-8 text \(byte 0x80\)"):
        convert.read_image_list(tmp_path / "list.txt")


def test_convert_db_between_all_backends(golden_idx, tmp_path):
    expected = list(open_records(CASE / "train_lmdb", "lmdb"))
    log = io.StringIO()
    assert convert.convert_db(CASE / "train_lmdb", "lmdb", tmp_path / "d", "datumfile", stream=log) == 256
    assert convert.convert_db(tmp_path / "d", "datumfile", tmp_path / "l", "leveldb", stream=log) == 256
    assert convert.convert_db(tmp_path / "l", "leveldb", tmp_path / "m", "lmdb", stream=log) == 256
    for path, backend in [(tmp_path / "d", "datumfile"), (tmp_path / "l", "leveldb"), (tmp_path / "m", "lmdb")]:
        assert list(open_records(path, backend)) == expected
    with pytest.raises(DataError, match=r"%s: no such LMDB database" % (tmp_path / "none")):
        convert.convert_db(tmp_path / "none", "lmdb", tmp_path / "x", "lmdb")


def test_compute_mean_as_caffes_compute_image_mean(tmp_path):
    records = load_npz(CASE / "records.npz")
    mean = convert.compute_mean(CASE / "train_lmdb", "lmdb", tmp_path / "mean.binaryproto", stream=io.StringIO())
    expected = records["images"].astype(np.float64).mean(axis=0, keepdims=True).astype(np.float32)
    assert mean.shape == (1, 1, 4, 4) and mean.tolist() == expected.tolist()
    blob = read_binary(tmp_path / "mean.binaryproto", caffe_pb2.BlobProto())
    assert (blob.num, blob.channels, blob.height, blob.width, len(blob.shape.dim)) == (1, 1, 4, 4, 0)
    assert read_blob_file(tmp_path / "mean.binaryproto").tolist() == expected.tolist()

    with open_writer(tmp_path / "mixed", "datumfile") as writer:
        writer.put(b"0", caffe_pb2.Datum(channels=1, height=1, width=2, float_data=[1, 2]).SerializeToString())
        writer.put(b"1", caffe_pb2.Datum(channels=1, height=1, width=2, data=b"\x03\x05").SerializeToString())
        writer.put(b"2", caffe_pb2.Datum(channels=1, height=2, width=1, data=b"\x03\x05").SerializeToString())
    with pytest.raises(DataError, match=r"mixed: record b'2': is 1x2x1, but the first record is 1x1x2"):
        convert.compute_mean(tmp_path / "mixed", "datumfile", tmp_path / "m2", stream=io.StringIO())
    with open_writer(tmp_path / "two", "datumfile") as writer:
        writer.put(b"0", caffe_pb2.Datum(channels=1, height=1, width=2, float_data=[1, 2]).SerializeToString())
        writer.put(b"1", caffe_pb2.Datum(channels=1, height=1, width=2, data=b"\x03\x05").SerializeToString())
    assert convert.compute_mean(tmp_path / "two", "datumfile", tmp_path / "m3",
                                stream=io.StringIO()).tolist() == [[[[2.0, 3.5]]]]


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_tty_and_summary_otherwise(monkeypatch):
    clock = iter([0.0, 0.5, 1.0, 2.0, 2.0])
    monkeypatch.setattr(convert.time, "monotonic", lambda: next(clock))
    tty = FakeTTY()
    progress = convert.Progress("job", 4, tty)
    progress.step()          # t=0.5: 1 of 4 at 2 records/s, 3 left: ETA 0:01
    progress.step(2)         # t=1.0: 3 of 4 at 3 records/s
    progress.close()         # t=2.0
    text = tty.getvalue()
    assert "\rjob: [#######.......................] 1/4  25% 2 records/s ETA 0:01" in text
    assert "\rjob: [######################........] 3/4  75% 3 records/s ETA 0:00" in text
    assert text.endswith("job: 3 records in 2.0 s (2 records/s)\n")
    monkeypatch.undo()
    plain = io.StringIO()
    progress = convert.Progress("job", 4, plain)
    progress.step(4)
    progress.close()
    assert "\r" not in plain.getvalue() and plain.getvalue().startswith("job: 4 records in ")


def test_an_image_list_name_with_a_nul_byte():
    """From a prototxt string (image_data_param.source): open() raised ValueError."""
    with pytest.raises(DataError, match=r"'l\\x00': cannot read the image list: embedded null byte"):
        convert.read_image_list("l\0")
