"""The gradients of one iteration, all-reduced in buckets while the backward still runs (PyTorch DDP's reducer):
the learnable blobs are grouped, last layers first, into buckets of about BUCKET_BYTES (the first one smaller, so
that the exchange starts early); once the backward is past every layer that uses a bucket's blobs, its gradients
are copied into the bucket's flat buffer and their sum over the ring (ring.py) starts while the backward goes on
with the layers below. `finish()` waits for the last bucket and writes the mean back into the diffs, for the
solver's update: Caffe's multi-GPU training (NCCL) sums the diffs and scales them by 1 / solver_count the same way.

Who advances the sums: on MPI, the backward itself, between layers (each layer's hook takes every ring step whose
messages have arrived and posts the next: ring.RingSum), one bucket after the other; on the sockets of sockets.py,
which block, a thread of its own. Measured at 2 workers on 2 cores (LeNet, `python bench/scaling.py --workers 2
--modes allreduce`): with a thread blocked in MPI the 1.6 MB bucket took 4.7 ms to sum, its thread waiting for
the core after every message, and the iteration waited 0.7 ms of its 11.2 for the ring; from the hooks, see
docs/allreduce.md.

On a GPU the copies go device -> page-locked host buffer -> ring -> device (the buffers are pinned).

The last bucket carries FLAGS more floats: what worker 0 asks of everyone (stop, snapshot) and each worker's last
loss ride on the sum, so that every worker learns them at the same iteration, without a message of its own, and
decides the same from them (the mean loss: whether the rate diverged, lr_scaling.Backoff)."""
import queue
import threading
import time
from collections import deque

import numpy as np

from ...backend import select
from ..lr_scaling import all_finite

BUCKET_BYTES = 25 << 20         # DDP's bucket_cap_mb
FIRST_BUCKET_BYTES = 1 << 20    # DDP's first bucket: the exchange starts after the last layers' backward
FLAGS = 3                       # STOP, SNAPSHOT: worker 0's requests; LOSS: each worker's; summed with the last bucket
STOP, SNAPSHOT, LOSS = 0, 1, 2


def _empty(size):
    if select.active():
        return select.current().pinned_empty(size, np.float32)
    return np.empty(size, np.float32)


class Bucket:
    def __init__(self, blobs, ready_at, extra):
        self.blobs = blobs                  # indices into the net's learnable params
        self.ready_at = ready_at            # the layer id past which all of them are final
        self.sizes = []
        self.buffer = None
        self.extra = extra                  # floats at the end for the flags (the last bucket)
        self.done = threading.Event()


class GradientBuckets:
    """Hooked into `net`'s backward (Net.backward_hooks); `ring` sums; `passes`: the backward passes of an iteration
    (iter_size: only the last one's gradients are final)."""

    def __init__(self, net, ring, passes=1, bucket_bytes=BUCKET_BYTES, first_bucket_bytes=FIRST_BUCKET_BYTES):
        self.net, self.ring, self.passes = net, ring, max(1, int(passes))
        params = net.learnable_params
        # the lowest layer that uses each learnable blob: its gradient is final once the backward is past it
        last_user = {}
        for (layer_id, _), learnable in zip(net.param_layer_index, net.learnable_param_ids):
            last_user[learnable] = min(layer_id, last_user.get(learnable, layer_id))
        order = sorted(range(len(params)), key=lambda k: (-last_user[k], -k))
        self.buckets, current, size, cap = [], [], 0, first_bucket_bytes
        for k in order:
            current.append(k)
            size += params[k].count * 4
            if size >= cap:
                self.buckets.append(Bucket(current, min(last_user[i] for i in current), 0))
                current, size, cap = [], 0, bucket_bytes
        if current:
            self.buckets.append(Bucket(current, min(last_user[i] for i in current), 0))
        if not self.buckets:
            self.buckets.append(Bucket([], 0, 0))
        self.buckets[-1].extra = FLAGS
        for bucket in self.buckets:
            bucket.sizes = [params[k].count for k in bucket.blobs]
            bucket.buffer = _empty(sum(bucket.sizes) + bucket.extra)
        self.flags = np.zeros(FLAGS, np.float32)       # this worker's requests for the next iteration
        self.wait_s = 0.0                   # the main thread's time waiting for the exchange, all iterations
        self.exchange_s = 0.0               # the time in the ring's calls (the hooks' and finish's, or the thread's)
        self._pass, self._next, self._armed = 0, 0, False
        self._error = None
        self._thread = None
        if getattr(ring, "nonblocking", False):
            self._sending = deque()         # buckets sent, in order; the first one's sum under way (self._sum)
            self._sum = None
        else:
            self._work = queue.Queue()
            self._thread = threading.Thread(target=self._exchange, name="allreduce", daemon=True)
            self._thread.start()
        net.backward_hooks.append(self._layer_done)

    @property
    def bytes(self):
        """The bytes of one iteration's buffers (the model's gradients and the flags)."""
        return sum(b.buffer.nbytes for b in self.buckets)

    def start_iteration(self):
        """Before an iteration's forward: its last backward pass sends the buckets (a backward outside an iteration,
        as a test's, sends nothing)."""
        self._pass, self._next, self._armed = 0, 0, True
        for bucket in self.buckets:
            bucket.done.clear()

    def _layer_done(self, layer_id):
        if self._armed and self._pass == self.passes - 1:
            while self._next < len(self.buckets) and self.buckets[self._next].ready_at >= layer_id:
                self._send(self.buckets[self._next])
                self._next += 1
            if self._thread is None and self._sending:
                self._advance()
        if layer_id == 0:
            self._pass += 1

    def _send(self, bucket):
        """Copy the bucket's gradients into its buffer and queue it for the exchange thread."""
        params = self.net.learnable_params
        views, at = [], 0
        for k, size in zip(bucket.blobs, bucket.sizes):
            views.append((params[k], bucket.buffer[at:at + size]))
            at += size
        if select.active():
            select.current().download_all([(blob.gpu_diff, view) for blob, view in views])
        else:
            for blob, view in views:
                np.copyto(view, blob.cpu_diff.reshape(-1))
        if bucket.extra:
            bucket.buffer[at:] = self.flags
        if self._thread is None:
            self._sending.append(bucket)
        else:
            self._work.put(bucket)

    def _advance(self, wait=False):
        """Take the ring steps of the buckets sent whose messages have arrived (wait: all of them, waiting)."""
        started = time.perf_counter()
        try:
            while self._sending:
                if self._sum is None:
                    self._sum = self.ring.start(self._sending[0].buffer)
                if wait:
                    self._sum.wait()
                elif not self._sum.progress():
                    break
                self._sum = None
                self._sending.popleft().done.set()
        finally:
            self.exchange_s += time.perf_counter() - started

    def _exchange(self):
        while True:
            bucket = self._work.get()
            if bucket is None:
                return
            started = time.perf_counter()
            try:
                self.ring.allreduce(bucket.buffer)
            except BaseException as exc:       # handed to the main thread by finish()
                self._error = exc
            self.exchange_s += time.perf_counter() - started
            bucket.done.set()

    def finish(self):
        """After the iteration's backward: any bucket not yet sent (a net whose layer 0 was never reached) goes now;
        wait for every bucket, write the mean into the diffs; returns the flags summed over the workers and
        whether every gradient is finite."""
        while self._next < len(self.buckets):
            self._send(self.buckets[self._next])
            self._next += 1
        started = time.perf_counter()
        if self._thread is None:
            self._advance(wait=True)
        for bucket in self.buckets:
            bucket.done.wait()
        self.wait_s += time.perf_counter() - started
        if self._error is not None:
            raise self._error
        scale = np.float32(1.0 / self.ring.size)
        params = self.net.learnable_params
        gpu = select.active()
        finite = True
        for bucket in self.buckets:
            grads = bucket.buffer[:bucket.buffer.size - bucket.extra]
            # the sums are finite where their means are (1 / N makes no Inf); a float32 sum's pass, not a float64 one
            finite = finite and all_finite([grads])
            if gpu:
                np.multiply(grads, scale, out=grads)
            at = 0
            for k, size in zip(bucket.blobs, bucket.sizes):
                view = grads[at:at + size]
                if gpu:
                    select.current().upload(params[k].mutable_gpu_diff, view)
                else:       # the mean written into the diff in the same pass
                    np.multiply(view.reshape(params[k].shape), scale, out=params[k].diff)
                at += size
        last = self.buckets[-1].buffer
        self.flags[:] = 0
        self._armed = False
        return last[last.size - FLAGS:].copy(), finite

    def close(self):
        if self._thread is not None:
            self._work.put(None)
            self._thread.join(5)
        if self._layer_done in self.net.backward_hooks:
            self.net.backward_hooks.remove(self._layer_done)
