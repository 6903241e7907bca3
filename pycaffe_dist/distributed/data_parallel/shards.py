"""The master's side of its parameter server shards (`--servers K`; the shard itself: shard.py).

With shards the master reads no result and writes no W: it decides. Its mode's rule runs as without shards, on
results whose arrays are a placeholder (ShardedWeights), and ReplayedRule writes down each of the rule's events
with what the shards need to replay it (a result's worker and staleness, a newcomer's data slot); each merge the
master then carries out is written under its event with its merge count and the rate's scale. At every flush
(master.py: after each batch of messages, before any test or snapshot) ShardLog sends the events to every shard
and waits until each has merged them and published its slice of W; only then do the replies go out, so a worker
that pulls after its reply sees its merge on every slice, as it sees W without shards.

A test or a snapshot reads W back from the servers (and gradient-only's history, which the shards save); the rate's
backoff keeps and restores its copies on the shards. A shard that found NaN or Inf has every shard go back to the
last W they all published, and the master then acts as on NaN without shards (lr_scaling.Backoff, or the NaN
stop). What a shard's process costs comes back with each flush: the bytes it moved and its CPU time.
"""
import math
import os
import time

import numpy as np

from ...errors import DivergedError, PycaffeDistError, StoreError
from .. import wire
from .modes.base import Result
from .shard import NEWS, SHARDED_MODES, queue_name
from .weights import GlobalWeights

PLACEHOLDER = [np.zeros(1, np.float32)]     # a result's arrays on the master: its rule sums them, the shards W
# What one merging process moves in a round of N results (N x W in, W out to each of N workers, through its Redis
# server): LeNet's 1.7 MB at 8 workers (14 MB a round) keeps one master below ~1 ms a merge on 2 cores (README's
# exchange figures); from this many bytes a round on, a shard per this many bytes, one per 4 cores at most (a shard
# and its redis-server each want a core while the workers compute).
BYTES_PER_SHARD = 64 << 20
MOST_SHARDS = 8


def model_bytes(solver_path):
    """W's bytes (float32) for the solver's TRAIN net, built without filling its weights."""
    from ...io.load import read_solver
    from ...net.net import Net
    from ...proto import caffe_pb2
    from ..job import inline_nets
    param = inline_nets(read_solver(solver_path))
    net_param = param.net_param if param.HasField("net_param") else param.train_net_param
    net = Net(net_param, phase=caffe_pb2.TRAIN, level=param.train_state.level, stages=list(param.train_state.stage),
              fill_params=False)
    return 4 * sum(int(np.prod(b.shape, dtype=np.int64)) for b in net.learnable_params)


def default_servers(workers, nbytes, cores=None):
    """(K, why) for `train --workers N` on one machine: 1 while a round of N results is under BYTES_PER_SHARD,
    then one shard per BYTES_PER_SHARD, at most one per 4 cores and MOST_SHARDS."""
    cores = cores or os.cpu_count() or 1
    per_round = workers * nbytes
    wanted = max(1, math.ceil(per_round / BYTES_PER_SHARD))
    servers = max(1, min(wanted, cores // 4, MOST_SHARDS))
    why = "%d workers x %.1f MB of W = %.0f MB a round; a shard per %d MB, one per 4 of %d cores at most" % (
        workers, nbytes / 1e6, per_round / 1e6, BYTES_PER_SHARD >> 20, cores)
    return servers, why


def check_shardable(mode, options, param, servers, urls):
    """One line where --servers K cannot shard this job: a mode without a central W, an option or solver setting
    that needs all of W in one place, or not one Redis server per shard."""
    if servers == 1:
        return
    if mode not in SHARDED_MODES:
        raise PycaffeDistError("--servers %d: mode %s keeps no central W to shard (the modes with one: %s)"
                               % (servers, mode, ", ".join(SHARDED_MODES)))
    if options.get("compress", "none") != "none":
        raise PycaffeDistError("--servers %d: --compress sends each result as one payload, which no shard's slice "
                               "of W matches; leave one of them out" % servers)
    if mode == "gradient-only" and options.get("lars"):
        raise PycaffeDistError("--servers %d: --lars clips each blob's rate by the norms of the whole blob, which "
                               "the shards split; leave one of them out" % servers)
    if mode == "gradient-only" and param.clip_gradients >= 0:
        raise PycaffeDistError("--servers %d: the solver's clip_gradients needs the norm of the whole gradient, "
                               "which no shard holds; gradient-only then merges on one master (--servers 1)"
                               % servers)
    if len(urls) != servers:
        raise PycaffeDistError("--servers %d needs one Redis server per shard, got %d Redis URL(s)"
                               % (servers, len(urls)))


class ShardLog:
    """The events since the last flush, and the shards they go to (their queues go:shard{s}, their news go:shards).
    `heartbeat_s`: a shard whose heartbeat lapses for it is gone, and the job with it."""

    def __init__(self, store, servers, heartbeat_s):
        self.store, self.servers, self.heartbeat_s = store, servers, heartbeat_s
        self.names = [queue_name(s) for s in range(servers)]
        self.records, self.current = [], None
        self.seq = 0
        self.published = None                   # the merge count of the last W every shard published
        self.force_next = False                 # the next flush publishes every slice (a server lost them)
        self.figures = [None] * servers         # each shard's last news: bytes sent/received, CPU seconds
        self.figures_at_start = None

    # --- writing down -------------------------------------------------------------------------------------------

    def event(self, kind, **fields):
        """One of the rule's events; the merges carried out after it go under it."""
        self.current = dict(fields, e=kind, m=[])
        self.records.append(self.current)

    def merged(self, count, rate_scale):
        if self.current is None:
            self.event("more")          # a merge of the last event's actions, after a flush between them
        self.current["m"].append([int(count), float(rate_scale)])

    def note(self, kind, **fields):
        """An order to the shards between merges (keep, restore, history, revert)."""
        self.records.append(dict(fields, e=kind))
        self.current = None

    # --- the shards -----------------------------------------------------------------------------------------------

    def wait_for_shards(self, timeout_s):
        """Until every shard has said hello (it holds its slice of the W just published)."""
        seen, deadline = set(), time.monotonic() + timeout_s
        while len(seen) < self.servers:
            news = self.store.next_reply(NEWS, 0.5, wire.SHARD_NEWS)
            if news is not None:
                self._failed(news)
                if news["status"] == "hello":
                    seen.add(news["shard"])
                    self.figures[news["shard"]] = news
            elif time.monotonic() > deadline:
                missing = sorted(set(range(self.servers)) - seen)
                raise StoreError("job %s: parameter server shard(s) %s did not start within %.0f s (`dist_caffe "
                                 "shard --index S` on each server's host)" % (
                                     self.store.job, ", ".join(map(str, missing)), timeout_s))
            self.store.master_heartbeat(self.heartbeat_s)

    def flush(self, count, force=False):
        """Send the events, with the flush at merge `count`; wait for every shard. A shard that found NaN or Inf:
        every shard goes back to the last W they all published, then DivergedError (ShardsReverted)."""
        news = self._send({"count": int(count), "force": bool(force or self.force_next)})
        self.force_next = False
        bad = [n["bad"] for n in news if "bad" in n]
        if bad:
            self.note("revert")
            self._send({"count": self.published, "force": True})
            raise ShardsReverted(bad[0], self.published)
        self.published = int(count)

    def _send(self, fields, shards=None):
        """The events so far and `fields` to `shards` (default: all); their news."""
        shards = range(self.servers) if shards is None else shards
        self.seq += 1
        message = dict(fields, status="events", seq=self.seq, events=self.records)
        self.records, self.current = [], None
        self.store.reply_to_each([(self.names[s], message) for s in shards])
        return self._news(self.seq, shards)

    def revert_live(self):
        """A shard is gone: the live ones go back to the last W every shard published (which the lost one's slice
        on its server still is), so that the W on the servers is one merge's for the snapshot."""
        live = [s for s, alive in zip(range(self.servers), self.store.workers_alive(self.names)) if alive]
        self.records, self.current = [], None
        self.note("revert")
        self._send({"count": self.published, "force": True}, live)

    def _news(self, seq, shards):
        """The news of flush `seq` from each of `shards`; a shard that failed or is gone ends the job (StoreError)."""
        got, last_check = {}, time.monotonic()
        while len(got) < len(shards):
            news = self.store.next_reply(NEWS, 0.5, wire.SHARD_NEWS)
            if news is not None:
                self._failed(news)
                if news["status"] == "flushed" and news["seq"] == seq:
                    got[news["shard"]] = news
                    self.figures[news["shard"]] = news
            if time.monotonic() - last_check > self.heartbeat_s:
                self.check_alive()
                self.store.master_heartbeat(self.heartbeat_s)
                last_check = time.monotonic()
        return [got[s] for s in shards]

    def _failed(self, news):
        if news["status"] == "error":
            raise StoreError("parameter server shard %d failed: %s" % (news["shard"], news.get("error", "")))

    def check_alive(self):
        for name, alive in zip(self.names, self.store.workers_alive(self.names)):
            if not alive:
                raise StoreError("parameter server %s has no heartbeat for %g s: its slice of W is gone with it"
                                 % (name.replace("shard", "shard "), self.heartbeat_s))

    def stop(self, why=None):
        message = {"status": "stop"} if why is None else {"status": "stop", "why": why}
        self.store.reply_to_each([(name, message) for name in self.names])

    # --- what they cost ---------------------------------------------------------------------------------------------

    def mark_start(self):
        self.figures_at_start = list(self.figures)

    def bytes_moved(self):
        """Each shard's blob bytes sent and received since the start (for the hub figure)."""
        if self.figures_at_start is None:
            return []
        moved = []
        for now, then in zip(self.figures, self.figures_at_start):
            if now is not None:
                moved += [now[way] - (then[way] if then is not None else 0) for way in ("sent", "received")]
        return moved

    def cpu_s(self):
        """Each shard's CPU seconds since the start."""
        if self.figures_at_start is None:
            return []
        return [now["cpu_s"] - (then["cpu_s"] if then is not None else 0.0)
                for now, then in zip(self.figures, self.figures_at_start) if now is not None]


class ShardsReverted(DivergedError):
    """A shard found NaN or Inf; every shard went back to the W of merge `count`."""

    def __init__(self, why, count):
        super().__init__(why)
        self.count = count


class ShardedWeights(GlobalWeights):
    """W as the master holds it with shards: read back from the servers for tests and snapshots only; a merge is
    written down for the shards (ShardLog), and a result is its worker and staleness (the shards read it)."""

    def __init__(self, solver, store, shards):
        super().__init__(solver, reader=None, store=store)
        self.shards = shards

    def read(self, worker, message, staleness, with_arrays=True):
        return Result(worker, message, PLACEHOLDER, staleness)

    def release(self):
        pass

    def refuse_non_finite(self, results):
        pass                                    # the shards check each result's slice (shard.py)

    def move(self, merge, merges, rate_scale):
        self.shards.merged(merges, rate_scale)
        self.dirty = True

    def average(self, workers):
        raise PycaffeDistError("no central W to average with shards")

    def first_non_finite(self):
        return None                             # (the shards check their slices before they publish)


class ReplayedRule:
    """A mode's rule on the master, each of its events written down for the shards first (they replay it on their
    own copies of the rule). Everything else is the rule's own."""
    reads_results = False                       # the shards read them

    def __init__(self, rule, shards, slot):
        self.rule, self.shards, self.slot = rule, shards, slot

    def __getattr__(self, name):
        return getattr(self.rule, name)

    def start(self, workers):
        self.shards.event("start", workers=list(workers), slots=[self.slot(w) for w in workers])
        return self.rule.start(workers)

    def restart(self, workers, from_weights=False):
        self.shards.event("restart", workers=list(workers), slots=[self.slot(w) for w in workers],
                          from_weights=bool(from_weights))
        return self.rule.restart(workers, from_weights=from_weights)

    def on_join(self, worker):
        self.shards.event("join", worker=worker, slot=self.slot(worker))
        return self.rule.on_join(worker)

    def on_result(self, result):
        self.shards.event("result", worker=result.worker, staleness=int(result.staleness))
        return self.rule.on_result(result)

    def on_lost(self, worker):
        self.shards.event("lost", worker=worker)
        return self.rule.on_lost(worker)
