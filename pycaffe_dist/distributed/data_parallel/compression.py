"""Compressed results with error feedback (`--compress 1bit|topk:FRACTION`, modes async, sync, gradient-only and
local-sgd): a worker sends an approximation of its result and keeps what it did not send, the residual, which it
adds to its next result (ErrorFeedback), so that nothing is lost, only delayed (Seide, Fu, Droppo, Li and Yu 2014,
"1-Bit Stochastic Gradient Descent and its Application to Data-Parallel Distributed Training of Speech DNNs";
Strom 2015 and Lin et al. 2018 for top-k). The master decodes before merging: its rules see dense arrays as ever.

Codecs, over each blob flattened (C order):
- 1bit: a sign bit per value (1: >= 0), and per block of BLOCK values two reconstruction values, the mean of the
  block's values >= 0 and the mean of its values < 0 (Seide et al.'s per-column means, over blocks here): the
  least-squares reconstruction for the signs, and a block's decoded values sum to its values' sum. 1/32 of the
  float32 bytes for the bits and 2/BLOCK for the means: 1/28.4 with BLOCK 512 (LeNet: 1/28).
- topk:F: the k = ceil(F n) values of largest magnitude of each blob of n values (at least 1), as k uint32
  indices, ascending, then their k float32 values: 2 F of the float32 bytes.

The wire format (version 1), little-endian, written and read with numpy (never pickled), a multiple of 4 bytes (the
store moves it as a float32 blob: store.py's result key, sharded like W):
  header  magic b"PCDZ", u8 version 1, u8 codec (1: 1bit, 2: topk), u16 0, u32 blob count, u32 block (1bit: BLOCK;
          topk: 0)
  table   per blob: u64 value count, u64 its section's bytes
  blobs   each section in turn: 1bit: the sign bits (numpy's packbits, little bit order) padded with zeros to 4
          bytes, then the block means as float32 pairs (>= 0, < 0); topk: the indices, then the values
The master knows the job's codec and shapes, so it knows every length: a payload whose header, table or indices
(in range, strictly ascending) are not what the job's codec writes is a one-line StoreError naming the key. A
non-finite mean or value is not damage but a worker's NaN: it decodes to NaN, which the master refuses as it
refuses any result holding NaN or Inf (the job stops with the worker and blob named)."""
import functools
import math

import numpy as np

from ...errors import PycaffeDistError
from ..wire import DamagedData

MAGIC, VERSION = b"PCDZ", 1
HEADER = np.dtype([("magic", "S4"), ("version", "u1"), ("codec", "u1"), ("reserved", "<u2"), ("count", "<u4"),
                   ("block", "<u4")])
ENTRY = np.dtype([("values", "<u8"), ("bytes", "<u8")])
BLOCK = 512


class Damaged(Exception):
    """A payload that is not what this job's codec writes (what is wrong, in words)."""


def _padded(nbytes):
    return -(-nbytes // 4) * 4


@functools.lru_cache(maxsize=64)
def _block_starts(n):
    """2 (i // BLOCK) for i < n: where value i's block's means start (one per blob size, kept)."""
    starts = np.arange(n, dtype=np.intp) // BLOCK * 2
    starts.flags.writeable = False
    return starts


class OneBit:
    id, name, block = 1, "1bit", BLOCK

    def section_bytes(self, n):
        return _padded(-(-n // 8)) + 8 * -(-n // BLOCK)

    def encode(self, x, out):
        """x: flat float32 values; out: the section's bytes (zeroed)."""
        n, blocks = len(x), -(-len(x) // BLOCK)
        padded = np.zeros(blocks * BLOCK, np.float32)
        padded[:n] = x
        padded = padded.reshape(blocks, BLOCK)
        positive = padded >= 0
        counts = positive.sum(axis=1)
        counts[-1] -= blocks * BLOCK - n            # the padding's zeros counted as >= 0
        sizes = np.full(blocks, BLOCK)
        sizes[-1] = n - (blocks - 1) * BLOCK
        # max(x, 0) is x where x >= 0 and 0 elsewhere, as np.where(positive, x, 0) (7 times slower) gives, except
        # that a NaN makes both of its block's means NaN (the master refuses such a result either way)
        sums = np.maximum(padded, np.float32(0)).sum(axis=1, dtype=np.float64)
        negative_sums = padded.sum(axis=1, dtype=np.float64) - sums
        means = np.empty((blocks, 2), "<f4")
        means[:, 0] = sums / np.maximum(counts, 1)
        means[:, 1] = negative_sums / np.maximum(sizes - counts, 1)
        bits = np.packbits(positive.reshape(-1)[:n], bitorder="little")
        out[:len(bits)] = bits
        out[_padded(len(bits)):] = means.reshape(-1).view(np.uint8)

    def decode(self, data, n, out):
        bits_end = _padded(-(-n // 8))
        negative = np.unpackbits(data[:bits_end], count=n, bitorder="little") ^ np.uint8(1)
        means = data[bits_end:].view("<f4")         # per block: the mean of its values >= 0, then of the others
        # Value i is means[2 (i // BLOCK) + (its bit is 0)]: one gather, 5 times faster than an np.where between
        # the repeated means (exact: a selection, no arithmetic)
        np.take(means, _block_starts(n) + negative, out=out)


class TopK:
    id, name, block = 2, "topk", 0

    def __init__(self, fraction):
        self.fraction = fraction

    def kept(self, n):
        return min(n, max(1, math.ceil(self.fraction * n))) if n else 0

    def section_bytes(self, n):
        return 8 * self.kept(n)

    def encode(self, x, out):
        n, k = len(x), self.kept(len(x))
        # argpartition puts NaN last, so a NaN is always sent (the master then refuses the result).
        index = np.sort(np.argpartition(np.abs(x), n - k)[n - k:]).astype("<u4")
        out[:4 * k] = index.view(np.uint8)
        out[4 * k:] = x[index].astype("<f4").view(np.uint8)

    def decode(self, data, n, out):
        k = self.kept(n)
        index = data[:4 * k].view("<u4")
        if k and (index[-1] >= n or (k > 1 and not (np.diff(index.astype(np.int64)) > 0).all())):
            raise Damaged("top-k indices out of range or not strictly ascending")
        out[...] = 0
        out[index] = data[4 * k:].view("<f4")


def codec(spec):
    """The codec a --compress value names (None for none); PycaffeDistError for a value that names none."""
    problem = check(spec)
    if problem:
        raise PycaffeDistError("--compress " + problem)
    if spec in (None, "none"):
        return None
    if spec == "1bit":
        return OneBit()
    return TopK(float(spec.split(":", 1)[1]))


def check(spec):
    """What is wrong with a --compress value, or None."""
    if spec in (None, "none", "1bit"):
        return None
    name, _, fraction = str(spec).partition(":")
    try:
        if name == "topk" and 0 < float(fraction) <= 1:
            return None
    except ValueError:
        pass
    return "must be none, 1bit or topk:FRACTION with 0 < FRACTION <= 1, got %r" % spec


class Format:
    """A codec's payloads for blobs of `shapes`: their exact size, encode and decode (with every check)."""

    def __init__(self, codec, shapes):
        self.codec = codec
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        self.sections = [codec.section_bytes(n) for n in self.sizes]
        self.offset = HEADER.itemsize + ENTRY.itemsize * len(self.sizes)
        self.nbytes = self.offset + sum(self.sections)
        self.dense_nbytes = 4 * sum(self.sizes)
        self.header = np.zeros(1, HEADER)
        self.header[0] = (MAGIC, VERSION, codec.id, 0, len(self.sizes), codec.block)
        self.table = np.array(list(zip(self.sizes, self.sections)), ENTRY)

    @property
    def shape(self):
        """The payload as the store moves it: one float32 blob."""
        return (self.nbytes // 4,)

    def encode(self, arrays):
        """The payload of `arrays` (a new float32 array of `shape`)."""
        payload = np.zeros(self.shape, np.float32)
        data = payload.view(np.uint8)
        data[:HEADER.itemsize] = self.header.view(np.uint8)
        data[HEADER.itemsize:self.offset] = self.table.view(np.uint8)
        at = self.offset
        for a, size in zip(arrays, self.sections):
            self.codec.encode(np.ascontiguousarray(a, np.float32).reshape(-1), data[at:at + size])
            at += size
        return payload

    def decode(self, payload, out):
        """The payload's blobs into the float32 arrays `out`; Damaged when it is not what this format writes."""
        data = payload.view(np.uint8)
        if data.nbytes != self.nbytes:
            raise Damaged("%d bytes, not %d" % (data.nbytes, self.nbytes))
        header = data[:HEADER.itemsize].view(HEADER)[0]
        if bytes(header["magic"]) != MAGIC:
            raise Damaged("no compressed result (magic %r)" % bytes(header["magic"]))
        if header["version"] != VERSION:
            raise Damaged("format version %d, not %d" % (header["version"], VERSION))
        if (header["codec"], header["count"], header["block"]) != (self.codec.id, len(self.sizes), self.codec.block):
            raise Damaged("codec %d with %d blobs (block %d), where the job's %s has %d blobs" % (
                header["codec"], header["count"], header["block"], self.codec.name, len(self.sizes)))
        if data[HEADER.itemsize:self.offset].tobytes() != self.table.tobytes():
            raise Damaged("its blob lengths are not those of the job's blobs")
        at = self.offset
        for a, n, size in zip(out, self.sizes, self.sections):
            self.codec.decode(data[at:at + size], n, a.reshape(-1))
            at += size
        return out


def format_of(options, shapes):
    """The payload format of a job's mode options (None: results go as float32)."""
    found = codec(options.get("compress"))
    return None if found is None else Format(found, shapes)


def read_error(store, worker, problem):
    """The one line a damaged payload is: the key named."""
    return DamagedData("job %s: %s holds a damaged or foreign compressed result: %s"
                       % (store.job, store.key("x", worker, "*"), problem))


class ErrorFeedback:
    """A worker's side: encode(result) -> [the payload of result + the residual], keeping what it does not carry.
    The residual is what the master's own decode leaves out, so decode(payload) + residual is the value sent
    (exactly for top-k, whose kept values go as they are; to float32 rounding for 1bit)."""

    def __init__(self, format):
        self.format = format
        self.residual = None
        self.decoded = None

    @classmethod
    def for_job(cls, options, shapes):
        format = format_of(options, shapes)
        return None if format is None else cls(format)

    def encode(self, result):
        if self.residual is None:
            self.residual = [np.array(r, np.float32) for r in result]
            self.decoded = [np.empty_like(r) for r in self.residual]
        else:
            for r, x in zip(self.residual, result):
                r += x
        payload = self.format.encode(self.residual)
        self.format.decode(payload, self.decoded)
        for r, d in zip(self.residual, self.decoded):
            r -= d
        return [payload]            # what the store moves: one blob (the payload, not each of its floats)

    def forget(self):
        """A result dropped or a reset: what it owed W goes with it, as its delta does."""
        self.residual = None
