"""The connections to Redis: URLs (and the one form they take in a message: describe), redis-py clients, and a
socket of our own for the blobs (BlobLink, RespSocket), zero-copy both ways. The store (store.py) holds the key
layout and the protocol's calls; this module only connects and moves bytes."""
import ipaddress
import os
import socket
import threading
import urllib.parse

from ..errors import StoreError

PASSWORD_ENV = "PCD_REDIS_PASSWORD"


def is_loopback(host):
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def describe(url):
    """A URL (or several, comma-separated) without user or password: the only form a URL takes in a message."""
    if "," in url:
        return ",".join(describe(u) for u in url.split(",") if u)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or 6379
    except ValueError:
        return "<a malformed URL>"
    if parts.scheme == "unix":
        return "unix://" + parts.path
    return "%s://%s:%s" % (parts.scheme or "?", parts.hostname, port)


def local_address(url):
    """This machine's address on its way to the Redis server at `url` (the address the server sees; it tells
    workers on one host apart, e.g. in network namespaces), or None for a unix socket or an unknown host. A UDP
    socket's connect only picks the route: nothing is sent."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix" or not parts.hostname:
        return None
    try:
        family, kind, proto, _, where = socket.getaddrinfo(parts.hostname, parts.port or 6379,
                                                           type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(where)
            return probe.getsockname()[0]
    except (OSError, ValueError):
        return None


def connect(url, timeout=10.0):
    """A redis-py client for one URL (redis://, rediss:// with TLS, unix://). A password comes from the URL or
    $PCD_REDIS_PASSWORD; one is required for a server that is not on loopback."""
    import redis
    from redis.connection import Encoder, PythonRespSerializer
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise StoreError("%s: not a Redis URL (use redis://[user:password@]host:port, rediss:// for TLS, or "
                         "unix:///path)" % describe(url))
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


def server_answers(url, password, timeout=2.0):
    """Whether the Redis server at `url` answers a PING with `password` (a server being started)."""
    import redis
    try:
        return bool(redis.Redis.from_url(url, password=password, socket_timeout=timeout,
                                         socket_connect_timeout=timeout).ping())
    except redis.RedisError:
        return False


def explain(exc, url, key=None):
    import redis
    name = describe(url)
    text = str(exc)
    if "WRONGTYPE" in text:
        return "Redis at %s: %s holds a value of the wrong type (%s): the job's data on Redis is damaged" % (
            name, key or "a key of the job", text)
    if "NOAUTH" in text or "Authentication required" in text:
        return "Redis at %s needs a password (give it in the URL or $%s)" % (name, PASSWORD_ENV)
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in text or "invalid password" in text:
        return "Redis at %s refused the password (%s)" % (name, text)
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return "Redis at %s is unreachable (%s)" % (name, text)
    return "Redis at %s: %s" % (name, text)


class BlobLink:
    """Sockets of our own to one Redis server for the blobs, zero-copy both ways: a SET's value goes out as views of
    the arrays, and a GETRANGE reply is received into them. redis-py copies a large reply three times (its socket
    buffer, hiredis's, a bytes object) and has no public way to receive into a buffer: reading LeNet's 1.7 MB took
    the master 0.79 ms of CPU through it and 0.40 ms here. The URL is the store's (redis://, rediss:// with the
    ssl_ca_certs, ssl_certfile, ssl_keyfile and ssl_cert_reqs parameters redis-py takes, unix://; the password
    from the URL or $PCD_REDIS_PASSWORD). Connections are pooled (the master reads on several threads); one that
    fails midway is closed, what was left on it being nobody's to read."""

    def __init__(self, url, timeout=10.0):
        parts = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(parts.query))
        self.url, self.timeout, self.scheme = url, timeout, parts.scheme
        self.unix_path = parts.path if parts.scheme == "unix" else None
        self.address = (parts.hostname or "127.0.0.1", parts.port or 6379)
        password = urllib.parse.unquote(parts.password) if parts.password else os.environ.get(PASSWORD_ENV)
        user = urllib.parse.unquote(parts.username) if parts.username else None
        self.auth = (([user] if user else []) + [password]) if password else None
        db = query.get("db") or (parts.path.strip("/") if parts.scheme != "unix" else "")
        self.db = int(db) if db else 0
        self.ssl = query if parts.scheme == "rediss" else None
        self.idle, self.lock = [], threading.Lock()

    def call(self, work):
        """work(connection) on a pooled connection (made and authenticated when none is idle)."""
        with self.lock:
            conn = self.idle.pop() if self.idle else None
        try:
            conn = conn or RespSocket(self)
            result = work(conn)
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        with self.lock:
            self.idle.append(conn)
        return result

    def open_socket(self):
        if self.unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
            return sock
        sock = socket.create_connection(self.address, timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl is None:
            return sock
        import ssl
        context = ssl.create_default_context(cafile=self.ssl.get("ssl_ca_certs"))
        if self.ssl.get("ssl_certfile"):
            context.load_cert_chain(self.ssl["ssl_certfile"], self.ssl.get("ssl_keyfile"))
        if self.ssl.get("ssl_cert_reqs", "required").lower() in ("none", "cert_none"):
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context.wrap_socket(sock, server_hostname=self.address[0])


class RespSocket:
    """One connection of a BlobLink, speaking just enough RESP for the blobs: commands out as lists of buffers,
    simple replies, and bulk replies received into buffers."""

    def __init__(self, link):
        import redis
        self.buf = bytearray()
        try:
            self.sock = link.open_socket()
        except OSError as exc:
            raise redis.ConnectionError("Error connecting to %s: %s" % (describe(link.url), exc)) from None
        if link.auth:
            self.send([command("AUTH", *link.auth)])
            self.reply()
        if link.db:
            self.send([command("SELECT", link.db)])
            self.reply()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, chunks):
        import redis
        try:
            for chunk in chunks:
                self.sock.sendall(chunk)
        except OSError as exc:
            raise redis.ConnectionError("writing to Redis: %s" % exc) from None

    def _fill(self):
        import redis
        try:
            chunk = self.sock.recv(65536)
        except OSError as exc:
            raise redis.ConnectionError("reading from Redis: %s" % exc) from None
        if not chunk:
            raise redis.ConnectionError("Redis closed the connection")
        self.buf += chunk

    def line(self):
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[:end + 2]
                return line
            self._fill()

    def reply(self):
        """A simple, integer or array reply (never a large bulk: those go through bulk_into)."""
        import redis
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            text = rest.decode("utf-8", "replace")
            raise (redis.AuthenticationError if "WRONGPASS" in text or "invalid password" in text
                   else redis.ResponseError)(text)
        if kind == b"+":
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"*":
            return None if int(rest) < 0 else [self.reply() for _ in range(int(rest))]
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            while len(self.buf) < size + 2:
                self._fill()
            value = bytes(self.buf[:size])
            del self.buf[:size + 2]
            return value
        raise redis.ConnectionError("unexpected reply from Redis: %r" % line[:40])

    def bulk_into(self, views):
        """A bulk reply received into `views` (writable byte memoryviews, filled in order); returns its length.
        One longer than the views is not read on (the caller refuses it and the connection is closed)."""
        import redis
        line = self.line()
        if line[:1] == b"-":
            raise redis.ResponseError(line[1:].decode("utf-8", "replace"))
        if line[:1] != b"$":
            raise redis.ConnectionError("unexpected reply from Redis: %r" % line[:40])
        length = int(line[1:])
        if length > sum(v.nbytes for v in views):
            raise TooLong(length)
        left = max(length, 0)
        for view in views:
            view = view[:min(view.nbytes, left)]
            have = min(len(self.buf), view.nbytes)
            view[:have] = self.buf[:have]
            del self.buf[:have]
            while have < view.nbytes:
                try:
                    got = self.sock.recv_into(view[have:])
                except OSError as exc:
                    raise redis.ConnectionError("reading from Redis: %s" % exc) from None
                if not got:
                    raise redis.ConnectionError("Redis closed the connection")
                have += got
            left -= view.nbytes
            if not left:
                break
        if length >= 0:
            while len(self.buf) < 2:
                self._fill()
            del self.buf[:2]
        return length


class TooLong(Exception):
    """A blob reply longer than expected (its length): the caller refuses it, the connection is closed."""

    def __init__(self, length):
        super().__init__(length)
        self.length = length


def command(*args):
    """A RESP command of small arguments, as bytes."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
