"""The parameter store: one job's weights, results and control messages in Redis (redis-py with hiredis).

Every key a job writes is made here, under `pcd:{job}:`:

  job                 hash: spec (JSON: solver text, mode, options, blob names and shapes), state, epoch
  W:{i}               global weights, learnable blob i: 8-byte version (uint64 LE) + raw float32 LE data
  hist:{k}:{i}        the master's solver history set k, blob i (gradient-only), same layout
  x:{w}:{i}           worker w's result (delta, gradient or local weights) for blob i, same layout
  state               hash: merge count, current_step, version (what a restarted master continues from)
  stats               hash: progress for displays (JSON per field)
  inbox               list: JSON messages to the master (join, result, leave)
  go:{w}              list: JSON replies to worker w (welcome, merged, dropped, reset, stop)
  hb:{w}, master      heartbeat keys with a TTL
  workers             hash: worker id -> JSON (host, pid, slot), written by the master
  ids, next_worker    hash of claimed worker ids -> pid; counter for the next free id

Values are never pickled; JSON control messages are size-checked before parsing and blob reads are bounded by
the expected size (GETRANGE), then checked against it. Blobs can be sharded over several Redis servers (the
first one holds everything else), assigned by blob index, as DistBelief shards its parameter server.
"""
import ipaddress
import json
import logging
import os
import time
import urllib.parse

import numpy as np

from ..errors import StoreError

log = logging.getLogger("pycaffe_dist.distributed")

PREFIX = "pcd"
HEADER = 8                      # the version in front of every blob value
MAX_MESSAGE = 1 << 20           # control messages are small JSON objects
MAX_SPEC = 64 << 20             # a job spec holds the solver and net text
PASSWORD_ENV = "PCD_REDIS_PASSWORD"


def is_loopback(host):
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def describe(url):
    """A URL without its password, for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        return "unix://" + parts.path
    return "%s://%s:%s" % (parts.scheme, parts.hostname, parts.port or 6379)


def connect(url, timeout=10.0):
    """A redis-py client for one URL (redis://, rediss:// with TLS, unix://). A password comes from the URL or
    $PCD_REDIS_PASSWORD; one is required for a server that is not on loopback."""
    import redis
    from redis.connection import Encoder, PythonRespSerializer
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise StoreError("%s: not a Redis URL (use redis://[user:password@]host:port, rediss:// for TLS, or "
                         "unix:///path)" % url)
    # redis-py's pure-Python packing sends large values as they are (a memoryview); hiredis's packer copies
    # them into one command buffer, about 5 times slower for a LeNet's weights.
    packer = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
    kwargs = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "health_check_interval": 30,
              "command_packer": packer}
    if not parts.password and os.environ.get(PASSWORD_ENV):
        kwargs["password"] = os.environ[PASSWORD_ENV]
    if parts.scheme != "unix" and not is_loopback(parts.hostname) and not (parts.password or kwargs.get("password")):
        raise StoreError("%s: a password is required to use a Redis server that is not on loopback (give it in "
                         "the URL, redis://:PASSWORD@host:port, or in $%s)" % (describe(url), PASSWORD_ENV))
    return redis.Redis.from_url(url, **kwargs)


def _explain(exc, url):
    import redis
    name = describe(url)
    text = str(exc)
    if "NOAUTH" in text or "Authentication required" in text:
        return "Redis at %s needs a password (give it in the URL or $%s)" % (name, PASSWORD_ENV)
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in text or "invalid password" in text:
        return "Redis at %s refused the password (%s)" % (name, text)
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return "Redis at %s is unreachable (%s)" % (name, text)
    return "Redis at %s: %s" % (name, text)


class Store:
    """One job's view of the store. `urls` is one Redis URL or several (blobs sharded over them). Operations that
    meet a connection error retry with backoff for `retry_s` seconds, then raise StoreError."""

    def __init__(self, urls, job, retry_s=30.0):
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u]
        if not urls:
            raise StoreError("no Redis URL given")
        self.urls, self.job, self.retry_s = list(urls), job, retry_s
        self.clients = [connect(u) for u in self.urls]
        self.control = self.clients[0]
        self._buffers = {}                  # (kind, owner, blob) -> a reusable bytearray: version + data
        self._check_auth()

    # --- keys ---------------------------------------------------------------------------------------------

    def key(self, *parts):
        return ":".join((PREFIX, self.job) + tuple(str(p) for p in parts))

    def blob_key(self, kind, index, owner=None):
        return self.key(kind, index) if owner is None else self.key(kind, owner, index)

    @staticmethod
    def job_ids(client):
        """The jobs that have a spec on this server."""
        found = []
        for key in client.scan_iter(match="%s:*:job" % PREFIX, count=1000):
            key = key.decode() if isinstance(key, bytes) else key
            found.append(key[len(PREFIX) + 1:-len(":job")])
        return sorted(found)

    # --- errors and retries -------------------------------------------------------------------------------

    def _check_auth(self):
        for url, client in zip(self.urls, self.clients):
            self.call(client.ping, url=url)

    def call(self, function, *args, url=None, **kwargs):
        import redis
        delay, deadline, warned = 0.1, time.monotonic() + self.retry_s, False
        while True:
            try:
                return function(*args, **kwargs)
            except (redis.AuthenticationError, redis.ResponseError) as exc:
                raise StoreError(_explain(exc, url or self.urls[0])) from None
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc) or "Authentication" in str(exc):
                    raise StoreError(_explain(exc, url or self.urls[0])) from None
                if time.monotonic() + delay > deadline:
                    raise StoreError("%s; gave up after %.0f s of retries" % (_explain(exc, url or self.urls[0]),
                                                                            self.retry_s)) from None
                if not warned:
                    log.warning("%s; retrying for up to %.0f s", _explain(exc, url or self.urls[0]), self.retry_s)
                    warned = True
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # --- blobs ----------------------------------------------------------------------------------------------

    def _value(self, kind, owner, index, version, array):
        """The blob's value in a reusable buffer (filled with one copy, sent without another)."""
        size = HEADER + array.nbytes
        buffer = self._buffers.get((kind, owner, index))
        if buffer is None or len(buffer) != size:
            buffer = self._buffers[(kind, owner, index)] = bytearray(size)
        view = memoryview(buffer)
        view[:HEADER] = np.uint64(version).tobytes()
        np.frombuffer(buffer, "<f4", offset=HEADER).reshape(array.shape)[...] = array
        return view

    def _by_server(self, count):
        """(server, blob indices) pairs: blob i lives on server i mod the number of servers."""
        n = len(self.clients)
        return [(server, list(range(server, count, n))) for server in range(min(n, count))]

    def put_blobs(self, kind, arrays, version=0, owner=None, extra=None):
        """Write float32 arrays as blobs `kind` (of `owner`), atomically per server; `extra(pipe)` may queue more
        commands on the first server's transaction (a version bump, a state update)."""
        for server, indices in self._by_server(len(arrays)):
            def write(indices=indices, server=server):
                pipe = self.clients[server].pipeline(transaction=True)
                for i in indices:
                    pipe.set(self.blob_key(kind, i, owner), self._value(kind, owner, i, version, arrays[i]))
                if server == 0 and extra is not None:
                    extra(pipe)
                return pipe.execute()
            self.call(write, url=self.urls[server])

    def get_blobs(self, kind, shapes, owner=None, out=None, missing_ok=False):
        """Read blobs `kind` of the given shapes into new arrays (or `out`); returns (arrays, version), or
        (None, None) when they are absent and missing_ok. Each read is bounded by the expected size and checked;
        with several servers, a torn read (blobs of different versions) is read again."""
        sizes = [HEADER + 4 * int(np.prod(s, dtype=np.int64)) for s in shapes]
        for _ in range(50):
            values = [None] * len(shapes)
            for server, indices in self._by_server(len(shapes)):
                def read(indices=indices, server=server):
                    pipe = self.clients[server].pipeline(transaction=True)
                    for i in indices:
                        key = self.blob_key(kind, i, owner)
                        pipe.strlen(key)
                        pipe.getrange(key, 0, sizes[i] - 1)
                    return pipe.execute()
                replies = self.call(read, url=self.urls[server])
                for n, i in enumerate(indices):
                    length, value = replies[2 * n], replies[2 * n + 1]
                    if length == 0:
                        if missing_ok:
                            return None, None
                        raise StoreError("job %s: %s is missing from Redis (was the server restarted or the job "
                                         "removed?)" % (self.job, self.blob_key(kind, i, owner)))
                    if length != sizes[i]:
                        raise StoreError("job %s: %s holds %d bytes but blob %d of shape %s needs %d"
                                         % (self.job, self.blob_key(kind, i, owner), length, i,
                                            "x".join(map(str, shapes[i])), sizes[i]))
                    values[i] = value
            versions = {int(np.frombuffer(v, "<u8", 1)[0]) for v in values}
            if len(versions) == 1:
                break
        else:
            raise StoreError("job %s: blobs %s keep changing while being read" % (self.job, kind))
        arrays = out if out is not None else [np.empty(s, np.float32) for s in shapes]
        for a, v in zip(arrays, values):
            a[...] = np.frombuffer(v, "<f4", offset=HEADER).reshape(a.shape)
        return arrays, versions.pop()

    # --- control --------------------------------------------------------------------------------------------

    def send(self, queue, message):
        self.call(self.control.lpush, queue, json.dumps(message, separators=(",", ":")))

    def receive(self, queue, timeout):
        """The next JSON message on `queue`, or None after `timeout` seconds (0 = don't wait)."""
        if timeout:
            reply = self.call(self.control.brpop, [queue], timeout=timeout)
            raw = reply[1] if reply else None
        else:
            raw = self.call(self.control.rpop, queue)
        return None if raw is None else self.parse(raw, queue)

    def parse(self, raw, where):
        if len(raw) > MAX_MESSAGE:
            raise StoreError("job %s: a message of %d bytes on %s (at most %d expected)"
                             % (self.job, len(raw), where, MAX_MESSAGE))
        try:
            message = json.loads(raw)
        except ValueError:
            raise StoreError("job %s: a message on %s is not JSON: %r" % (self.job, where, raw[:80])) from None
        if not isinstance(message, dict):
            raise StoreError("job %s: a message on %s is not a JSON object: %r" % (self.job, where, raw[:80]))
        return message

    def heartbeat(self, name, ttl_s):
        self.call(self.control.set, self.key(name), b"1", px=int(ttl_s * 1000))

    def alive(self, names):
        pipe = self.control.pipeline(transaction=False)
        for n in names:
            pipe.exists(self.key(n))
        return [bool(x) for x in self.call(pipe.execute)] if names else []

    def get_field(self, key, field, limit=MAX_MESSAGE):
        """A hash field of bounded size (None if absent)."""
        pipe = self.control.pipeline(transaction=True)
        pipe.hstrlen(key, field)
        pipe.hget(key, field)
        length, value = self.call(pipe.execute)
        if value is not None and length > limit:
            raise StoreError("job %s: %s %s is %d bytes (at most %d expected)" % (self.job, key, field, length, limit))
        return value

    def job_spec(self):
        raw = self.get_field(self.key("job"), "spec", MAX_SPEC)
        return None if raw is None else self.parse(raw, self.key("job"))

    def remove_job(self):
        """Delete every key of the job, on every server."""
        for url, client in zip(self.urls, self.clients):
            keys = list(self.call(lambda: list(client.scan_iter(match=self.key("*"), count=1000)), url=url))
            for start in range(0, len(keys), 500):
                self.call(client.delete, *keys[start:start + 500], url=url)

