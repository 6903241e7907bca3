"""Converters into any record store, like Caffe's tools: convert_mnist_data, convert_imageset, a db-to-db copy,
and compute_image_mean.

Each writes through `sources.open_writer` (one transaction or write batch per 1000 records, as Caffe's tools
commit) and reports progress on stderr: a live bar with count, rate and ETA when stderr is a terminal, otherwise
one summary line at the end.
"""
import os
import random
import sys
import time

import numpy as np

from ..errors import DataError
from ..proto.binary import write_binary
from ..proto import caffe_pb2
from . import images, idx, sources


class Progress:
    """Counts records; on a TTY redraws "what: n/total pct rate ETA" (at most 5 times a second), and on close
    prints the summary line "what: n records in T s (R records/s)"."""

    def __init__(self, what, total=None, stream=None):
        self.what, self.total, self.count = what, total, 0
        self.stream = stream if stream is not None else sys.stderr
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = self.shown = time.monotonic()

    def step(self, n=1):
        self.count += n
        if self.live:
            now = time.monotonic()
            if now - self.shown >= 0.2:
                self.shown = now
                self.stream.write("\r" + self._line(now))
                self.stream.flush()

    def _line(self, now):
        elapsed = max(now - self.start, 1e-9)
        rate = self.count / elapsed
        if not self.total:
            return "%s: %d records, %.0f records/s" % (self.what, self.count, rate)
        left = (self.total - self.count) / rate if rate else 0.0
        width = 30
        done = int(width * min(self.count, self.total) / self.total)
        return ("%s: [%s%s] %d/%d %3.0f%% %.0f records/s ETA %d:%02d"
                % (self.what, "#" * done, "." * (width - done), self.count, self.total,
                   100.0 * self.count / self.total, rate, left // 60, left % 60))

    def close(self):
        elapsed = time.monotonic() - self.start
        if self.live:
            self.stream.write("\r" + self._line(time.monotonic()) + "\n")
        self.stream.write("%s: %d records in %.1f s (%.0f records/s)\n"
                          % (self.what, self.count, elapsed, self.count / max(elapsed, 1e-9)))
        self.stream.flush()


def convert_idx(images_path, labels_path, out, backend, overwrite=False, stream=None):
    """An MNIST-style IDX pair into a record store, as Caffe's convert_mnist_data: keys "%08d", Datums of
    channels 1, height rows, width cols, uint8 data and the label. Returns the number of records."""
    pixels, labels = idx.read_mnist(images_path, labels_path)
    count, rows, cols = pixels.shape
    datum = caffe_pb2.Datum(channels=1, height=rows, width=cols)
    progress = Progress("convert-idx %s" % out, count, stream)
    with sources.open_writer(out, backend, overwrite) as writer:
        for i in range(count):
            datum.data = pixels[i].tobytes()
            datum.label = int(labels[i])
            writer.put(b"%08d" % i, datum.SerializeToString())
            progress.step()
    progress.close()
    return count


def read_image_list(listfile):
    """[(line number, file name, label)] of a convert_imageset / ImageData list: "name label" per line, split at
    the last space (names may hold spaces), blank lines skipped."""
    try:
        with open(listfile, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise DataError("%s: cannot read the image list: %s" % (listfile, exc.strerror)) from None
    except ValueError as exc:      # a name with a NUL byte (a prototxt string may hold one)
        raise DataError("%r: cannot read the image list: %s" % (str(listfile), exc)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError("%s:%d: not UTF-8 text (byte 0x%02x)"
                        % (listfile, raw.count(b"\n", 0, exc.start) + 1, raw[exc.start])) from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.rstrip()
        if not line.strip():
            continue
        name, space, label = line.rpartition(" ")
        if not space or not name:
            raise DataError("%s:%d: expected 'file label', got %r" % (listfile, number, line))
        try:
            entries.append((number, name, int(label)))
        except ValueError:
            raise DataError("%s:%d: the label %r is not an integer" % (listfile, number, label)) from None
    return entries


def convert_imageset(root, listfile, out, backend, resize_height=0, resize_width=0, gray=False, shuffle=False,
                     encoded=False, seed=None, overwrite=False, stream=None):
    """Images named in `listfile` (relative to `root`) into a record store, as Caffe's convert_imageset.

    Keys "%08d_%s" % (position in the (shuffled) list, file name). Images are BGR (or grey with gray=True), resized
    when both sizes are given. encoded=True stores the image file's own bytes when no resize is asked (Caffe's
    ReadFileToDatum), else the resized pixels re-encoded in the format of the file's extension; such Datums carry
    only data, label and encoded, as Caffe's. An image that cannot be read is skipped with a warning naming the
    list line, as Caffe skips it. shuffle uses random.Random(seed) (Caffe's order comes from its own unseeded RNG).
    Returns (records written, images skipped).
    """
    entries = read_image_list(listfile)
    if shuffle:
        random.Random(seed).shuffle(entries)
    stream = stream if stream is not None else sys.stderr
    is_color = not gray
    progress = Progress("convert-imageset %s" % out, len(entries), stream)
    skipped = 0
    with sources.open_writer(out, backend, overwrite) as writer:
        for line_id, (number, name, label) in enumerate(entries):
            progress.step()
            path = os.path.join(root, name)
            where = "%s:%d" % (listfile, number)
            try:
                pixels = images.load_image(path, is_color, resize_height, resize_width)
                datum = _image_datum(path, pixels, label, encoded, resize_height and resize_width, where)
            except DataError as exc:
                stream.write("%s: skipping the image: %s\n" % (where, exc))
                skipped += 1
                continue
            writer.put(("%08d_%s" % (line_id, name)).encode(), datum.SerializeToString())
    progress.close()
    return len(entries) - skipped, skipped


def _image_datum(path, pixels, label, encoded, resized, where):
    if not encoded:
        channels, height, width = pixels.shape
        return caffe_pb2.Datum(channels=channels, height=height, width=width, data=pixels.tobytes(), label=label)
    extension = os.path.splitext(path)[1][1:]
    if not extension:
        raise DataError("%s: cannot guess the encoding of %s (no file extension)" % (where, path))
    if resized:
        data = images.encode_image(pixels, extension, where)
    else:
        with open(path, "rb") as f:
            data = f.read()
    return caffe_pb2.Datum(data=data, label=label, encoded=True)


def convert_db(src, src_backend, dst, dst_backend, overwrite=False, stream=None):
    """Every record of one store into a new one, in the source's order (LMDB and LevelDB keep their keys sorted,
    so a datumfile's order becomes key order there, and a repeated key keeps its last value). Returns the count."""
    with sources.open_records(src, src_backend) as records:
        progress = Progress("convert-db %s" % dst, len(records), stream)
        with sources.open_writer(dst, dst_backend, overwrite) as writer:
            for key, value in records:
                writer.put(key, value)
                progress.step()
    progress.close()
    return progress.count


def compute_mean(src, backend, out, stream=None):
    """The mean image of every record of a store, written to `out` as Caffe's compute_image_mean does: a
    BlobProto with num 1, channels, height, width and float data. Encoded Datums are decoded natively.
    Returns the mean, float32 (1, C, H, W).

    Deliberate difference: Caffe sums into the float32 blob, which stops being exact past 2^24 / 255 = 65793
    images; we sum in float64 and round the mean to float32 once, so large sets get the exact mean (small sets,
    e.g. MNIST's 60000, give the same bits).
    """
    total, shape = None, None
    with sources.open_records(src, backend) as records:
        progress = Progress("compute-mean %s" % src, len(records), stream)
        for key, value in records:
            where = "%s: record %r" % (src, key)
            pixels = images.datum_array(sources.parse_datum(value, where), where)
            if total is None:
                shape = pixels.shape
                total = np.zeros(shape, dtype=np.float64)
            elif pixels.shape != shape:
                raise DataError("%s: is %s, but the first record is %s; a mean needs equal shapes"
                                % (where, "x".join(map(str, pixels.shape)), "x".join(map(str, shape))))
            total += pixels
            progress.step()
    if total is None:
        raise DataError("%s: the database holds no records; no mean to compute" % src)
    mean = (total / progress.count).astype(np.float32)
    channels, height, width = shape
    blob = caffe_pb2.BlobProto(num=1, channels=channels, height=height, width=width)
    blob.data.extend(mean.ravel().tolist())
    try:
        write_binary(out, blob)
    except OSError as exc:
        raise DataError("%s: cannot write the mean file: %s" % (out, exc.strerror)) from None
    progress.close()
    return mean.reshape(1, channels, height, width)
