"""Prefetching: a background thread keeps up to `depth` transformed batches ready (Caffe's
BasePrefetchingDataLayer, whose DataParameter.prefetch defaults to 4).

A thread is enough: reading, parsing and transforming a batch is mostly C (LMDB, protobuf, numpy, Pillow) that
releases the GIL or holds it briefly, and the solver's step runs in kernels that release it too.

The thread holds no reference to the layer that owns it, so dropping the net stops the thread (the layer's
finalizer sets the stop flag). An error in the thread (a corrupt record) is handed to the consumer and raised at
the forward that would have used the batch: nothing is skipped silently.

In GPU mode the thread also copies each batch to the device (`DeviceStager`), on a stream of its own, while the
current batch computes: the layer's forward_gpu then copies device to device, as Caffe's prefetch thread pushes
its batches to the GPU (base_data_layer.cpp, async_gpu_push).
"""
import queue
import threading
import time
import weakref

import numpy as np

from ..backend import select

_POLL_S = 0.1


class _Failure:
    def __init__(self, exc):
        self.exc = exc


class Prefetcher:
    """Runs `make_batch()` in a daemon thread, `depth` batches ahead; `next()` returns them in order.

    `wait_s` accumulates the time `next()` spent waiting for the thread: the time a step waits for data."""

    def __init__(self, make_batch, depth, owner=None, name="prefetch"):
        self.batches = queue.Queue(max(1, int(depth)))
        self.stop_event = threading.Event()
        self.wait_s, self.batches_taken = 0.0, 0
        self.thread = threading.Thread(target=_fill, args=(make_batch, self.batches, self.stop_event),
                                       name=name, daemon=True)
        self.thread.start()
        if owner is not None:
            weakref.finalize(owner, self.stop_event.set)

    def next(self):
        start = time.perf_counter()
        while True:
            try:
                item = self.batches.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.batches.empty():
                    raise RuntimeError("the prefetch thread has stopped") from None
        self.wait_s += time.perf_counter() - start
        self.batches_taken += 1
        if isinstance(item, _Failure):
            raise item.exc
        return item

    def close(self):
        self.stop_event.set()
        self.thread.join()


def _fill(make_batch, batches, stop_event):
    while not stop_event.is_set():
        try:
            item = make_batch()
        except Exception as exc:     # handed to the consumer, who raises it where the batch was wanted
            item = _Failure(exc)
        while not stop_event.is_set():
            try:
                batches.put(item, timeout=_POLL_S)
                break
            except queue.Full:
                continue
        if isinstance(item, _Failure):
            return


class DeviceStager:
    """Copies batches to the device from the prefetch thread: through one page-locked buffer that grows to the
    largest batch, on a copy stream; each batch gets device arrays of its own (from the caching allocator, so
    they come back to be reused once the layer has copied them to its tops)."""

    def __init__(self):
        self._pinned, self._stream, self._device = None, None, None

    def __call__(self, arrays):
        """Device copies of `arrays` (float32), uploaded before this returns; None outside GPU mode."""
        if not select.active():
            return None
        dev = select.current()
        with dev.in_thread():
            if dev is not self._device:
                self._device, self._stream, self._pinned = dev, dev.new_stream(), None
            total = sum(a.size for a in arrays)
            if self._pinned is None or self._pinned.size < total:
                self._pinned = dev.pinned_empty(total, np.float32)
            out, offset = [], 0
            for a in arrays:
                staged = self._pinned[offset:offset + a.size]
                staged[...] = a.reshape(-1)
                target = dev.empty(a.size, np.float32)
                dev.upload(target, staged, self._stream)
                out.append(target)
                offset += a.size
            # The buffer is reused for the next batch: wait for this copy (in this thread; compute goes on).
            self._stream.synchronize()
        return out
