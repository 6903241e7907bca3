"""The master: holds the global weights W, merges the workers' results by the mode's rule, tests and snapshots W.

It publishes the job (store.py lists the keys), writes W to Redis, waits for its workers, then serves its inbox:
join (answered with a data shard), ready, result, leave. Each event goes to the mode's rule (modes/base.py), which
returns what to do (merge with a scale, drop, reply, hold); the master carries that out, the rule never calling
back. Its concerns beside it: the workers (membership.py), W and what moves it (weights.py), what goes out and in
which order (publisher.py), the rate of N workers (lr_scaling.py). After each batch of messages it writes W once,
in one transaction with its state (merge count), and only then sends the replies, so a worker that pulls after a
reply sees its own merge. Heartbeats tell it which workers are gone. Gossip has no central W (modes/gossip.py):
there W is made the mean of the workers' own weights for each test, snapshot and newcomer.

Units: max_iter, display, test_interval, snapshot and the learning-rate schedule count merges (one per merged
result; one per round of the live workers in sync, local-sgd and gossip), as SpeeDO counted them. The TEST nets
score a copy of W every test_interval merges and at the end, on the tester's thread (tester.py) while merging goes
on; snapshots are Caffe's .caffemodel / .solverstate of W (the solver state holds the master's update history in
gradient-only mode, the outer momentum in local-sgd, zeros otherwise). Log lines are Caffe's, so `dist_caffe plot`
reads them.

A result, a gradient or a merged W that holds NaN or Inf is refused: the job stops with one line, a snapshot of
the last finite W and a non-zero exit (DivergedError).

What comes from Redis is not trusted (wire.py): the store hands on only messages that pass the inbox's schema, and
the master refuses, with one warning line, those that say something impossible (a round far ahead of the worker's
last, an epoch ahead of the job's, a result from a worker that never joined). It holds the job's lease (one master
per job). However it stops (done, asked, diverged, damaged data, every worker gone, a bug), it snapshots W, tells
the workers at once and removes the job's keys (unless --keep).
"""
import dataclasses
import json
import logging
import time

import numpy as np

from ... import common
from ...errors import DivergedError, PycaffeDistError, StoreError
from ...solver.solver import Solver
from .. import job as jobs
from .. import wire
from ..coordinator import Coordinator, failure_text
from ..redis_client import describe
from ..settings import JsonSettings
from . import compression
from .. import lr_scaling
from .broadcast import MasterUpdates
from .keys import SPEC, DataParallelStore
from .membership import Membership
from .modes import MODES, resolve_options
from .modes.base import Average, Drop, Forget, Merge, Reply
from .publisher import Publisher
from .results import ResultReader
from .shards import ReplayedRule, ShardedWeights, ShardLog, ShardsReverted, check_shardable
from .weights import GlobalWeights, ResultLost, Staleness

log = logging.getLogger("pycaffe_dist.solver")
POLL_S = 0.2
HISTORY_EVERY = 50          # gradient-only: merges between saves of the master's history to Redis
# How far a worker's round may run ahead of its last one seen: it sends its rounds in order and waits for each
# reply, so a round is its last + 1, or + 2 where a reset answered a result the master never got; one further
# ahead is forged or replayed, and taken it would make the worker's real results look like re-sends.
ROUNDS_AHEAD = 4
LAST_WORDS_RETRY_S = 2.0    # retries of what a process says to Redis as it stops after a failure


@dataclasses.dataclass
class Settings(JsonSettings):
    """What a master is told: by `dist_caffe master`'s flags, or as JSON by the one-machine launcher. `options`
    are the mode's, by name (None or absent: the mode's default; modes.resolve_options checks them)."""
    SOURCE = "master settings"
    workers: int = 1
    mode: str = "async"
    options: dict = dataclasses.field(default_factory=dict)
    resume: bool = False
    python_layers: list = dataclasses.field(default_factory=list)  # modules a resumed job's spec may name
    servers: int = 1            # parameter server shards merging W (shard.py); 1: this master merges it
    servers_chosen: str = None  # why `train` chose `servers` (its default), said as the job starts


class Master(Coordinator):
    store_class = DataParallelStore

    def __init__(self, settings):
        common.set_num_threads(settings.threads)
        self.resume, self.keep, self.stats_path = settings.resume, settings.keep, settings.stats_path
        self.join_timeout_s, self.heartbeat_s = settings.join_timeout_s, settings.heartbeat_s
        if settings.resume:
            self.job = settings.job or jobs.find_job(settings.redis, None)
            self.store = self.store_class(settings.redis, self.job, settings.retry_s)
            spec = self.store.job_spec()
            if spec is None:
                raise StoreError("job %s: nothing to resume on %s" % (self.job, describe(self.store.urls[0])))
            spec = jobs.check_spec(spec, self.store.key("job"), settings.python_layers, SPEC)
            # the job's own master may still live: its lease lapses one heartbeat time after it died
            self.store.claim_master(spec["heartbeat_s"], wait_s=spec["heartbeat_s"] + 1.0)
            param = jobs.solver_of(spec, self.store.key("job"))
            mode, options, workers = spec["mode"], spec["options"], spec["workers"]
            servers = spec.get("servers", 1)
            self.heartbeat_s = spec["heartbeat_s"]
            if settings.max_iter is not None:
                param.max_iter = settings.max_iter
            self._keep_records(param)
        else:
            mode, workers, servers = settings.mode, settings.workers, settings.servers
            if settings.servers_chosen:
                log.info("Parameter servers: %d, picked by train (%s; --servers K to choose)", servers,
                         settings.servers_chosen)
            options = resolve_options(mode, settings.options)
            param = self._solver_param(settings)
            check_shardable(mode, options, param, servers, [u for u in settings.redis.split(",") if u])
            self._open_job(settings, param, "resume it with --resume, or choose another --job")
        self.mode_name = self.kind = mode
        self.options, self.workers_wanted = options, int(workers)
        self.solver = Solver(param)
        self.solver.trust = options.get("lars")     # gradient-only's update on the master: --lars clips it too
        self.weights = self.solver.weights
        self.shapes = [tuple(w.shape) for w in self.weights]
        payloads = compression.format_of(options, self.shapes)         # None: results and W go as float32
        self.reader = ResultReader(self.store, self.shapes, format=payloads)
        self.publisher = Publisher(self.store, self.shapes)
        self.membership = Membership()
        self.rule = MODES[mode].MergeRule(self, options)
        self.rate = lr_scaling.RateOfWorkers(options, param.max_iter, self.solver.images_per_iteration)
        self.backoff = lr_scaling.Backoff(param.max_iter)
        # the round modes send W's change compressed too (broadcast.py); the others, whose workers pull W at
        # different merges, pull it whole
        self.updates = MasterUpdates(payloads, self.shapes) if payloads and self.rule.broadcasts_updates else None
        self.w = GlobalWeights(self.solver, self.reader, self.store, self.updates)     # W and what moves it
        self.servers, self.shards = servers, None
        if servers > 1:                         # the shards merge W; this master decides (shards.py)
            self.shards = ShardLog(self.store, servers, self.heartbeat_s)
            self.rule = ReplayedRule(self.rule, self.shards, self.slot)
            self.w = ShardedWeights(self.solver, self.store, self.shards)
        self.count = 0
        self.epoch = None                       # the job's epoch on Redis, from its publish (publish_job) on
        self.merged_since_display, self.dropped_count = 0, 0
        self.staleness = Staleness()            # of the results merged at 1/their staleness
        self.last_housekeeping, self.grace_until = time.monotonic(), 0.0
        self.stale_results = 0                  # results of an earlier epoch (in flight at a reset), dropped
        self.last_reply = {}                    # worker -> the last reply sent to it (to answer a message again)
        self.cpu_at_start = None
        self.bytes_at_start = None      # (the master's blob bytes, each server's (in, out)) as the job started
        if settings.resume or settings.snapshot:
            self._restore(settings.snapshot)
        self.spec = jobs.make_spec(param, mode, options, self.w.names, self.shapes, self.heartbeat_s,
                                   self.workers_wanted)
        self.spec["depth"] = self.rule.depth
        self.spec["updates"] = self.updates is not None
        self.spec["servers"] = servers
        if servers > 1:
            self.spec["blob_rates"] = [[float(lr), float(decay)] for lr, decay in
                                       zip(self.solver.net.params_lr, self.solver.net.params_weight_decay)]

    # --- state ----------------------------------------------------------------------------------------------

    def _restore(self, snapshot):
        if snapshot:
            # The master's train net only holds W: its data stay where they are.
            self.solver.restore(snapshot, data_position=False)
            self.count = self.solver.position[0]
            log.info("Resuming job %s from %s at merge %d", self.job, snapshot, self.count)
            return
        state = self.store.master_state()
        self.store.get_weights(self.shapes, out=self.weights)
        self.count = state.get("count", 0)
        self.solver.set_position(self.count, state.get("current_step", 0))
        for k, history in enumerate(self.solver.history_sets()):
            arrays = self.store.get_history(k, self.shapes)
            if arrays is not None:
                for h, a in zip(history, arrays):
                    h[...] = a
        log.info("Resuming job %s from Redis at merge %d", self.job, self.count)

    def _save_history(self):
        if self.shards is not None:             # (the shards hold it: they save their slices at the next flush)
            self.shards.note("history", count=self.count)
            return
        for k, history in enumerate(self.solver.history_sets()):
            self.store.put_history(k, history, self.count)

    def _keep_copy(self):
        """A copy of W for the rate's backoff (lr_scaling.Backoff): with shards, each keeps its slice."""
        if self.shards is None:
            self.backoff.keep(self.weights, self.count)
            return
        self.backoff.keep([], self.count)
        self.shards.note("keep", count=self.count, kept=[count for count, _ in self.backoff.copies])

    def _flush(self):
        """Publish W (with the state, atomically) if it changed, then the queued replies (publisher.py). W is
        checked first: merges of finite results can still overflow it. With shards, they merge what this master
        decided since the last flush and publish their slices first (shards.py)."""
        if self.shards is not None:
            self._flush_shards()
            return
        if not self.w.dirty and not self.publisher.replies:
            return
        if not self.w.dirty:
            self.publisher.publish()
            return
        self._check_weights()
        update = None
        if self.updates is not None and self.updates.version == self.count:
            update = self.updates.payload               # a new array each merge: the publisher may hold it
        self.publisher.publish(self.weights, (self.count, self.solver.position[1]), update)
        self.w.dirty = False

    def _flush_shards(self):
        if self.shards.records or self.w.dirty:
            try:
                self.shards.flush(self.count)
            except ShardsReverted as exc:       # W on Redis is that of merge exc.count again, as _check_weights
                self.count, self.w.dirty = exc.count, False
                raise
            self.w.dirty = False
        if self.publisher.replies:
            self.publisher.publish()            # (after every slice of the W the replies speak of)

    def _start_shards(self):
        """The shards start from the W (and history) this master publishes, once, itself."""
        self.store.put_weights(self.weights, self.count, self.solver.position[1])
        if self.rule.keeps_history:
            for k, history in enumerate(self.solver.history_sets()):
                self.store.put_history(k, history, self.count)
        log.info("Waiting for %d parameter server shards", self.servers)
        self.shards.wait_for_shards(self.join_timeout_s)
        self.shards.published, self.w.dirty = self.count, False

    def _gather(self, files_only=False):
        """With shards: W (and gradient-only's history) read back from the servers, once every shard has merged
        what this master decided; without, W is here. `files_only` (the job is failing): a shard that reverts, or
        a Redis that is gone, leaves what can be read (or the W of the last test or snapshot, said in a line)."""
        if self.shards is None:
            return
        if self.rule.keeps_history:
            self._save_history()
        try:
            try:
                self._flush_shards()
            except ShardsReverted:
                if not files_only:
                    raise
            except StoreError:
                if not files_only:
                    raise
                self.shards.revert_live()       # (a shard is gone: its slice on Redis is still the last W's)
            _, count = self.store.get_weights(self.shapes, out=self.weights)
            if files_only:
                self.count = count              # (after a revert: the last W every shard published)
            for k, history in enumerate(self.solver.history_sets()):
                arrays = self.store.get_history(k, self.shapes)
                for h, a in zip(history, arrays if arrays is not None else ()):
                    h[...] = a
            self.solver.set_position(count, self.store.master_state().get("current_step", 0))
        except StoreError as exc:
            if not files_only:
                raise
            log.warning("The shards' W could not be read (%s): the snapshot holds the W of the last test or "
                        "snapshot", exc)

    # --- the rate, the replies, the results ------------------------------------------------------------------

    def rate_scale(self):
        """What the solver's rate is multiplied by now (lr_scaling.RateOfWorkers): the mode's work per merge with
        the live workers, by the job's policy, ramped up over the warmup, under the backoff's ceiling."""
        live = len(self.membership)
        return self.rate.scale(self.rule.merged_work(max(1, live)), self.count, self.backoff.ceiling, live,
                               say=self.started)

    def reply(self, worker, status, **fields):
        member = self.membership.members.get(worker)
        message = dict(fields, status=status, iter=self.count, epoch=self.epoch, workers=len(self.membership),
                       lr_scale=self.rate_scale())
        if member is not None and member.last_round is not None:
            message["round"] = member.last_round
        self.publisher.reply(worker, message)
        self.last_reply[worker] = message

    def _answer_again(self, worker, round_id=None):
        """A message seen before came again (its reply was lost, worker.py): the last reply goes out again, queued
        as any reply (after the W it speaks of), if it answered that round."""
        message = self.last_reply.get(worker)
        if message is not None and (round_id is None or message.get("round") == round_id):
            self.publisher.reply(worker, message)

    def _check_weights(self):
        """Merges of finite results can still overflow W: checked before each publish, W then goes back to its
        last published copy."""
        bad = self.w.first_non_finite()
        if bad is not None:
            self.publisher.wait()
            _, written_at = self.store.get_weights(self.shapes, out=self.weights)
            self.count = written_at
            self.w.dirty = False
            raise DivergedError("W overflowed to Inf or NaN in %s" % self.w.blob(bad))

    # --- carrying out the rule's decisions ---------------------------------------------------------------------

    def _carry_out(self, actions):
        """Do what the rule decided (modes.base: Merge, Reply, Drop, Average, Forget), in its order."""
        for action in actions:
            if isinstance(action, Merge):
                self._merge(action)
            elif isinstance(action, Reply):
                self.reply(action.worker, action.status, **action.fields)
            elif isinstance(action, Drop):
                self.dropped_count += 1
            elif isinstance(action, Average):
                self.w.average(action.workers)
            elif isinstance(action, Forget):
                self.store.remove_result(action.worker)
            else:
                raise TypeError("a rule returned %r, which is no action" % (action,))

    def _merge(self, merge):
        """One merge: its results checked for NaN and Inf, W moved (weights.py), then counted; display, test and
        snapshot follow when due."""
        self.w.refuse_non_finite(merge.results)
        if self.rule.scales_by_staleness():     # (before the rate's scale, which follows the typical staleness)
            for result in merge.results:
                self.staleness.record(result.staleness)
        loss = float(np.mean([r.message.get("loss", 0.0) for r in merge.results]))
        scale = self.rate_scale()
        self.w.move(merge, self.count, scale)   # a gradient at the rate scaled for N workers, times the rule's
        if merge.gradients is not None and (self.count + 1) % HISTORY_EVERY == 0:
            self._save_history()
        self.backoff.check_loss(loss, scale)
        self.count += 1
        if scale > 1 and self.backoff.due(self.count):     # copies to back off to, at a scaled rate
            self._settle()                      # (gossip: W is the workers' mean only once settled)
            self._keep_copy()
        self.merged_since_display += 1
        self._add_loss(loss)
        self._after_merge()

    def _settle(self):
        """W made what is tested and snapshotted now (gossip: the workers' mean)."""
        self._carry_out(self.rule.settle_weights())

    # --- what the rule may read (modes.base.RuleView) ---------------------------------------------------------

    def slot(self, worker):
        return self.membership.slot(worker)

    def history(self):
        return self.solver.history_sets()[0]

    def typical_staleness(self):
        return self.staleness.recent

    def momentum(self):
        return lr_scaling.heavy_ball_momentum(self.param)

    # --- the loop ------------------------------------------------------------------------------------------------

    def publish(self):
        self.epoch = self.store.publish_job(self.spec)
        self.store.master_heartbeat(self.heartbeat_s)
        if self.shards is not None:
            self._start_shards()
        self._flush()
        if self.resume:
            self._reset_live_workers()

    def _reset_live_workers(self):
        """After a restart: the workers still beating get a reset (they pull W and go on) and are members again."""
        known = self.store.members()
        ids = list(known)
        alive = {worker for worker, beats in zip(ids, self.store.workers_alive(ids)) if beats}
        self.membership.restore(known, alive.__contains__)
        if len(self.membership):
            log.info("Resumed with %d live worker(s): %s", len(self.membership),
                     ", ".join(self.membership.sorted_members()))
            self.started = True
            self._reset_members()
            self._flush()

    def _reset_members(self, clear_history=False):
        """Every member starts again from W (a reset: it pulls W and goes on; its result in flight is void), with
        its solver's history cleared where `clear_history` (after a backoff: lr_scaling.Backoff)."""
        self._carry_out(self.rule.restart(self.membership.sorted_members(), from_weights=clear_history))
        self.publisher.restamp({"status": "reset", "clear_history": True} if clear_history else {"status": "reset"})

    def _publish_again(self):
        """The job is gone from Redis while it runs (a server restarted empty, or its keys were removed): publish it
        again from memory, W and the members with it, and reset the workers, so that the job goes on by itself."""
        log.warning("Job %s is gone from Redis (a server restarted empty, or its keys were removed): publishing it "
                    "again from memory at merge %d", self.job, self.count)
        self.publisher.wait()
        self.epoch = self.store.publish_job(self.spec)
        for member in list(self.membership.members.values()) + list(self.membership.pending.values()):
            self.store.add_member(member.id, member.info)
        if self.rule.keeps_history:
            self._save_history()
        self.w.dirty = True
        if self.shards is not None:
            self.shards.force_next = True       # their slices went with the server
        self.grace_until = time.monotonic() + self.heartbeat_s     # their heartbeat keys went too
        if self.started:
            self._reset_members()

    def _begin(self):
        self.publish()
        log.info("Job %s: mode %s, waiting for %d worker(s)", self.job, self.mode_name, self.workers_wanted)

    def _failed(self, exc):
        """Redis is gone, the job's data on it damaged, or no worker is left: W goes to disk, so that no merge is
        lost, and the workers are told (where Redis still answers). A bug, or a second Ctrl-C: the workers are told
        all the same."""
        if not isinstance(exc, PycaffeDistError):
            self._abandon(failure_text(exc))
            return
        model, state = self._snapshot(files_only=True)
        self._abandon(str(exc))
        raise StoreError("%s; the weights at merge %d are in %s (continue with `dist_caffe master --snapshot %s`)"
                         % (exc, self.count, model, state)) from None

    def _abandon(self, why):
        """The job ends early: tell the workers why and remove the job's keys, as far as Redis still answers (a
        Redis that is gone was retried already: a few seconds more, not the full --redis-retry)."""
        self.store.retry_s = min(self.store.retry_s, LAST_WORDS_RETRY_S)
        try:
            self._stop_workers(why)
        except Exception as exc:                # (Redis gone: there is nobody to tell)
            log.debug("could not stop the workers: %s", exc)
        try:
            self._clean_up()
        except Exception as exc:
            log.debug("could not clean up: %s", exc)

    def _serve(self):
        last_housekeeping = 0.0
        while self.count < self.param.max_iter and not self.stop_requested:
            batch = self.store.next_messages(POLL_S, 64, wire.INBOX)
            for message in batch:               # the reads of the batch's results begin at once
                worker = message["worker"]
                if message["type"] == "result" and message["epoch"] == self.epoch and self.rule.reads_results \
                        and worker in self.membership.members:
                    self.reader.start(worker)
            for message in batch:
                self._guarded(self._handle, message)
                if self.count >= self.param.max_iter:
                    break
            self._guarded(self._flush)
            if time.monotonic() - last_housekeeping > 0.25:
                self._housekeeping()
                last_housekeeping = time.monotonic()
        self._finish()

    def _guarded(self, action, *args):
        """Run action(*args); a NaN or Inf it meets while the rate is scaled backs the rate off instead of ending
        the job (lr_scaling.Backoff)."""
        try:
            action(*args)
        except DivergedError as exc:
            if not self._back_off(exc):
                raise

    def _back_off(self, exc):
        scale = self.rate_scale()
        good = self.backoff.back_off(scale)
        if good is None:
            return False
        merges, arrays = good
        self.publisher.wait()
        if self.shards is not None:
            self.shards.note("restore", count=merges)
        for w, a in zip(self.weights, arrays):
            np.copyto(w, a)
        self.solver.clear_history()             # the master's momentum (gradient-only) or outer momentum (local-sgd)
        self.losses, self.w.dirty = [], True
        log.warning("Learning rate: training diverged at %.3g x the solver's rate (merge %d: %s); going on at %.3g x "
                    "from the weights of merge %d, every worker starting again from them", scale, self.count, exc,
                    self.backoff.ceiling, merges)
        self.epoch = self.store.new_epoch()     # the results in flight were computed at the rate that diverged
        self._reset_members(clear_history=True)
        return True

    def _diverged(self, exc):
        """Refuse the merge, keep the last finite W on disk, stop the workers, leave no key; then say it in one
        line (the CLI prints it) and exit non-zero."""
        self.w.dirty = False                    # W holds no part of the refused merge (or was read back)
        model, _ = self._snapshot(files_only=True)
        self._stop_workers("training diverged")
        self._clean_up()
        raise DivergedError("training diverged in mode %s at merge %d: %s; the last finite weights are in %s (%s)"
                            % (self.mode_name, self.count, exc, model, self.rule.advice)) from None

    def _handle(self, message):
        """One message of the inbox, checked by the store (wire.INBOX): its fields are there and of their types."""
        kind, worker = message["type"], message["worker"]
        if kind == "join":
            self._join(worker, message)
        elif kind == "ready":
            if self.membership.make_ready(worker) is None:
                if worker in self.membership.members:
                    self._answer_again(worker)
                return
            if self.started:
                log.info("Worker %s joined the running job", worker)
                self._carry_out(self.rule.on_join(worker))
            elif len(self.membership) >= self.workers_wanted:
                self._start()
        elif kind == "result":
            self._result(worker, message)
        elif kind == "leave":
            self._left(worker, message)

    def _left(self, worker, message):
        """A worker says it stops: with the error that stopped it, if one did. One that found the job's data on
        Redis damaged ends the job: every worker reads the same W."""
        error = message.get("error")
        if message.get("damaged"):
            raise wire.DamagedData("worker %s found the job's data on Redis damaged: %s" % (worker, error))
        known = self.membership.knows(worker)
        self._lost(worker, "left" + (": %s" % error if error else ""))
        if known and error is None:
            log.info("Worker %s left; going on with %d worker(s)", worker, len(self.membership))

    def _join(self, worker, message):
        if worker in self.membership.pending and self.last_reply.get(worker, {}).get("status") == "slot":
            self.store.reply_to(worker, self.last_reply[worker])       # its join came again: the same slot
            return
        if worker in self.membership.members:   # joining again (it saw a restart): it starts afresh
            self._lost(worker, "joined again")
        member = self.membership.admit(worker, message)     # (its last data shard again, where that is free)
        info, slot = member.info, member.slot
        self.store.add_member(worker, info)
        self.last_reply[worker] = {"status": "slot", "slot": slot, "shards": self.workers_wanted, "epoch": self.epoch}
        self.store.reply_to(worker, self.last_reply[worker])
        log.info("Worker %s joined from %s%s (pid %s): data shard %d of %d", worker, info["host"],
                 " at " + info["address"] if "address" in info else "", info["pid"], slot % self.workers_wanted,
                 self.workers_wanted)

    def _start(self):
        self.started = True
        self.started_at = self.display_at = time.monotonic()
        self.cpu_at_start = (time.thread_time(), self.store.servers_cpu_s(), self.count)
        self.bytes_at_start = (dict(self.store.blob_bytes), self.store.servers_net_bytes())
        if self.shards is not None:
            self.shards.mark_start()
        log.info("Starting: %d worker(s), mode %s, %s", len(self.membership), self.mode_name,
                 ", ".join("%s=%s" % kv for kv in sorted(self.options.items())))
        if self.param.test_interval and self.param.test_initialization and self.count == 0:
            self._test()
        self._keep_copy()
        self._carry_out(self.rule.start(self.membership.sorted_members()))

    def _result(self, worker, message):
        try:
            self._merge_result(worker, message)
        finally:
            self.reader.discard(worker)         # a read begun for a result that did not merge

    def _merge_result(self, worker, message):
        member = self.membership.members.get(worker)
        if member is None:
            # Counted out (its heartbeat lapsed: stopped, cut off) or unknown: it joins again and starts from W.
            if worker not in self.membership.pending:
                if worker not in self.membership.slots:
                    self.store.refuse("%s: a result from worker %s, which never joined this master (it is told to "
                                      "join)" % (self.store.key("inbox"), worker))
                self.store.reply_to(worker, {"status": "rejoin", "reason": "not a member of the job"})
            return
        if message["epoch"] != self.epoch:
            if message["epoch"] > self.epoch:
                self.store.refuse("%s: a result from worker %s of epoch %d, ahead of the job's %d" % (
                    self.store.key("inbox"), worker, message["epoch"], self.epoch))
            else:
                self.stale_results += 1         # computed before a reset: it was in flight
            return
        round_id = message["round"]
        if member.last_round is not None and round_id <= member.last_round:
            self._answer_again(worker, round_id)    # sent again (its reply was lost): a worker's rounds count up
            return
        if member.last_round is not None and round_id > member.last_round + ROUNDS_AHEAD:
            self.store.refuse("%s: a result from worker %s for round %d, where its last was %d (forged or "
                              "replayed?)" % (self.store.key("inbox"), worker, round_id, member.last_round))
            return
        if self.membership.heard(member):
            log.info("Worker %s reports again", worker)
        member.last_round = round_id
        member.count_round(message)
        try:
            result = self.w.read(worker, message, Staleness.of(message, self.count), self.rule.reads_results)
            self._carry_out(self.rule.on_result(result))
        except ResultLost:
            self.reply(worker, "reset")         # its blobs went with a Redis restarted empty: it starts from W
        finally:
            self.w.release()

    def _lost(self, worker, why):
        if not self.membership.remove(worker):
            return                              # pending or unknown: the rule never heard of it
        if why != "left":
            log.warning("Worker %s %s; going on with %d worker(s)", worker, why, len(self.membership))
        self._carry_out(self.rule.on_lost(worker))
        if self.membership.left_alone(self.started):
            log.warning("No worker is left: waiting up to %.0f s (--join-timeout) for one to join, then stopping "
                        "with a snapshot", self.join_timeout_s)

    def _housekeeping(self):
        if self.store.job_state() is None:
            self._publish_again()
        self.store.master_heartbeat(self.heartbeat_s)
        now = time.monotonic()
        if now - self.last_housekeeping > self.heartbeat_s:
            # We were stalled (Redis paused or unreachable, this process stopped): every heartbeat key may have
            # expired meanwhile; the workers get one heartbeat time to beat again before any is counted out.
            self.grace_until = now + self.heartbeat_s
        self.last_housekeeping = now
        ids = self.membership.ids()
        if now > self.grace_until:
            for worker, alive in zip(ids, self.store.workers_alive(ids)):
                if not alive:
                    self._lost(worker, "has no heartbeat for %g s" % self.heartbeat_s)
        if self.shards is not None and now > self.grace_until:
            self.shards.check_alive()
        for member in self.membership.gone_silent(now, self.heartbeat_s) if self.started else ():
            log.warning("Worker %s has sent nothing for %.0f s though its heartbeat lives (stuck, or a message "
                        "of its own was lost: it sends it again)", member.id, now - member.last_heard)
        alone_since = self.membership.alone_since
        if alone_since is not None and now - alone_since > self.join_timeout_s:
            raise StoreError("job %s: no worker is left, and none joined within %.0f s (--join-timeout)"
                             % (self.job, self.join_timeout_s))
        if not self.started and time.monotonic() - self.started_at > self.join_timeout_s:
            if not len(self.membership):
                raise StoreError("job %s: no worker joined within %.0f s" % (self.job, self.join_timeout_s))
            log.warning("Only %d of %d worker(s) after %.0f s; starting with them", len(self.membership),
                        self.workers_wanted, self.join_timeout_s)
            self._start()
        self._flush()
        self.store.put_progress(self.progress())

    # --- display, tests, snapshots -----------------------------------------------------------------------------

    def _after_merge(self):
        p = self.param
        if p.display and self.count % p.display == 0:
            now = time.monotonic()
            lapse = now - self.display_at
            self._display(self.count, self.merged_since_display, lapse)
            log.info("Workers: %s", self.rates_text())
            self.display_at, self.merged_since_display = now, 0
        if p.test_interval and self.count % p.test_interval == 0 and self.count < p.max_iter:
            self._test()
        if p.snapshot and self.count % p.snapshot == 0:
            self._snapshot()

    def _test(self):
        if self.tester is not None:
            self._settle()
            self._gather()
            self._test_weights(self.weights, self.count)

    def _snapshot(self, files_only=False):
        if not files_only:              # (files_only: Redis is gone or W diverged; W stays as it is)
            self._settle()
        self._gather(files_only)
        model, state = self.solver.snapshot_at(self.count)
        self._snapshotted(model)
        if self.rule.keeps_history and not files_only:
            self._save_history()
        return model, state

    def _finish(self):
        p = self.param
        stopped_early = self.count < p.max_iter
        self._flush()
        if p.snapshot_after_train and (not p.snapshot or self.count % p.snapshot != 0):
            self._snapshot()
        if not stopped_early:
            self._test()                        # while the workers are stopped
        self._stop_workers()
        if self.tester is not None:
            self.tester.wait()
        log.info("Optimization %s after %d merges.", "stopped" if stopped_early else "Done", self.count)
        log.info("Workers: %s", self.rates_text())
        self._clean_up()

    def _stop_workers(self, why=None):
        """Stop every worker, and wait up to 10 s for them to go: `why` (a failure) makes each stop with that line
        and a non-zero exit; without it the job is done."""
        try:
            self.publisher.wait()               # the last W out before the job says done
        except PycaffeDistError:
            if why is None:
                raise
        if self.shards is not None:
            self.shards.stop(why)
        ids = self.membership.ids()             # a worker's control queue is its id
        jobs.stop_processes(self.store, ids, ids, 10.0, why)

    def _clean_up(self):
        self.reader.close()
        self.publisher.close()
        if self.stats_path:
            with open(self.stats_path, "w") as f:
                json.dump(self.summary(), f, indent=1)
        if self.keep:
            log.info("Keeping the job's keys on Redis (job %s)", self.job)
        else:
            self.store.remove_job()

    # --- reporting -----------------------------------------------------------------------------------------------

    def rates_text(self):
        rates = self.membership.rates(self.started_at)
        parts = ["%s %.0f img/s" % (worker, rates[worker]) for worker in self.membership.sorted_members()]
        return "%s; exchange %.1f%% of a round" % (", ".join(parts) or "none", 100 * self.membership.exchange_share())

    def progress(self):
        # (with the staleness of the results merged at 1/staleness: None in the modes that do not scale by it)
        return dict(self.progress_of(self.count, self.membership.rates(self.started_at),
                                     exchange_share=self.membership.exchange_share()),
                    mean_staleness=self.staleness.mean())

    def summary(self):
        images = self.membership.images()
        elapsed = time.monotonic() - self.started_at
        return dict(self.progress(), images=images, images_per_s=images / max(1e-9, elapsed),
                    dropped=self.dropped_count, tests=self.test_results,
                    # None where no result was scaled by its staleness (sync, easgd, gossip, local-sgd, --factor)
                    mean_staleness=self.staleness.mean(),
                    **self.reader.sizes(),
                    # what a worker pulls per round: W's compressed change (broadcast.py), or W as float32
                    bytes_per_pull=(self.updates.format.nbytes if self.updates is not None
                                    else self.reader.sizes()["float32_bytes_per_result"]),
                    lr_scaling=self.options.get("lr_scaling", "none"), lr_scale=self.rate_scale(),
                    servers=self.servers, lr_backoffs=self.backoff.count, refused_messages=self.store.refused,
                    stale_results=self.stale_results,
                    **self.cpu_per_merge(), **self.hub_per_merge(), **self.rule.summary())

    def hub_per_merge(self):
        """What a hub costs: the most bytes one process moved per merge, one way (received or sent), among this
        master and each Redis server (every result and every W a worker pulls passes a server; with --redis-servers
        each holds a slice); a worker moves one result and one W a round, less than either. With the model's bytes
        (float32), to compare with all-reduce's ring."""
        if self.bytes_at_start is None or self.cpu_at_start is None or self.count <= self.cpu_at_start[2]:
            return {}
        mine, servers = self.bytes_at_start
        merges = self.count - self.cpu_at_start[2]
        try:
            now = self.store.servers_net_bytes()
        except StoreError:
            return {}
        moved = [self.store.blob_bytes[way] - mine[way] for way in ("sent", "received")]
        moved += [after - before for (a, b), (c, d) in zip(now, servers) for after, before in ((a, c), (b, d))]
        if self.shards is not None:
            moved += self.shards.bytes_moved()
        return {"hub_bytes_per_merge": max(moved) / merges,
                "model_bytes": self.reader.sizes()["float32_bytes_per_result"]}

    def cpu_per_merge(self):
        """Where the exchange's time goes: the CPU of the master's merging thread (the tester's apart) and of each
        Redis server per merge since the start, in ms. One with merges/s x this near 1 s/s is the job's
        bottleneck."""
        if self.cpu_at_start is None or self.count <= self.cpu_at_start[2]:
            return {}
        master_s, servers_s, count = self.cpu_at_start
        merges = self.count - count
        try:
            servers = self.store.servers_cpu_s()
        except StoreError:
            return {}
        figures = {"master_cpu_ms_per_merge": 1e3 * (time.thread_time() - master_s) / merges,
                   "redis_cpu_ms_per_merge": [1e3 * (now - then) / merges for now, then in zip(servers, servers_s)]}
        if self.shards is not None:
            figures["shard_cpu_ms_per_merge"] = [1e3 * seconds / merges for seconds in self.shards.cpu_s()]
        return figures
