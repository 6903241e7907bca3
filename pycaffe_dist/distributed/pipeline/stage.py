"""A pipeline stage: one process that trains a consecutive range of the TRAIN net's layers (net/partition.py cuts
it; master.py beside it publishes the job), DistBelief's model partitions run on GPipe's schedule (Huang et al.
2019).

Every stage builds the whole net as the master's Solver does, its data layers turned into Input layers of one
micro-batch (so its layers, blobs and backward decisions are the whole net's), with no parameter filled; it runs
only its own layers (Net.forward_from_to / backward_from_to) and holds only their parameters and activations.
Stage 0 also reads the data: its data layers run whole batches in a net of their own, cut into micro-batches.

One batch (GPipe): the M micro-batches forward one after the other, each stage handing the blobs crossing its cut
on as soon as a micro-batch is through (so the stages work at once), then the M backwards in reverse order, each
handing back the gradients of the blobs it received. Activations are not kept: a stage keeps what it received for
each micro-batch and computes the micro-batch's forward again right before its backward (rematerialisation; the
last one is still there). The recompute replays the draws of the layers' own random streams (Dropout), so it
computes what the first forward did. The parameters' gradients add up over the micro-batches (and the solver's
iter_size batches), and the update divides them by iter_size x M: Caffe's iter_size, which for layers that don't
mix the samples of a batch is the whole batch's gradient. Each stage then applies the solver's update rule
(solver/updates.py, as the Solver does) to its own parameters at the same iteration.

The job's keys a pipeline adds (what crosses each cut, each stage's state, the queues between stages) are
PipelineStore's (keys.py).
"""
import logging
import time

import numpy as np
from google.protobuf import text_format

from ... import common
from ...backend import select
from ...blob.synced_memory import SyncedMemory
from ...errors import PycaffeDistError, StoreError
from ...net.net import Net
from ...proto import caffe_pb2
from ...solver import updates, updates_gpu
from .. import wire
from ..blob_exchange import BlobExchange, host_arrays
from ..job_process import POLL_S, JobProcess
from .keys import SPEC, PipelineStore, control_queue, flow_queue

log = logging.getLogger("pycaffe_dist.distributed")
f32 = np.float32


def state_due(param, count, max_iter):
    """Whether the stages hand their parameters to the master after `count` iterations: for a snapshot, a test,
    or the end."""
    return count >= max_iter or bool(param.snapshot and count % param.snapshot == 0) or \
        bool(param.test_interval and count % param.test_interval == 0)


class Stage(JobProcess):
    store_class, spec_kind = PipelineStore, SPEC
    def __init__(self, urls, job, stage, threads=1, wait_for_job_s=60.0, master_timeout_s=None, retry_s=30.0,
                 python_layers=()):
        super().__init__(urls, job, wait_for_job_s, master_timeout_s, retry_s, python_layers)
        self.index, self.stages = int(stage), len(self.spec["stages"])
        if not 0 <= self.index < self.stages:
            raise PycaffeDistError("job %s has stages 0 to %d, not %d" % (self.job, self.stages - 1, self.index))
        self.name = flow_queue(self.index)
        self.threads = threads
        self.halt_requested = False
        self.pending = None                 # a notice taken from the queue, not yet handled
        self.waited_s = 0.0                 # this iteration's time waiting on the stages beside
        self.stats = {"iterations": 0, "compute_s": 0.0, "wait_s": 0.0}

    # --- setup -------------------------------------------------------------------------------------------------

    def _build(self):
        spec = self.spec
        common.set_num_threads(self.threads)
        self.param = text_format.Parse(spec["solver"], caffe_pb2.SolverParameter())
        if self.param.random_seed >= 0:
            common.set_random_seed(self.param.random_seed)   # the layers' random streams, keyed as in one process
        state = spec["state"]                       # (parsed by job.check_spec, as "net" and "feed")
        self.net = Net(spec["net"], state=state, fill_params=False)
        self.micro = int(spec["micro_batches"])
        self.first, self.last = spec["stages"][self.index]["range"]
        cuts = spec["cuts"]
        self.inputs = cuts[self.index - 1] if self.index > 0 else None
        self.outputs = cuts[self.index] if self.index < self.stages - 1 else None
        self.feed = None
        if self.index == 0:
            self.feed = Net(spec["feed"], state=state)
            self.feed_tops = [self.feed.blob_names[i] for ids in self.feed.top_ids for i in ids]
        # the crossing blobs, sent and received through host arrays allocated once (blob_exchange.py)
        blob = self.net.blob_by_name
        if self.inputs is not None:
            self.received = [host_arrays(self.inputs["shapes"]) for _ in range(self.micro)]
            self.fed = BlobExchange([blob(n) for n in self.inputs["blobs"]])
            self.diffs_out = BlobExchange([blob(n) for n, d in zip(self.inputs["blobs"], self.inputs["needs_diff"])
                                           if d], diff=True)
        if self.outputs is not None:
            self.sent = BlobExchange([blob(n) for n in self.outputs["blobs"]])
            self.diffs_in = BlobExchange([blob(n) for n, d in zip(self.outputs["blobs"], self.outputs["needs_diff"])
                                          if d], diff=True)
        # The update divides the gradients summed over iter_size batches of M micro-batches by iter_size x M.
        self.update_param = caffe_pb2.SolverParameter()
        self.update_param.CopyFrom(self.param)
        self.update_param.iter_size = self.param.iter_size * self.micro
        owned = spec["stages"][self.index]["params"]
        self.own = [self.net.learnable_params[i] for i in owned]
        self.lr_mults = [self.net.params_lr[i] for i in owned]
        self.decay_mults = [self.net.params_weight_decay[i] for i in owned]
        self.history = updates.new_history(self.param, [b.shape for b in self.own])
        # On a GPU the update runs on the device copies, as the Solver's (solver/updates_gpu.py): the history's
        # device copies (made at the first update) and the ParameterTable of SGD's one launch.
        self.history_memory, self.update_tables = None, {}
        self.random_layers = [layer for layer in self.net.layers[self.first:self.last + 1]
                              if getattr(layer, "random_stream", None) is not None]
        self._load_state()

    def _state_arrays(self):
        """The parameters' and the solver history's host arrays, which _load_state fills (before any update)."""
        return [b.data for b in self.own] + self.history

    def _current_state(self):
        """The state as it is now, to send: on a GPU the device copies are read back (and stay current)."""
        for memory in self.history_memory or ():
            memory.host(write=False)
        return [b.cpu_data for b in self.own] + self.history

    def _device_history(self):
        if self.history_memory is None:
            self.history_memory = [SyncedMemory(h.size, h.dtype, host=h.reshape(-1)) for h in self.history]
        return [memory.device() for memory in self.history_memory]

    def _load_state(self):
        arrays = self.store.get_state(self.index, [a.shape for a in self._state_arrays()])
        for mine, given in zip(self._state_arrays(), arrays):
            mine[...] = given
        self.count, self.current_step = int(self.spec["start"]), int(self.spec["current_step"])

    # --- messages ------------------------------------------------------------------------------------------------

    def identity(self):
        return {"stage": self.index}

    def control_queue(self):
        return control_queue(self.index)

    def _control(self, message):
        status = super()._control(message)
        if status == "halt":
            self.halt_requested = True
        return status

    def _wait(self, queue, accept):
        """The next message on `queue` that accept(message) takes; the master's control messages are seen to
        meanwhile. Gives up when the job ends or its master is gone."""
        self.last_master = started = time.monotonic()
        while True:
            if self.error is not None:
                raise self.error
            if queue == self.name and self.pending is not None:
                message, self.pending = self.pending, None
            else:
                message = self.store.next_reply(queue, POLL_S, wire.CONTROL if queue == control_queue(self.index)
                                                else wire.FLOW)
            if queue == self.name:
                self.waited_s += time.monotonic() - started
                started = time.monotonic()
            if message is not None:
                if queue == control_queue(self.index):
                    self._control(message)
                if accept(message):
                    return message
                if queue != control_queue(self.index):
                    raise StoreError("stage %d of job %s: unexpected notice %r" % (self.index, self.job, message))
                continue
            self._check_master()

    def _moving(self, transfer, *args, **kwargs):
        """A transfer of crossing blobs through the store: its time counts as exchange with the waiting, not as
        computing (over a slow link it is most of an iteration)."""
        started = time.monotonic()
        try:
            return transfer(*args, **kwargs)
        finally:
            self.waited_s += time.monotonic() - started

    def _notice(self, kind, count, batch, micro):
        return {"kind": kind, "count": count, "batch": batch, "micro": micro}

    def _expect(self, kind, count, batch, micro):
        wanted = self._notice(kind, count, batch, micro)
        return self._wait(self.name, lambda m: m == wanted)

    # --- one batch: GPipe's schedule ---------------------------------------------------------------------------

    def _stream_positions(self):
        return [layer.random_stream.counter for layer in self.random_layers]

    def _set_stream_positions(self, positions):
        for layer, counter in zip(self.random_layers, positions):
            layer.random_stream.counter = counter

    def _load(self, count, batch, micro, first_time):
        """Put micro-batch `micro`'s inputs into the stage's blobs: stage 0's slice of the data, the others' blobs
        received from the stage before (received once, kept for the recompute)."""
        if self.index == 0:
            for name in self.feed_tops:
                whole = self.feed.blob_by_name(name).data
                size = whole.shape[0] // self.micro
                self.net.blob_by_name(name).data[...] = whole[micro * size:(micro + 1) * size]
            return
        if first_time:
            self._expect("forward", count, batch, micro)
            self._moving(self.store.get_activations, self.index - 1, micro, self.inputs["shapes"],
                         out=self.fed.incoming(self.received[micro]))
        self.fed.land(self.received[micro])

    def _send_forward(self, count, batch, micro):
        self._moving(self.store.put_activations, self.index, micro, self.sent.outgoing(), count)
        self.store.notify(self.index + 1, self._notice("forward", count, batch, micro))

    def _receive_backward(self, count, batch, micro):
        self._expect("backward", count, batch, micro)
        if self.diffs_in.blobs:
            self._moving(self.store.get_gradients, self.index + 1, micro,
                         [b.shape for b in self.diffs_in.blobs], out=self.diffs_in.incoming())
            self.diffs_in.land()

    def _send_backward(self, count, batch, micro):
        if self.diffs_out.blobs:
            self._moving(self.store.put_gradients, self.index, micro, self.diffs_out.outgoing(), count)
        # sent with nothing to carry too: the stages stay in step, so each queue sees its notices in order
        self.store.notify(self.index - 1, self._notice("backward", count, batch, micro))

    def _batch(self, count, batch):
        """One batch's forwards and backwards; returns the mean of its micro-batches' losses (of this stage's
        loss layers)."""
        loss = f32(0)
        if self.index == 0:
            self.feed.forward_from_to()
        positions = []
        for micro in range(self.micro):
            self._load(count, batch, micro, first_time=True)
            positions.append(self._stream_positions())
            loss += f32(self.net.forward_from_to(self.first, self.last))
            if self.outputs is not None:
                self._send_forward(count, batch, micro)
        after = self._stream_positions()
        for micro in reversed(range(self.micro)):
            if micro != self.micro - 1:
                # rematerialise: the net holds the last micro-batch's activations only
                self._load(count, batch, micro, first_time=False)
                self._set_stream_positions(positions[micro])
                self.net.forward_from_to(self.first, self.last)
            if self.outputs is not None:
                self._receive_backward(count, batch, micro)
            self.net.backward_from_to(self.last, self.first)
            if self.inputs is not None:
                self._send_backward(count, batch, micro)
        self._set_stream_positions(after)
        return loss / f32(self.micro)

    def _iteration(self, count):
        gpu = select.active()
        for blob in self.own:
            if gpu:
                select.current().memset(blob.mutable_gpu_diff, 0)
            else:
                blob.diff[...] = 0
        loss = f32(0)
        for batch in range(self.param.iter_size):
            loss += self._batch(count, batch)
        if gpu:
            result = updates_gpu.compute_steps(self.update_param, self.own, self.lr_mults, self.decay_mults,
                                               self._device_history(), count, self.current_step, "solver",
                                               self.update_tables)
            updates_gpu.apply_steps(self.own, self.update_tables)
        else:
            result = updates.compute_steps(self.update_param, [b.data for b in self.own], [b.diff for b in self.own],
                                           self.lr_mults, self.decay_mults, self.history, count, self.current_step,
                                           "solver", apply=True)
        self.current_step = result["current_step"]
        return float(loss / f32(self.param.iter_size)), float(result["rate"])

    # --- the loop ------------------------------------------------------------------------------------------------

    def _put_state(self, final):
        if self.unacked:
            self._wait(control_queue(self.index), lambda m: m.get("status") == "ack")
        self.store.put_state(self.index, self._current_state(), self.count)
        self.unacked = True
        self.store.send_to_master({"type": "state", "stage": self.index, "count": self.count, "final": final})
        self.state_at = self.count

    def _train(self):
        max_iter = int(self.spec["max_iter"])
        self.state_at = None
        while True:
            if self.index == 0:
                self._poll_control()
                if self.count >= max_iter or self.halt_requested:
                    if self.stages > 1:
                        self.store.notify(1, {"kind": "halt", "count": self.count})
                    break
            else:
                # the stage before says what comes next: this iteration's first forward, or halt
                first = self._wait(self.name, lambda m: True)
                if first.get("kind") == "halt":
                    if int(first.get("count", -1)) != self.count:
                        raise StoreError("stage %d of job %s: halt at %s, but it is at %d" % (
                            self.index, self.job, first.get("count"), self.count))
                    if self.index < self.stages - 1:
                        self.store.notify(self.index + 1, first)
                    break
                self.pending = first                        # where _expect takes it first
            started, self.waited_s = time.perf_counter(), 0.0
            loss, rate = self._iteration(self.count)
            self.count += 1
            seconds = time.perf_counter() - started
            self.stats["iterations"] += 1
            self.stats["wait_s"] += self.waited_s
            self.stats["compute_s"] += seconds - self.waited_s
            self.store.send_to_master({"type": "iteration", "stage": self.index, "iter": self.count - 1,
                                       "loss": loss, "rate": rate, "compute_s": seconds - self.waited_s,
                                       "wait_s": self.waited_s})
            if state_due(self.param, self.count, max_iter):
                self._put_state(final=False)
        if self.state_at == self.count:
            self.store.send_to_master({"type": "state", "stage": self.index, "count": self.count, "final": True,
                                       "again": True})
        else:
            self._put_state(final=True)
        self._wait(control_queue(self.index), lambda m: False)      # until the master says stop

    def _main(self):
        self._train()

    def _ready_line(self):
        log.info("stage %d of job %s: layers %s to %s, %d micro-batches", self.index, self.job,
                 self.net.layer_names[self.first], self.net.layer_names[self.last], self.micro)
