"""Blobs moving between the store and this process's device through host arrays allocated once: Sandblaster's
workers (W in, gradient sums out) and the pipeline's stages (the activations and gradients that cross a cut).

On a GPU the arrays are page-locked: each copy to or from the device is one DMA (no staging copy in the driver),
and the blob's own host memory stays out of it (a blob's writable host accessors would mark the host copy current
and send the whole blob up again at its next use on the device). On the CPU the blobs' own arrays are sent and
received into, with no copy at all. The data-parallel workers' rounds keep a double-buffered set of their own
(worker.ExchangeBuffers), as their exchange runs while the next round computes."""
import numpy as np

from ..backend import select


def host_arrays(shapes, dtype=np.float32):
    """New host arrays of `shapes`: page-locked where the process computes on a GPU, plain ones on the CPU."""
    if not select.active():
        return [np.empty(shape, dtype) for shape in shapes]
    dev = select.current()
    return [dev.pinned_empty(int(np.prod(shape, dtype=np.int64)), dtype).reshape(shape) for shape in shapes]


class BlobExchange:
    """The data (or, with diff, the diffs) of `blobs`, to send to the store and to receive from it."""

    def __init__(self, blobs, diff=False):
        self.blobs, self.diff = list(blobs), diff
        self.dev = select.current() if select.active() else None
        self.arrays = None if self.dev is None else host_arrays([b.shape for b in self.blobs],
                                                                self.blobs[0].dtype if self.blobs else np.float32)

    def outgoing(self):
        """Host arrays holding the blobs' current values, to send (read them only): on a GPU the pinned arrays,
        filled by one queue of downloads and one wait."""
        if self.dev is None:
            return [b.cpu_diff if self.diff else b.cpu_data for b in self.blobs]
        self.dev.download_all([(b.gpu_diff if self.diff else b.gpu_data, a) for b, a in zip(self.blobs, self.arrays)])
        return self.arrays

    def incoming(self, arrays=None):
        """Host arrays to receive the blobs' new values into, land() then makes them the blobs' values: `arrays`
        (from host_arrays) where given, else the blobs' own on the CPU and the pinned ones on a GPU. On a GPU the
        copies out of them that an earlier land() queued are waited for first: they must not be overwritten
        before."""
        if self.dev is None:
            return [b.diff if self.diff else b.data for b in self.blobs] if arrays is None else arrays
        self.dev.synchronize()
        return self.arrays if arrays is None else arrays

    def land(self, arrays=None):
        """The values received (into incoming()'s arrays, or into `arrays`: page-locked ones from host_arrays) up to
        the device; on the CPU `arrays` are copied into the blobs, incoming()'s already are theirs."""
        if self.dev is None:
            if arrays is not None:
                for b, a in zip(self.blobs, arrays):
                    np.copyto(b.diff if self.diff else b.data, a)
            return
        for b, a in zip(self.blobs, self.arrays if arrays is None else arrays):
            self.dev.upload(b.mutable_gpu_diff if self.diff else b.mutable_gpu_data, a)
