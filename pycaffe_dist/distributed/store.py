"""The job's store: one job's keys on Redis (redis-py with hiredis; the connections and the blobs' own socket are
redis_client.py's), a key-value service with one namespace per protocol.

Every Redis call of the package is made here. Store holds the keys every kind of job shares; each kind's protocol
adds its own in a subclass in its folder (DataParallelStore, SandblasterStore, PipelineStore: keys.py), built from
Store's blobs (`_put_blobs`, `_get_blobs`, `_remove_blobs`) and queues. Every key, under `pcd:{job}:`, is listed
here, with its methods:

  key                 what it holds                                               methods
  -- every kind of job (Store) --
  job                 hash: spec (JSON: solver text, mode, options, blob names     publish_job, job_spec, job_state,
                      and shapes), state (running/done), epoch                     finish_job, new_epoch
  W:{s}               global weights, the slice on server s: 8-byte version        put_weights, get_weights
                      (uint64 LE) + raw float32 LE data (Sandblaster: the point x)
  state               hash: merge count, current_step (what a restarted master    put_weights (with W),
                      continues from), written with W in one transaction          master_state
  stats               hash: progress for displays (JSON)                          put_progress, progress
  inbox               list: JSON messages to the master, emptied as the job is    send_to_master, next_message,
                      published                                                   next_messages, publish_job
  go:{name}           list: JSON messages to process `name` (a worker's id, a      reply_to, reply_to_each,
                      stage's name): replies, control (stop)                      next_reply
  hb:{name}           process `name`'s heartbeat: a key with a TTL                 worker_heartbeat, workers_alive
  master              the master's lease: JSON (host, pid, token) with a TTL,     claim_master, master_heartbeat,
                      renewed by its owner only (one master per job)             master_alive, master_holder,
                                                                                  release_master
  workers             hash: worker id -> JSON (host, pid, slot), by the master    add_member, members
  ids, next_worker    hash of claimed worker ids -> pid; the next free id         claim_worker_id
  (every key)                                                                     leave (hb and go of one process),
                                                                                  remove_job
  -- data-parallel (DataParallelStore, data_parallel/keys.py) --
  x:{w}:{s}           worker w's result (delta, gradient or local weights), as W  put_result, get_result,
                      or (--compress) as its payload (compression.py)             remove_result
  hist:{k}:{s}        the master's history set k (gradient-only; local-sgd), as W  put_history, get_history
  U:{s}               the last round's compressed change of W (sync, local-sgd     put_update, get_update
                      with --compress; broadcast.py): its payload
  go:shard{s}         list: the master's events to parameter server shard s        reply_to_each, next_reply
                      (--servers K; data_parallel/shards.py, shard.py)
  go:shards           list: what the shards tell their master (hello, flushed)    reply_to, next_reply
  W:{s}, x:{w}:{s},   a shard's own server's slice of each blob set (where its     put_weights_slice,
  hist:{k}:{s}        floats lie: layout)                                          get_weights_slice,
                                                                                   get_result_slice,
                                                                                   put_history_slice,
                                                                                   get_history_slice
  -- Sandblaster (SandblasterStore, sandblaster/keys.py) --
  go:units            list: the evaluations' work units                           hand_out, next_unit
  x:sum{w}:{s}        worker w's gradient sums of its last push                   put_sums, get_sums
  -- a pipeline (PipelineStore, pipeline/keys.py; {n}: the server) --
  x:stage{s}-act{m}:{n}   what crosses the cut after stage s, micro-batch m       put_activations, get_activations
  x:stage{s}-grad{m}:{n}  the gradients of what stage s received, micro-batch m   put_gradients, get_gradients
  x:stage{s}-state:{n}    stage s's parameters and solver history                 put_state, get_state
  go:stage{s}         list: notices to stage s (forward, backward, halt)          notify
  go:stage{s}-ctl     list: the master's messages to stage s (ack, halt, stop)    to_stage
  -- all-reduce (AllreduceStore, allreduce/keys.py) --
  ckpt:{s}            the checkpoint: weights and solver history of one           put_checkpoint, checkpoint
                      iteration, one blob set, with the position (state)
  ring:{n}            hash: where each worker of world n listens (sockets.py)    put_ring_address, ring_addresses

Values are never pickled. JSON control messages are size-checked before parsing, then checked field by field
against their queue's schema (wire.py): one that fails is dropped with a warning and counted (`refused`). Blob
reads are bounded by the expected size (GETRANGE), then checked against it. Blobs can be sharded over several
Redis servers (the first one holds everything else), as DistBelief shards its parameter server: the learnable
blobs laid end to end are cut into one equal slice per server, and a blob set is written and read on every server
at once (a thread per further server), so that each server and each connection moves 1/n of the bytes.
"""
import json
import logging
import os
import re
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import StoreError
from . import wire
from .redis_client import BlobLink, TooLong, command, connect, explain
from .wire import BadMessage, DamagedData

log = logging.getLogger("pycaffe_dist.distributed")

PREFIX = "pcd"
HEADER = 8                      # the version in front of every blob value
MAX_MESSAGE = 1 << 20           # control messages are small JSON objects
MAX_SPEC = 64 << 20             # a job spec holds the solver and net text
REFUSALS_SHOWN = 20             # warning lines for refused messages; the rest are only counted

def job_ids(url):
    """The jobs that have a spec on the server at `url`."""
    import redis
    try:
        keys = list(connect(url).scan_iter(match="%s:*:job" % PREFIX, count=1000))
    except redis.RedisError as exc:
        raise StoreError(explain(exc, url)) from None
    found = []
    for key in keys:
        key = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        found.append(key[len(PREFIX) + 1:-len(":job")])
    return sorted(found)



class Store:
    """One job's view of the store. `urls` is one Redis URL or several (blobs sharded over them). Operations that
    meet a connection error retry with backoff for `retry_s` seconds, then raise StoreError."""

    def __init__(self, urls, job, retry_s=30.0):
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u]
        if not urls:
            raise StoreError("no Redis URL given")
        self.urls, self.job, self.retry_s = list(urls), job, retry_s
        self._clients = [connect(u) for u in self.urls]
        self._control = self._clients[0]        # the first server holds every key but the sharded blobs
        self._layouts = {}                      # shapes -> where their floats lie on the servers
        self._pool = ThreadPoolExecutor(len(self.urls) - 1) if len(self.urls) > 1 else None
        self._links = [BlobLink(u) for u in self.urls]
        self.refused = 0                        # messages dropped by a check (wire.py)
        # the blob bytes this process has sent and received, all servers together (the job's hub figure); counted
        # without a lock: a statistic, and a lock taken where a KeyboardInterrupt may land (a worker's Ctrl-C) can
        # be left held, hanging the next blob operation
        self.blob_bytes = {"sent": 0, "received": 0}
        self._lease = None                      # this process's master lease (claim_master)
        # Renew a lease only if it is ours, and take it back if it lapsed: one round trip, atomic on the server.
        self._renew_lease = self._control.register_script(
            "local held = redis.call('GET', KEYS[1]) "
            "if held == ARGV[1] or not held then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end "
            "return 0")
        for url, client in zip(self.urls, self._clients):
            self._call(client.ping, url=url)

    def key(self, *parts):
        """The full name of one of the job's keys, for messages."""
        return ":".join((PREFIX, self.job) + tuple(str(p) for p in parts))

    # --- the job: its spec, state and epoch -----------------------------------------------------------------

    def publish_job(self, spec):
        """Publish (or re-publish) the job: its spec, state running, and a new epoch, which is returned (replies
        and results carry it, so that those of an earlier master are told apart). The inbox is emptied in the same
        transaction: emptied after it, a worker quick to see the job could lose its join."""
        def build(pipe):
            pipe.delete(self.key("inbox"))
            pipe.hincrby(self.key("job"), "epoch", 1)
            pipe.hset(self.key("job"), mapping={"spec": json.dumps(spec), "state": "running"})
        return int(self._pipeline(build)[1])

    def new_epoch(self):
        """A new epoch for the running job, which is returned: results sent before it are told apart (a master
        that restarts its workers from W, lr_scaling.Backoff)."""
        return int(self._pipeline(lambda pipe: pipe.hincrby(self.key("job"), "epoch", 1))[0])

    def job_spec(self):
        """The job's spec as a JSON object (job.check_spec checks its fields), or None when there is none."""
        raw = self._field(self.key("job"), "spec", MAX_SPEC)
        if raw is None:
            return None
        try:
            return self._parse(raw, self.key("job") + " spec", MAX_SPEC)
        except BadMessage as exc:
            raise DamagedData("job %s: its spec is damaged: %s" % (self.job, exc)) from None

    def job_state(self):
        """'running', 'done', or None when the job is not on the server (never published, removed, or the server
        restarted empty)."""
        raw = self._field(self.key("job"), "state")
        if raw is None:
            return None
        if raw not in (b"running", b"done"):
            raise DamagedData("job %s: %s state is %r, where running or done was expected"
                              % (self.job, self.key("job"), raw[:40]))
        return raw.decode()

    def finish_job(self):
        self._call(self._control.hset, self.key("job"), "state", "done")

    # --- W (with the master's state) ---------------------------------------------------------------------------

    def put_weights(self, arrays, count, current_step):
        """W at merge `count`, and the master's state (count, current_step) in the same transaction."""
        state = {"count": int(count), "current_step": int(current_step)}
        self._put_blobs("W", arrays, count, state=state)

    def get_weights(self, shapes, out=None, missing_ok=False):
        """(W, the merge count it was written at); (None, None) if W is not there and missing_ok."""
        return self._get_blobs("W", shapes, out=out, missing_ok=missing_ok)

    def master_state(self):
        """{'count', 'current_step'} as last written with W (empty when none was)."""
        raw = self._call(self._control.hgetall, self.key("state"))
        state = {}
        for field in ("count", "current_step"):
            value = raw.get(field.encode())
            if value is not None:
                if not value.isdigit() or len(value) > 18:
                    raise DamagedData("job %s: %s %s is %r, where a merge count was expected"
                                      % (self.job, self.key("state"), field, value[:40]))
                state[field] = int(value)
        return state

    # --- progress, for displays ------------------------------------------------------------------------------

    def put_progress(self, progress):
        self._call(self._control.hset, self.key("stats"), "progress", json.dumps(progress))

    def progress(self):
        """The master's last progress dict, or None."""
        raw = self._field(self.key("stats"), "progress")
        try:
            return None if raw is None else self._parse(raw, self.key("stats"))
        except BadMessage:
            return None                         # a display has nothing to show, the job goes on

    def servers_net_bytes(self):
        """(bytes received, bytes sent) of each server since it started (INFO stats), for the job's hub figure."""
        info = [self._call(client.info, "stats", url=url) for url, client in zip(self.urls, self._clients)]
        return [(int(i.get("total_net_input_bytes", 0)), int(i.get("total_net_output_bytes", 0))) for i in info]

    def _count(self, way, nbytes):
        self.blob_bytes[way] += nbytes

    def servers_cpu_s(self):
        """CPU seconds each server has used since it started (INFO cpu), for the master's account of the exchange."""
        info = [self._call(client.info, "cpu", url=url) for url, client in zip(self.urls, self._clients)]
        return [float(i.get("used_cpu_user", 0)) + float(i.get("used_cpu_sys", 0)) for i in info]

    # --- messages -----------------------------------------------------------------------------------------------

    def send_to_master(self, message):
        self._send(self.key("inbox"), message)

    def next_message(self, timeout, schema):
        """The next message to the master that passes `schema` (wire.py), or None after `timeout` seconds (0:
        don't wait) or when the one popped failed (it is dropped)."""
        return self._receive(self.key("inbox"), timeout, schema)

    def next_messages(self, timeout, at_most, schema):
        """The next messages to the master, oldest first, those that pass `schema`: waits up to `timeout` seconds
        for one, then takes up to at_most - 1 more that are there, in one round trip (LRANGE and LTRIM: any Redis
        version)."""
        inbox = self.key("inbox")
        if timeout:
            reply = self._call(self._control.brpop, [inbox], timeout=timeout)
            first = reply[1] if reply else None
        else:
            first = self._call(self._control.rpop, inbox)
        if first is None:
            return []
        raws = [first]
        if at_most > 1:
            def build(pipe):
                pipe.lrange(inbox, -(at_most - 1), -1)
                pipe.ltrim(inbox, 0, -at_most)
            raws += list(reversed(self._pipeline(build)[0]))
        return [m for m in (self._checked(raw, inbox, schema) for raw in raws) if m is not None]

    def reply_to(self, worker, message):
        self._send(self.key("go", worker), message)

    def reply_to_each(self, replies):
        """[(worker, message)] sent in one round trip."""
        if not replies:
            return
        def build(pipe):
            for worker, message in replies:
                pipe.lpush(self.key("go", worker), json.dumps(message, separators=(",", ":")))
        self._pipeline(build, transaction=False)

    def next_reply(self, worker, timeout, schema):
        """The next reply to `worker` that passes `schema` (wire.py), or None after `timeout` seconds (0: don't
        wait) or when the one popped failed (it is dropped)."""
        return self._receive(self.key("go", worker), timeout, schema)

    # --- heartbeats and members ------------------------------------------------------------------------------------

    def worker_heartbeat(self, worker, ttl_s):
        self._beat(self.key("hb", worker), ttl_s)

    def claim_master(self, ttl_s, wait_s=0.0):
        """Take the job's master lease (one master per job), waiting up to wait_s for another's to lapse (a master
        that was killed holds it for one heartbeat time); StoreError naming the holder otherwise."""
        self._lease = json.dumps({"host": socket.gethostname()[:100], "pid": os.getpid(),
                                  "token": secrets.token_hex(8)})
        deadline = time.monotonic() + wait_s
        while not self._call(self._control.set, self.key("master"), self._lease, nx=True, px=int(ttl_s * 1000)):
            if time.monotonic() > deadline:
                raise StoreError("job %s already has a live master (%s): one master per job (stop it first, or "
                                 "wait %.0f s after it died)" % (self.job, self.master_holder(), ttl_s))
            time.sleep(0.2)

    def master_heartbeat(self, ttl_s):
        """Renew this master's lease (taken by claim_master); StoreError when another master holds it now. A lease
        that lapsed (Redis stalled, or restarted empty) is taken again."""
        if self._lease is None:
            self.claim_master(ttl_s)
            return
        renewed = self._call(self._renew_lease, keys=[self.key("master")], args=[self._lease, int(ttl_s * 1000)])
        if not renewed:
            raise StoreError("job %s: another master (%s) took the job's lease: this one stops"
                             % (self.job, self.master_holder()))

    def release_master(self):
        """Give the lease up (a master that stops before it began): removed only if it is still ours."""
        if self._lease is not None:
            self._call(self._control.eval, "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) "
                       "end", 1, self.key("master"), self._lease)
            self._lease = None

    def master_holder(self):
        """Who holds the master's lease, in words (its host and pid, as it wrote them)."""
        raw = self._call(self._control.get, self.key("master"))
        try:
            holder = json.loads(raw) if raw is not None and len(raw) < 1000 else None
            return "pid %d on %s" % (int(holder["pid"]), str(holder["host"])[:100])
        except (ValueError, TypeError, KeyError):
            return "none" if raw is None else "a lease of unknown form"

    def workers_alive(self, workers):
        """One bool per worker id: whether its heartbeat lives."""
        return self._exist([self.key("hb", w) for w in workers])

    def master_alive(self):
        return self._exist([self.key("master")])[0]

    def add_member(self, worker, info):
        """Record a member of the job (host, pid, data slot), for the status display and a restarted master."""
        self._call(self._control.hset, self.key("workers"), str(worker), json.dumps(info))

    def members(self):
        """{worker id: info} of every worker the master recorded."""
        raw = self._call(self._control.hgetall, self.key("workers"))
        members = {}
        for worker, info in raw.items():
            try:
                info = wire.MEMBER.check(dict(self._parse(info, self.key("workers")), type="member"),
                                         self.key("workers"))
                info.pop("type")
                members[wire.worker_id(worker.decode("ascii"))] = info
            except (BadMessage, ValueError, UnicodeDecodeError) as exc:
                self.refuse("%s: a member %r that is not one: %s" % (self.key("workers"), worker[:20], exc))
        return members

    def claim_worker_id(self, wanted=None):
        """The id asked for, or the next free one; each id is claimed once per job (ids: id -> pid)."""
        ids = self.key("ids")
        if wanted is not None:
            if not self._call(self._control.hsetnx, ids, str(wanted), os.getpid()):
                raise StoreError("job %s already has a worker %s" % (self.job, wanted))
            return str(wanted)
        while True:
            candidate = str(self._call(self._control.incr, self.key("next_worker")) - 1)
            if self._call(self._control.hsetnx, ids, candidate, os.getpid()):
                return candidate

    def leave(self, worker):
        """A worker's heartbeat and reply queue, removed as it leaves."""
        self._call(self._control.delete, self.key("hb", worker), self.key("go", worker))

    def remove_job(self):
        """Delete every key of the job, on every server."""
        for url, client in zip(self.urls, self._clients):
            keys = list(self._call(lambda: list(client.scan_iter(match=self.key("*"), count=1000)), url=url))
            for start in range(0, len(keys), 500):
                self._call(client.delete, *keys[start:start + 500], url=url)

    # --- the calls, retried ---------------------------------------------------------------------------------------

    def _call(self, function, *args, url=None, key=None, **kwargs):
        """function(*args, **kwargs), retried while Redis is unreachable; any Redis error becomes one StoreError
        line (a DamagedData where a key of the job holds the wrong type: `key`, or the first key in args)."""
        import redis
        delay, deadline, warned = 0.1, time.monotonic() + self.retry_s, False
        while True:
            try:
                return function(*args, **kwargs)
            except (redis.AuthenticationError, redis.ResponseError) as exc:
                error = DamagedData if "WRONGTYPE" in str(exc) else StoreError
                raise error(explain(exc, url or self.urls[0], key or _first_key(args) or _key_in(str(exc)))) from None
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc) or "Authentication" in str(exc):
                    raise StoreError(explain(exc, url or self.urls[0])) from None
                if time.monotonic() + delay > deadline:
                    raise StoreError("%s; gave up after %.0f s of retries" % (explain(exc, url or self.urls[0]),
                                                                            self.retry_s)) from None
                if not warned:
                    log.warning("%s; retrying for up to %.0f s", explain(exc, url or self.urls[0]), self.retry_s)
                    warned = True
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _pipeline(self, build, transaction=True):
        """build(pipe)'s commands on the first server, in one round trip, retried as one: the pipeline is built
        again for each try (a redis-py pipeline forgets its commands when its execute fails)."""
        def run():
            pipe = self._control.pipeline(transaction=transaction)
            build(pipe)
            return pipe.execute()
        return self._call(run)

    def _beat(self, key, ttl_s):
        self._call(self._control.set, key, b"1", px=int(ttl_s * 1000))

    def _exist(self, keys):
        if not keys:
            return []
        def build(pipe):
            for key in keys:
                pipe.exists(key)
        return [bool(x) for x in self._pipeline(build, transaction=False)]

    def _field(self, key, field, limit=MAX_MESSAGE):
        """A hash field of bounded size (None if absent)."""
        def build(pipe):
            pipe.hstrlen(key, field)
            pipe.hget(key, field)
        length, value = self._pipeline(build)
        if value is not None and length > limit:
            raise StoreError("job %s: %s %s is %d bytes (at most %d expected)" % (self.job, key, field, length, limit))
        return value

    def _put_field(self, key, field, text):
        """A hash field of the job's (`key`: its name under the job) set to a short text."""
        self._call(self._control.hset, self.key(key), field, text)

    def _fields(self, key, limit=MAX_MESSAGE):
        """Every field of the job's hash `key` as {field: text}, each value of bounded size; {} where there is none."""
        raw = self._call(self._control.hgetall, self.key(key))
        out = {}
        for field, value in raw.items():
            if len(value) > limit:
                raise StoreError("job %s: %s %s is %d bytes (at most %d expected)"
                                 % (self.job, self.key(key), field[:40], len(value), limit))
            out[field.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        return out

    def _send(self, queue, message):
        self._call(self._control.lpush, queue, json.dumps(message, separators=(",", ":")))

    def _receive(self, queue, timeout, schema):
        """The next message on `queue` that passes `schema` (wire.py), or None after `timeout` seconds (0: don't
        wait); one that fails is dropped (refuse) and None returned: the caller polls again."""
        if timeout:
            reply = self._call(self._control.brpop, [queue], timeout=timeout)
            raw = reply[1] if reply else None
        else:
            raw = self._call(self._control.rpop, queue)
        return None if raw is None else self._checked(raw, queue, schema)

    def _checked(self, raw, queue, schema):
        try:
            return schema.check(self._parse(raw, queue), queue)
        except BadMessage as exc:
            self.refuse(str(exc))
            return None

    def refuse(self, reason):
        """A message dropped: one warning line (the first REFUSALS_SHOWN of them; then only counted)."""
        self.refused += 1
        if self.refused <= REFUSALS_SHOWN:
            log.warning("Dropped a message: %s%s", reason, "" if self.refused < REFUSALS_SHOWN else
                        " (further dropped messages are only counted: `refused_messages` in --stats)")

    def _parse(self, raw, where, limit=MAX_MESSAGE):
        if len(raw) > limit:
            raise BadMessage("%s: a message of %d bytes (at most %d expected)" % (where, len(raw), limit))
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            raise BadMessage("%s: a message that is not JSON: %r" % (where, raw[:60])) from None
        if not isinstance(message, dict):
            raise BadMessage("%s: a message that is not a JSON object: %r" % (where, raw[:60]))
        return message

    # --- blobs ----------------------------------------------------------------------------------------------------

    def _remove_blobs(self, kind, owner=None):
        """A blob set removed from every server."""
        for server, (url, client) in enumerate(zip(self.urls, self._clients)):
            self._call(client.delete, self._blob_key(kind, server, owner), url=url)

    def _blob_key(self, kind, server, owner=None):
        return self.key(kind, server) if owner is None else self.key(kind, owner, server)

    def _layout(self, shapes):
        """Where the blobs of `shapes` lie on the servers: for server s, (its slice's float count, [(blob, start,
        stop, offset in the slice)]). The blobs are laid end to end as one float vector cut into equal slices, one
        per server: by blob, LeNet's ip1 weights (93 % of the floats) would load one server alone."""
        key = tuple(tuple(s) for s in shapes)
        layout = self._layouts.get(key)
        if layout is None:
            sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
            ends = np.cumsum([0] + sizes)
            n = len(self._clients)
            bounds = [int(ends[-1]) * k // n for k in range(n + 1)]
            layout = []
            for lo, hi in zip(bounds, bounds[1:]):
                pieces = [(i, max(lo, ends[i]) - ends[i], min(hi, ends[i + 1]) - ends[i], max(lo, ends[i]) - lo)
                          for i in range(len(sizes)) if ends[i] < hi and ends[i + 1] > lo]
                layout.append((hi - lo, [tuple(int(v) for v in piece) for piece in pieces]))
            layout = self._layouts[key] = layout
        return layout

    def _on_every_server(self, work):
        """work(server) on every server at once (the transfers overlap: redis-py waits on its socket without the
        GIL), the first in this thread; their results in server order."""
        if self._pool is None:
            return [work(0)]
        others = [self._pool.submit(work, server) for server in range(1, len(self._clients))]
        first = work(0)
        return [first] + [future.result() for future in others]

    def _put_blobs(self, kind, arrays, version=0, owner=None, state=None):
        """Write float32 arrays as blobs `kind` (of `owner`), atomically per server, with `state` (a mapping) into
        the first server's hash `state` in the same transaction (the master's state with W). Zero-copy: the SET's
        value goes to the socket straight from the arrays (a version, then a view of each piece)."""
        if isinstance(arrays, np.ndarray):
            # its rows would pass for blobs, and be read back against the wrong shapes
            raise TypeError("blobs %r: a list of arrays, not one array" % kind)
        layout = self._layout([a.shape for a in arrays])
        flat = [np.ascontiguousarray(a, "<f4").reshape(-1) for a in arrays]

        def write(server):
            count, pieces = layout[server]
            self._write_on(server, kind, [flat[i][start:stop] for i, start, stop, _ in pieces], count, version,
                           owner, state if server == 0 else None)
        self._on_every_server(write)

    def layout(self, shapes):
        """Where the blobs of `shapes` lie on the servers (see _layout): a shard's slice is server s's."""
        return self._layout(shapes)

    def _put_slice(self, kind, server, flat, version=0, owner=None, state=None):
        """Server `server`'s slice of blobs `kind` (of `owner`): `flat`, the slice's floats (a parameter server's
        shard writes only its own, data_parallel/shard.py); `state` as _put_blobs' (server 0 only)."""
        self._write_on(server, kind, [np.ascontiguousarray(flat, "<f4").reshape(-1)], flat.size, version, owner,
                       state)

    def _write_on(self, server, kind, pieces, count, version, owner, state):
        """One server's SET of a blob value: the version, then `pieces` (float32 arrays, `count` floats in all)
        sent from their own memory; with `state`, in one transaction with the first server's hash `state`."""
        key = self._blob_key(kind, server, owner).encode()
        value = [b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, HEADER + 4 * count),
                 np.uint64(version).astype("<u8").tobytes()]
        value += [memoryview(piece).cast("B") for piece in pieces] + [b"\r\n"]
        self._count("sent", 4 * count)

        def send(conn):
            if state is not None:
                fields = [x for k, v in state.items() for x in (k, v)]
                conn.send([command("MULTI")] + value + [command("HSET", self.key("state"), *fields),
                                                         command("EXEC")])
                for _ in range(3):              # OK, QUEUED, QUEUED
                    conn.reply()
                conn.reply()                    # EXEC's replies (an error in them was raised as one)
            else:
                conn.send(value)
                conn.reply()
        self._call(self._links[server].call, send, url=self.urls[server], key=key.decode())

    def _get_blobs(self, kind, shapes, owner=None, out=None, missing_ok=False):
        """Read blobs `kind` of the given shapes into new arrays (or `out`); returns (arrays, version), or
        (None, None) when they are absent and missing_ok. Zero-copy: the GETRANGE reply is received straight into
        the arrays. Each read asks for one byte more than expected, so that a value of another size is refused;
        with several servers, a torn read (slices of different versions) is read again."""
        layout = self._layout(shapes)
        arrays = out if out is not None else [np.empty(s, np.float32) for s in shapes]
        if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays):
            raise ValueError("out must be C-contiguous float32 arrays (received into in place)")
        flat = [a.reshape(-1) for a in arrays]

        def read(server):
            count, pieces = layout[server]
            return self._read_on(server, kind, [flat[i][start:stop] for i, start, stop, _ in pieces], count, owner,
                                 missing_ok, shapes)
        for _ in range(50):
            versions = self._on_every_server(read)
            if None in versions:
                return None, None
            if len(set(versions)) == 1:
                return arrays, versions[0]
        raise StoreError("job %s: blobs %s keep changing while being read" % (self.job, kind))

    def _get_slice(self, kind, server, out, owner=None, missing_ok=False):
        """Server `server`'s slice of blobs `kind` (of `owner`) read into `out` (a flat float32 array of the
        slice's size); its version, or None when absent and missing_ok."""
        return self._read_on(server, kind, [out], out.size, owner, missing_ok, None)

    def _read_on(self, server, kind, pieces, count, owner, missing_ok, shapes):
        """One server's GETRANGE of a blob value into `pieces` (float32 views, `count` floats in all); its version,
        or None when absent and missing_ok. `shapes`: the blob set's, for the message of a value of another size."""
        key, size = self._blob_key(kind, server, owner), HEADER + 4 * count
        version = bytearray(HEADER)
        views = [memoryview(version)] + [memoryview(piece).cast("B") for piece in pieces]

        def fetch(conn):
            conn.send([command("GETRANGE", key, 0, size)])
            return conn.bulk_into(views)
        try:
            length = self._call(self._links[server].call, fetch, url=self.urls[server], key=key)
        except TooLong as exc:
            length = exc.length
        self._count("received", length)
        if length == 0:
            if missing_ok:
                return None
            raise StoreError("job %s: %s is missing from Redis (was the server restarted or the job removed?)"
                             % (self.job, key))
        if length != size:
            what = ("blobs %s need" % ", ".join("x".join(map(str, s)) for s in shapes) if shapes is not None
                    else "its slice of %d floats needs" % count)
            raise DamagedData("job %s: %s holds %s bytes but %s %d there: the job's data on Redis is damaged" % (
                self.job, key, "more than %d" % size if length > size else length, what, size))
        return int(np.frombuffer(version, "<u8", 1)[0])

def _key_in(text):
    """The job's key a Redis error names (a pipeline's error quotes its failed command: "Command # 1 (LRANGE key
    ...)"), or None."""
    match = re.search(r"\b%s:[^\s)]+" % PREFIX, text)
    return match.group(0) if match else None


def _first_key(args):
    """The first argument that names a key of a job (for a message about it), or None."""
    for arg in args:
        for item in (arg if isinstance(arg, (list, tuple)) else [arg]):
            if isinstance(item, (str, bytes)) and (item[:4] == PREFIX + ":" or item[:4] == (PREFIX + ":").encode()):
                return item if isinstance(item, str) else item.decode("utf-8", "replace")
    return None
