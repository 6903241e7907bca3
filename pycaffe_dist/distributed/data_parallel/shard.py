"""A parameter server shard (`--servers K`: DistBelief's sharded parameter server): one process per Redis server of
the job, owning that server's slice of W and merging only it. The slices are the store's layout (store.py): the
learnable blobs laid end to end and cut into K equal slices, so that a net whose bytes sit in one blob (LeNet's
ip1: 93 %) still spreads evenly. A shard reads its slice of each result from its own server and writes its slice of
W there; the workers push and pull all K slices at once, as against any sharded store. So no process moves more
than about 1/K of a merge's bytes: the master moves none of them.

The master keeps every decision (membership, staleness, drops, the rate, tests, snapshots) and sends each shard
the events of its mode's rule in its order, each with the merges it carried out after it (shards.py). The shard
replays the events on its own copy of the rule (modes/), whose results are its slices, so the rule builds on the
slice the merges it built on W (sync's sum in the workers' slot order, a result's 1/staleness); the shard carries
out the merges the master did and no other. Every step is elementwise or per blob piece, so W assembled from the
slices is the W that one master merging alone would hold: in gradient-only the solver's update rule runs on each
piece of a blob with that blob's lr_mult and decay_mult (the spec's blob_rates), at the master's merge count.

At each flush the shard checks its slice for NaN and Inf before publishing it, as the master checks W: a result
that holds one, or a slice that overflowed, sends the slice back to its last published copy and tells the master,
which has every shard go back (a revert: those that published at that flush return to the copy before), so that W
on Redis stays one finite W of one merge count, and then backs the rate off or stops the job (master.py).
"""
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...errors import PycaffeDistError, StoreError
from ...solver import updates
from .. import job as jobs
from .. import lr_scaling
from .. import wire
from ..job_process import POLL_S, JobProcess
from ..redis_client import local_address
from .keys import SPEC, DataParallelStore
from .modes import MODES
from .modes.base import Merge, Result
from .results import first_non_finite
from .weights import add_scaled

log = logging.getLogger("pycaffe_dist.distributed")
READ_THREADS = 2                # a batch's result slices are read ahead on these
WAIT_FOR_W_S = 60.0             # for the master's first W (it publishes the job, then W)
NEWS = "shards"                 # the queue of what the shards tell their master (go:shards)
SHARDED_MODES = ("sync", "async", "partial-sync", "weed-out", "easgd", "gradient-only")   # the modes with a central W


def queue_name(index):
    return "shard%d" % index


class Shard(JobProcess):
    """Shard `index` of a job's K parameter server shards (`dist_caffe shard`)."""
    store_class = DataParallelStore
    spec_kind = SPEC

    def __init__(self, urls, job, index, wait_for_job_s=60.0, master_timeout_s=None, retry_s=30.0):
        super().__init__(urls, job, wait_for_job_s, master_timeout_s, retry_s, python_layers=None)
        self.index, self.name = index, queue_name(index)
        servers = self.spec.get("servers", 1)
        if servers < 2:
            raise PycaffeDistError("job %s has no parameter server shards (it was started without --servers)"
                                   % self.job)
        if len(self.store.urls) != servers or not 0 <= index < servers:
            raise PycaffeDistError("job %s has %d shards, one per Redis server: shard %d of %d Redis URL(s) is not "
                                   "one of them" % (self.job, servers, index, len(self.store.urls)))
        self.mode, self.options = self.spec["mode"], self.spec["options"]
        self.param = jobs.solver_of(self.spec, self.store.key("job"))
        self.names = [b["name"] for b in self.spec["blobs"]]
        self.shapes = [tuple(b["shape"]) for b in self.spec["blobs"]]
        self.size, self.pieces = self.store.layout(self.shapes)[index]     # (blob, start, stop, offset) each
        self.rates = self.spec.get("blob_rates")
        self.rule = MODES[self.mode].MergeRule(self, self.options)
        self.w = np.zeros(self.size, np.float32)
        self.published, self.before = self.w.copy(), self.w.copy()      # the last two slices published
        self.published_count = self.before_count = 0
        self.published_last = False     # whether the last flush published (a revert then goes back one)
        self.history = [np.zeros(self.size, np.float32) for _ in range(self._history_sets())]
        self.current_step = 0
        self.copies = {}                # merge count -> the slice then (the rate's backoff: lr_scaling.Backoff)
        self.slots, self.pending, self.dirty, self.bad = {}, [], False, None
        self.pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="read")
        self.stats["merges"] = 0        # the merge count of the last slice published (the verb's last line)

    def _history_sets(self):
        """How many history sets the master's update rule keeps (gradient-only: momentum, Adam's two), or 0."""
        return len(updates.new_history(self.param, [(1,)])) if self.rule.keeps_history else 0

    # --- what the rule may read (modes.base.RuleView) ----------------------------------------------------------

    def slot(self, worker):
        return self.slots[worker]

    def typical_staleness(self):
        return None             # (the rate's scale is the master's: it comes with each merge)

    def momentum(self):
        return lr_scaling.heavy_ball_momentum(self.param)

    def history(self):
        raise PycaffeDistError("mode %s keeps no central W: it has no shards" % self.mode)

    # --- the frame (JobProcess.run's), said the shard's way ------------------------------------------------------

    def _build(self):
        self._load()

    def _say_ready(self):
        self.store.reply_to(NEWS, dict(self._costs(), status="hello", shard=self.index, host=socket.gethostname(),
                                       address=local_address(self.store.urls[self.index]), pid=os.getpid()))

    def _ready_line(self):
        log.info("Shard %d of job %s: %d floats of W (%s), on %s", self.index, self.job, self.size,
                 self._blobs_text(), self.store.urls[self.index].rpartition("@")[2])

    def _leave(self):
        self.stats["merges"] = self.published_count
        self.pool.shutdown(wait=False, cancel_futures=True)
        super()._leave()

    def _tell_master(self, text):
        try:
            self.store.reply_to(NEWS, {"status": "error", "shard": self.index, "error": text[:2000]})
        except StoreError:
            pass

    def _blobs_text(self):
        return ", ".join("%s[%d:%d]" % (self.names[i], start, stop) for i, start, stop, _ in self.pieces)

    def _load(self):
        """The slice of W the master published (and of its history, where it saved one: a resumed job)."""
        deadline = time.monotonic() + WAIT_FOR_W_S
        while self.store.get_weights_slice(self.index, self.w, missing_ok=True) is None:
            if time.monotonic() > deadline:
                raise StoreError("job %s: the master published no W within %.0f s" % (self.job, WAIT_FOR_W_S))
            self._check_master()
            time.sleep(0.05)
        self.current_step = self.store.master_state().get("current_step", 0)
        for k, h in enumerate(self.history):
            self.store.get_history_slice(k, self.index, h)
        self.published[...] = self.w
        self.before[...] = self.w

    def _main(self):
        while True:
            message = self.store.next_reply(self.name, POLL_S, wire.SHARD_QUEUE)
            if message is None:
                self._check_master()
                continue
            self.last_master = time.monotonic()
            if message["status"] == "stop":
                self._control(message)
            self._apply(message)

    # --- the master's events -----------------------------------------------------------------------------------

    def _apply(self, message):
        """A batch of the master's events, the result slices they name read ahead; then the flush it asks for."""
        events = message["events"]
        reads = {k: self.pool.submit(self._read, e["worker"]) for k, e in enumerate(events) if e["e"] == "result"}
        for k, event in enumerate(events):
            self._event(event, reads.get(k))
        if "count" in message:
            self._flush(message["seq"], message["count"], message.get("force", False))

    def _read(self, worker):
        out = np.empty(self.size, np.float32)
        if self.store.get_result_slice(worker, self.index, out) is None:
            raise StoreError("job %s: worker %s's result is not on %s (was the server restarted?)"
                             % (self.job, worker, self.store.key("x", worker, self.index)))
        return out, self._blob_of(out)

    def _blob_of(self, flat):
        """The first blob whose piece of `flat` holds NaN or Inf, named for a line, or None where none does."""
        if first_non_finite([flat]) is None:
            return None
        for i, start, stop, offset in self.pieces:
            if first_non_finite([flat[offset:offset + stop - start]]) is not None:
                layer, _, number = self.names[i].rpartition("/")
                return "layer %s's blob %s" % (layer, number)
        return None

    def _event(self, event, read):
        kind = event["e"]
        if kind in ("start", "restart"):
            self.slots.update(zip(event["workers"], event["slots"]))
            self.pending = self._merges(self.rule.start(event["workers"]) if kind == "start" else
                                        self.rule.restart(event["workers"], from_weights=event["from_weights"]))
        elif kind == "join":
            self.slots[event["worker"]] = event["slot"]
            self.pending = self._merges(self.rule.on_join(event["worker"]))
        elif kind == "result":
            arrays, bad = read.result()         # (non_finite: here the blob's name, for the master's line)
            self.pending = self._merges(self.rule.on_result(Result(event["worker"], {}, [arrays],
                                                                   event["staleness"], bad)))
        elif kind == "lost":
            self.slots.pop(event["worker"], None)
            self.pending = self._merges(self.rule.on_lost(event["worker"]))
        elif kind == "keep":
            self.copies = {c: a for c, a in self.copies.items() if c in event["kept"]}
            self.copies[event["count"]] = self.w.copy()
        elif kind == "restore":
            if event["count"] not in self.copies:
                raise PycaffeDistError("shard %d: told to go back to the W of merge %d, of which it kept no copy (it "
                                       "has %s)" % (self.index, event["count"], sorted(self.copies) or "none"))
            np.copyto(self.w, self.copies[event["count"]])
            for h in self.history:
                h[...] = 0
            self.dirty = True
        elif kind == "history":
            for k, h in enumerate(self.history):
                self.store.put_history_slice(k, self.index, h, event["count"])
        elif kind == "revert":
            self._revert()
        for count, scale in event.get("m", ()):
            if not self.pending:
                raise PycaffeDistError("shard %d: the master merged at merge %d where this shard's copy of the rule "
                                       "did not (the master and its shards disagree)" % (self.index, count))
            self._merge(self.pending.pop(0), count, scale)

    @staticmethod
    def _merges(actions):
        return [a for a in actions if isinstance(a, Merge)]

    def _merge(self, merge, count, rate_scale):
        """One merge on the slice, as weights.GlobalWeights.move does it on W."""
        for result in merge.results:
            if result.non_finite is not None and self.bad is None:
                self.bad = "worker %s's result holds NaN or Inf in %s" % (result.worker, result.non_finite)
        for arrays, scale in merge.adds:
            add_scaled([self.w], arrays, scale)
        if merge.gradients is not None:
            self._update(merge.gradients[0], count, merge.scale * rate_scale)
        self.dirty = True

    def _update(self, gradient, count, rate_scale):
        """The solver's update rule (Caffe's ApplyUpdate) on each blob piece of the slice, with that blob's
        multipliers: elementwise, so the pieces get what the whole blobs would (clip_gradients, which needs the
        whole gradient's norm, and --lars, the whole blobs', are refused with shards: shards.check_shardable)."""
        views = [(i, slice(offset, offset + stop - start)) for i, start, stop, offset in self.pieces]
        history = [h[where] for h in self.history for _, where in views]
        result = updates.compute_steps(self.param, [self.w[where] for _, where in views],
                                       [gradient[where] for _, where in views],
                                       [self.rates[i][0] * rate_scale for i, _ in views],
                                       [self.rates[i][1] for i, _ in views], history, count, self.current_step,
                                       "the job's solver", apply=True)
        self.current_step = result["current_step"]

    # --- publishing ----------------------------------------------------------------------------------------------

    def _flush(self, seq, count, force):
        """Publish the slice at merge `count` (if it moved, or `force`), checked first; tell the master."""
        news = {"status": "flushed", "shard": self.index, "seq": seq}
        bad = self.bad
        if bad is None and (self.dirty or force):
            where = self._blob_of(self.w)
            bad = None if where is None else "W overflowed to Inf or NaN in %s" % where
        self.bad = None
        if bad is not None:
            np.copyto(self.w, self.published)           # this flush publishes nothing
            self.dirty, self.published_last = False, False
            news["bad"] = bad
        elif self.dirty or force:
            self.store.put_weights_slice(self.index, self.w, count, self.current_step)
            self.before, self.published = self.published, self.before
            np.copyto(self.published, self.w)
            self.before_count, self.published_count = self.published_count, count
            self.dirty, self.published_last = False, True
        else:
            self.published_last = False
        news.update(self._costs(), published=self.published_count)
        self.store.reply_to(NEWS, news)

    def _costs(self):
        """What this process has cost so far: its blob bytes each way and its CPU time (the master's figures)."""
        return {"sent": self.store.blob_bytes["sent"], "received": self.store.blob_bytes["received"],
                "cpu_s": time.process_time()}

    def _revert(self):
        """Another shard found NaN or Inf at the last flush: back to the slice published before it, where this
        one published then (it is written again at the flush that follows the revert)."""
        if self.published_last:
            np.copyto(self.published, self.before)
            self.published_count = self.before_count
            self.published_last = False
        np.copyto(self.w, self.published)
        self.dirty = True
