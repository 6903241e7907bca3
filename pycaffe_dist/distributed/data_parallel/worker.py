"""A worker: wraps a local Solver, reads its own shard of the training data, and runs rounds for the master.

Lifecycle, all through Redis: take an id, beat the heart (a key with a TTL), join (the master answers with a data
shard), build the solver, say ready, wait for the welcome, then rounds until told to stop. A round starts from
weights x, runs tau solver steps at the global iteration the master sent (its learning rate), and pushes the
mode's result; the master's reply says merged, dropped or reset, and what to pull (W; in gossip, a live peer's
weights).

Every reply is checked (wire.REPLY) before it is used, and so is every W pulled: the master never publishes one
holding NaN or Inf, so such a W means the job's data on Redis is damaged (DamagedData), not that the rate is too
high. However a worker stops, it says why in its leave message, so that the master can say it too.

Exchange and computation overlap (the mode's depth 1): a single exchange thread pushes round r's result, waits
for the reply and pulls, while the main thread computes round r+1; the next round then starts where the mode
says (modes/base.py). Numerical work stays on the main thread; the exchange thread only moves bytes.
"""
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ... import common
from ...backend import select
from ...errors import PycaffeDistError, StoreError
from ...solver.solver import Solver
from .. import job as jobs
from .. import wire
from ..job_process import POLL_S, JobProcess, Stopped
from ..redis_client import local_address
from .broadcast import WorkerUpdates
from .compression import Damaged, ErrorFeedback, format_of
from .keys import SPEC, DataParallelStore
from .modes import MODES
from .results import first_non_finite

log = logging.getLogger("pycaffe_dist.distributed")


class Rejoin(Exception):
    """The master no longer counts this worker in (its heartbeat lapsed): it joins again."""


class Outcome:
    """A reply and what was pulled after it: status, W, the merge count W was written at (`version`), the merge
    count the reply was sent at (`iteration`), the live workers the master counted, and the scale of the solver's
    rate the master asks for (lr_scaling.py)."""

    def __init__(self, status, pulled=None, version=0, iteration=None, workers=1, rate_scale=1.0,
                 clear_history=False):
        self.status, self.pulled, self.version = status, pulled, version
        self.iteration, self.workers, self.rate_scale = iteration, workers, rate_scale
        self.clear_history = clear_history      # a reset after the rate diverged: momentum starts again at 0

    @classmethod
    def of(cls, reply, pulled):
        """From a reply checked by wire.REPLY (its fields are of their types when present)."""
        return cls(reply["status"], pulled[0], pulled[1], reply.get("iter", 0), max(1, reply.get("workers", 1)),
                   reply.get("lr_scale", 1.0), reply.get("clear_history", False))


class ExchangeBuffers:
    """The host arrays a worker's rounds move W through, allocated once (page-locked on a GPU, so that the DMA to
    and from the device runs from them with no staging copy, and the store's sockets read and write them in
    place).

    - pulls: W is received into two sets in turn. With the exchange in flight, round r+1 computes from the W of
      round r-1's exchange while round r's exchange receives the next one, into the other set.
    - gradients: two sets in turn, for the same reason (round r's are sent while round r+1 computes its own).
    - x_end: one set; the weights at a round's end live only until the mode has made its result of them."""

    def __init__(self, shapes):
        if select.active():
            dev = select.current()

            def empty(shape):
                return dev.pinned_empty(int(np.prod(shape)), np.float32).reshape(shape)
        else:
            def empty(shape):
                return np.empty(shape, np.float32)
        self._pulls = [[empty(s) for s in shapes] for _ in range(2)]
        self._gradients = [[empty(s) for s in shapes] for _ in range(2)]
        self.x_end = [empty(s) for s in shapes]
        self._pulled = self._computed = 0

    def next_pull(self):
        self._pulled += 1
        return self._pulls[self._pulled % 2]

    def next_gradients(self):
        self._computed += 1
        return self._gradients[self._computed % 2]


class Worker(JobProcess):
    store_class, spec_kind = DataParallelStore, SPEC
    def __init__(self, urls, job=None, threads=1, master_timeout_s=None, retry_s=30.0, wait_for_job_s=60.0,
                 worker_id=None, delay_s=0.0, python_layers=()):
        super().__init__(urls, job, max(0.0, wait_for_job_s), master_timeout_s, retry_s, python_layers)
        self.threads = threads
        self.delay_s = delay_s              # seconds added to every round: a straggler on purpose, for tests
        self.mode = MODES[self.spec["mode"]].RoundRule
        self.tau = int(self.spec["options"].get("tau", 1))     # gradient-only has no tau: one gradient a round
        self.id = self.name = self.store.claim_worker_id(worker_id)
        self.epoch = 0
        self.stats = {"rounds": 0, "images": 0, "averagings": 0}
        self.updates = None                 # WorkerUpdates, in a job with compressed updates

    # --- messages --------------------------------------------------------------------------------------------

    def _send_and_await(self, message, accept):
        """Send `message` to the master and return the next reply `accept` takes (others are stale and skipped);
        checks the job and the master meanwhile. A message or its reply can be lost (a blocking pop that Redis
        serves to a connection the client already gave up, after Redis stalled longer than the socket timeout):
        with no reply after twice the heartbeat time while the master lives, the message is sent again (the
        master answers a message it has seen with its last reply)."""
        self.store.send_to_master(message)
        return self._await(accept, resend=message)

    def _await(self, accept, resend=None):
        last_master = sent = time.monotonic()
        gone_since = None
        while True:
            if self.error is not None:
                raise self.error
            if self.stopping.is_set():
                raise Stopped()
            message = self.store.next_reply(self.id, POLL_S, wire.REPLY)
            if message is not None:
                if message["status"] == "stop":
                    if message.get("why"):
                        raise jobs.stopped_by_master(self.job, message["why"])
                    raise Stopped()
                if message["status"] == "rejoin":
                    raise Rejoin()
                if message["status"] == "reset":
                    self.epoch = message.get("epoch", self.epoch)
                if accept(message):
                    return message
                continue
            state = self.store.job_state()
            if state is None:
                # A Redis restarted empty: the master publishes the job again and resets its workers.
                if gone_since is None:
                    gone_since = time.monotonic()
                    log.warning("job %s is gone from Redis: waiting up to %.0f s for the master to publish it again",
                                self.job, self.master_timeout_s)
                elif time.monotonic() - gone_since > self.master_timeout_s:
                    raise StoreError("job %s is gone from Redis (the job was removed or the server restarted) and "
                                     "was not published again within %.0f s" % (self.job, self.master_timeout_s))
                continue
            gone_since = None
            if state == "done":
                last = self.store.next_reply(self.id, 0, wire.REPLY)    # the master's stop, queued before "done"
                if last is not None and last["status"] == "stop" and last.get("why"):
                    raise jobs.stopped_by_master(self.job, last["why"])
                raise Stopped()
            if self.store.master_alive():
                last_master = time.monotonic()
                if resend is not None and last_master - sent > 2 * self.heartbeat_s:
                    self.store.send_to_master(resend)
                    sent = last_master
            elif time.monotonic() - last_master > self.master_timeout_s:
                raise StoreError("the master of job %s has not been seen for %.0f s (restart it with --resume to "
                                 "continue)" % (self.job, self.master_timeout_s))

    # --- setup -------------------------------------------------------------------------------------------------

    def _join(self):
        info = {"host": socket.gethostname(), "address": local_address(self.store.urls[0]), "pid": os.getpid()}
        reply = self._send_and_await(dict(info, type="join", worker=self.id),
                                     lambda m: m.get("status") in ("slot", "reset"))
        if reply["status"] == "reset":          # a restarted master: join again
            return self._join()
        return reply["slot"], reply["shards"]

    def _build_solver(self, slot, shards):
        common.set_num_threads(self.threads)
        common.set_data_shard(slot % shards, shards)
        solver = Solver(jobs.worker_solver(self.spec["solver"], slot))
        solver.trust = self.spec["options"].get("lars")       # a layer-wise clip of the scaled rate (--lars)
        jobs.check_shapes(self.job, solver.weight_shapes, self.spec)
        return solver

    # --- the rounds ----------------------------------------------------------------------------------------------

    def _exchange(self, round_id, result, info):
        """Push round `round_id`'s result, wait for the master's reply, pull W."""
        if self.stopping.is_set():
            raise Stopped()
        self.store.put_result(self.id, result, round_id)
        reply = self._send_and_await(dict(info, type="result", worker=self.id, round=round_id, epoch=self.epoch),
                                     lambda m: m.get("status") == "reset" or m.get("round") == round_id)
        if hasattr(self.mode, "choose_peer") and reply.get("status") == "merged":
            return self._pull_a_peer(reply)
        return Outcome.of(reply, self._pull(update_ok=reply.get("status") == "merged"))

    def _pull_a_peer(self, reply):
        """Gossip (modes/gossip.py): instead of W, the weights a peer last published, the peer chosen by the mode
        among the live others the reply lists; status 'peer', or 'alone' when there is none or its key is gone
        (counted out between the reply and the read)."""
        peers = [w for w in reply.get("peers") or [] if w != self.id]
        peer = self.mode.choose_peer(peers)
        pulled = None if peer is None else \
            self.store.get_result(peer, self.shapes, out=self.buffers.next_pull(), missing_ok=True)
        if pulled is None:
            return Outcome.of(dict(reply, status="alone"), (None, 0))
        self.stats["averagings"] += 1
        return Outcome.of(dict(reply, status="peer"), (pulled, 0))

    def _pull(self, update_ok=False):
        """(W, its merge count). After a merge (`update_ok`) in a job with compressed updates (broadcast.py), W is
        rebuilt from the W held and the merge's update where it can be; otherwise pulled whole. W is missing only
        after a Redis restarted empty, until the master publishes the job again: wait for it as long as for a
        master."""
        deadline = time.monotonic() + self.master_timeout_s
        out = self.buffers.next_pull()
        if update_ok and self.updates is not None:
            payload, version = self.store.get_update(self.updates.payload)
            try:
                if payload is not None and self.updates.apply(payload, version, out):
                    return self._checked_weights(out, "U"), version
            except Damaged as exc:
                raise wire.DamagedData("job %s: %s holds a damaged or foreign compressed update: %s"
                                       % (self.job, self.store.key("U", "*"), exc)) from None
        while True:
            weights, version = self.store.get_weights(self.shapes, out=out, missing_ok=True)
            if weights is not None:
                self._checked_weights(weights, "W")
                if self.updates is not None:
                    self.updates.pulled_whole(weights, version)
                return weights, version
            if time.monotonic() > deadline:
                raise StoreError("job %s: W is gone from Redis and was not published again within %.0f s"
                                 % (self.job, self.master_timeout_s))
            if self.stopping.wait(0.1):
                raise Stopped()

    def _checked_weights(self, weights, kind):
        """W as pulled, refused when it holds NaN or Inf: the master checks every W before it publishes it, so the
        job's data on Redis was damaged, and a lower rate would not help."""
        bad = first_non_finite(weights)
        if bad is not None:
            raise wire.DamagedData("job %s: the weights read from %s hold NaN or Inf in blob %s (%s), which its "
                                   "master never publishes: the job's data on Redis is damaged" % (
                                       self.job, self.store.key(kind, "*"), bad, self.spec["blobs"][bad]["name"]))
        return weights

    def _compute(self, solver, start, iteration, rate_scale):
        """One round's work from the weights `start`, its steps at the solver's rate times `rate_scale`: (the
        weights at its end, the gradients or None, the loss). On a GPU, start goes up and the result comes down
        once each, between the device and pinned buffers."""
        solver.set_weights(start)
        if self.mode.gradients:
            gradients, loss = solver.compute_gradients(out=self.buffers.next_gradients())
            if self.delay_s:
                time.sleep(self.delay_s)
            return start, gradients, loss
        loss = solver.step_from(iteration, self.tau, rate_scale)
        if self.delay_s:
            time.sleep(self.delay_s)
        return solver.read_weights(self.buffers.x_end), None, loss

    def run(self):
        beat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self.store.worker_heartbeat(self.id, self.heartbeat_s)
        beat.start()
        exchange = ThreadPoolExecutor(1, thread_name_prefix="exchange")
        failure = None                          # what stopped this worker, said in its leave message
        try:
            slot, shards = self._join()
            log.info("worker %s of job %s: data shard %d of %d", self.id, self.job, slot % shards, shards)
            solver = self._build_solver(slot, shards)
            self.shapes = solver.weight_shapes
            self.buffers = ExchangeBuffers(self.shapes)
            self.feedback = ErrorFeedback.for_job(self.spec["options"], self.shapes)     # None: no --compress
            self.updates = WorkerUpdates(format_of(self.spec["options"], self.shapes), self.shapes) \
                if self.spec.get("updates") else None
            images = solver.images_per_iteration * (1 if self.mode.gradients else self.tau)
            while True:
                try:
                    welcome = self._send_and_await({"type": "ready", "worker": self.id},
                                                   lambda m: m["status"] in ("welcome", "reset"))
                    self.epoch = welcome.get("epoch", 0)
                    start = Outcome.of(dict(welcome, status="merged"), self._pull())
                    self._rounds(solver, exchange, start, images)
                except Rejoin:
                    # Counted out while it could not beat (stopped, cut off): it joins again and goes on from W.
                    log.warning("worker %s: the master counted it out; joining again", self.id)
                    exchange.shutdown(wait=True, cancel_futures=True)
                    exchange = ThreadPoolExecutor(1, thread_name_prefix="exchange")
                    again, shards = self._join()
                    if again != slot:
                        slot, solver = again, self._build_solver(again, shards)
        except Stopped:
            pass
        except Exception as exc:
            failure = exc
            raise
        finally:
            self.stopping.set()
            exchange.shutdown(wait=True, cancel_futures=True)
            self._leave(failure)
        if self.error is not None:
            raise self.error
        if self.updates is not None:
            self.stats.update(pulls_by_update=self.updates.applied, whole_pulls=self.updates.whole)
        return self.stats

    def _rounds(self, solver, exchange, outcome, images):
        """Rounds until the master says stop. `outcome` is the last reply (status, W, iteration) the worker knows;
        with depth 1 it is that of the round before the one that just ended, whose exchange was in flight."""
        depth, options = int(self.spec.get("depth", 1)), self.spec["options"]
        if self.feedback is not None:
            self.feedback.forget()              # a new start from W: nothing is owed to it
        start, iteration, base = outcome.pulled, outcome.iteration, outcome.version
        in_flight, round_id = None, 0
        previous = None                         # the result sent last round: with overlap, what `outcome` answers
        # A round runs from one submit to the next; `blocked` is the part of it spent waiting on the exchange.
        last_submit, blocked = time.perf_counter(), 0.0
        while True:
            x_end, gradients, loss = self._compute(solver, start, iteration, outcome.rate_scale)
            if in_flight is not None:
                waited = time.perf_counter()
                outcome = in_flight.result()
                blocked += time.perf_counter() - waited
                if outcome.clear_history:
                    # The rate diverged (lr_scaling.Backoff): this round started from weights and momentum that
                    # took part; it is not sent, and the next starts from W with the momentum cleared.
                    start, in_flight = self._fresh_start(solver, outcome), None
                    base, iteration = outcome.version, outcome.iteration
                    continue
            result = self.mode.result(start, x_end, gradients, outcome.pulled, options, outcome.workers)
            sent = result if self.feedback is None else self._compressed(result, outcome.status)
            now = time.perf_counter()
            info = {"loss": loss, "images": images, "compute_s": now - last_submit - blocked, "wait_s": blocked,
                    "base": base, "averagings": self.stats["averagings"]}
            future = exchange.submit(self._exchange, round_id, sent, info)
            last_submit, blocked = now, 0.0
            in_flight = future if depth else None
            answered, previous = (previous if depth else result), result
            if not depth:
                outcome = future.result()
                blocked = time.perf_counter() - now
            if outcome.clear_history:         # (without overlap: the result just sent was merged or refused)
                start = self._fresh_start(solver, outcome)
                base, iteration = outcome.version, outcome.iteration
                self.stats["rounds"] += 1
                self.stats["images"] += images
                round_id += 1
                continue
            start = self.mode.next_start(outcome.status, outcome.pulled, x_end, result, in_flight is not None,
                                         answered)
            base = self.mode.base(outcome.version, outcome.status, in_flight is not None)
            # With this round's result in flight, the reply's merge count is one round short.
            iteration = outcome.iteration + (self.tau if in_flight is not None else 0)
            self.stats["rounds"] += 1
            self.stats["images"] += images
            round_id += 1

    def _fresh_start(self, solver, outcome):
        """After a reset that clears the history (lr_scaling.Backoff): the solver's momentum and what compression
        owed are dropped; returns W, where the next round starts."""
        solver.clear_history()
        outcome.clear_history = False
        if self.feedback is not None:
            self.feedback.forget()
        return outcome.pulled

    def _compressed(self, result, status):
        """The payload of `result` plus what earlier payloads left out (compression.py). `status`: the last reply's;
        a dropped or reset result took what it owed with it."""
        if status != "merged":
            self.feedback.forget()
        return self.feedback.encode(result)

    def _leave(self, failure=None):
        """Say goodbye (with the failure that stops this worker, if one does) while the job runs, and remove the
        heartbeat and reply queue. A job that is done or gone is left without a message: its keys are being
        removed, and one sent now would be left behind. After a failure (maybe Redis itself) Redis is retried a few
        seconds only."""
        if failure is not None:
            self.store.retry_s = min(self.store.retry_s, 2.0)
        try:
            if self.store.job_state() == "running":
                message = {"type": "leave", "worker": self.id}
                if failure is not None:
                    text = str(failure) if isinstance(failure, PycaffeDistError) else \
                        "%s: %s" % (type(failure).__name__, failure)
                    message.update(error=text[:wire.ERROR_LIMIT], damaged=isinstance(failure, wire.DamagedData))
                self.store.send_to_master(message)
        except StoreError:
            pass
        try:
            self.store.leave(self.id)
        except StoreError:
            pass

