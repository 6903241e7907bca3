"""The master's reads of the workers' results, started ahead of their merges, and their check for NaN and Inf.

A batch of result messages has all its reads started at once on a few threads: a read is Redis I/O into a scratch
set of arrays and a check of its values, both of which let go of the GIL, so the master's own thread is left with
the merges. At 8 workers the master's thread spent 0.33 ms of its ~1.2 ms per merge reading a LeNet result and
0.15 ms checking it (2 cores): with the reads beside it, one thread merges about twice as many results a second.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .compression import Damaged, read_error

READ_THREADS = 4


def first_non_finite(arrays):
    """The index of the first array holding NaN or Inf, or None. A float32 sum is one fast pass and is finite
    unless an element is not (or the sum overflows: then the elements are looked at one by one)."""
    with np.errstate(over="ignore", invalid="ignore"):
        for i, a in enumerate(arrays):
            if not np.isfinite(np.sum(a)) and not np.isfinite(a).all():
                return i
    return None


class ResultReader:
    """Reads of the results of a store's workers, as arrays of `shapes`: start(worker) begins one, take(worker)
    waits for it (or reads now). The arrays are the reader's scratch: give them back with release() once merged.
    With a compression.Format (`--compress`), a result is its payload, decoded here, on the reading thread."""

    def __init__(self, store, shapes, threads=READ_THREADS, format=None):
        self.store, self.shapes, self.format = store, shapes, format
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="read")
        self.free, self.pending = [], {}

    def start(self, worker):
        if worker not in self.pending:
            out = self.free.pop() if self.free else [np.empty(s, np.float32) for s in self.shapes]
            self.pending[worker] = self.pool.submit(self._read, worker, out)

    def _read(self, worker, out):
        if self.format is None:
            arrays = self.store.get_result(worker, self.shapes, out=out, missing_ok=True)
        else:
            arrays = self._decoded(worker, out)
        if arrays is None:
            self.free.append(out)
            return None, None
        return arrays, first_non_finite(arrays)

    def _decoded(self, worker, out):
        payload = self.store.get_result(worker, [self.format.shape], missing_ok=True)
        if payload is None:
            return None
        try:
            return self.format.decode(payload[0], out)
        except Damaged as exc:
            raise read_error(self.store, worker, exc) from None

    def sizes(self):
        """The bytes of a result as sent, and as float32 (for the stats)."""
        dense = 4 * sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes)
        return {"bytes_per_result": dense if self.format is None else self.format.nbytes,
                "float32_bytes_per_result": dense}

    def take(self, worker):
        """(the worker's result, the index of its first blob holding NaN or Inf or None); (None, None) when the
        result is not on Redis."""
        self.start(worker)
        return self.pending.pop(worker).result()

    def discard(self, worker):
        """A read started for a result that was not merged (dropped, seen twice): its arrays go back."""
        future = self.pending.pop(worker, None)
        if future is not None:
            try:
                arrays = future.result()[0]
                if arrays is not None:
                    self.release(arrays)
            except Exception:       # the read's own failure does not matter for a result nobody takes
                pass

    def release(self, arrays):
        self.free.append(arrays)

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
