"""The worker side of every kind of job: what a data-parallel worker (data_parallel/worker.py), a Sandblaster worker
(sandblaster/worker.py) and a pipeline's stage (pipeline/stage.py) do the same way: find the job (waiting for one to be
published when none is named), wait for its spec and check it, beat its heart, give up when the job ends or its
master is gone. Sandblaster's workers and the stages also share the rest: the master's control messages (stop,
ack), and one frame that says ready, reports any failure to the master in one message, and leaves. A subclass
names itself (`name`: its heartbeat and queue owner; `identity()`: how its messages to the master say who sent
them) and does its work in `_build` and `_main`.

The data-parallel workers meet the master differently (they join, pull and push the modes' way:
data_parallel/worker.py) and keep their own frame over this base.
"""
import os
import socket
import threading
import time

from ..errors import PycaffeDistError, StoreError
from . import job as jobs
from . import wire
from .redis_client import local_address
from .store import Store

POLL_S = 0.5                    # seconds a wait for a message blocks before it checks on the job and its master
MASTER_TIMEOUT_BEATS = 10       # heartbeats without the master before a process gives up


def beat(process, name):
    """A process's heartbeat thread (data_parallel/worker.py's too): renew heartbeat `name` four times a heartbeat until
    process.stopping is set; a store that fails sets process.error and stops the process."""
    while not process.stopping.wait(process.heartbeat_s / 4):
        try:
            process.store.worker_heartbeat(name, process.heartbeat_s)
        except StoreError as exc:
            process.error = exc
            process.stopping.set()


class Stopped(Exception):
    """The master said stop, or the job is done."""


def find_or_wait_for_job(urls, job, wait_s):
    """The job named, or the only one on the server, waiting up to wait_s for one to be published (a server that
    refuses the password, or holds several jobs, is said at once)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return jobs.find_job(urls, job)
        except jobs.NoJobYet:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def job_kind(urls, job, wait_s, retry_s=30.0):
    """The kind of the job named (or the only one), once its spec is published (None: data-parallel, or no spec
    yet within wait_s: the process's own wait then says so); an unreachable Redis is retried for retry_s."""
    job = find_or_wait_for_job(urls, job, wait_s)
    deadline = time.monotonic() + wait_s
    store = Store(urls, job, retry_s)
    while True:
        spec = store.job_spec()
        if spec is not None or time.monotonic() > deadline:
            return spec.get("kind") if isinstance(spec, dict) else None
        time.sleep(0.2)


class JobProcess:
    def __init__(self, urls, job, wait_for_job_s=60.0, master_timeout_s=None, retry_s=30.0, python_layers=()):
        self.job = find_or_wait_for_job(urls, job, wait_for_job_s)
        self.store = self.store_class(urls, self.job, retry_s)
        self.spec = jobs.wait_for_spec(self.store, self.job, wait_for_job_s, self.spec_kind, python_layers)
        self.heartbeat_s = float(self.spec["heartbeat_s"])
        # A master is gone after this long without its heartbeat: the job's heartbeat setting, ten times over (a
        # master busy with a snapshot or a test on one core still beats within it).
        self.master_timeout_s = master_timeout_s or MASTER_TIMEOUT_BEATS * self.heartbeat_s
        self.stopping, self.error = threading.Event(), None
        self.unacked = False            # a result of ours the master has not acknowledged yet
        self.stats = {}                 # what the process did, for its last line (a subclass fills it)
        self.last_master = time.monotonic()

    # --- what a subclass says --------------------------------------------------------------------------------------

    name = None                         # the heartbeat's and the control queue's owner
    store_class = Store                 # the job's store, with the keys of this kind's protocol
    spec_kind = None                    # the kind of job it works in (job.SpecKind, from the kind's keys.py)

    def identity(self):
        """The fields that name this process in its messages to the master, e.g. {"worker": "3"}."""
        raise NotImplementedError

    def _build(self):
        """Everything before the process says it is ready (its nets, its state)."""

    def _main(self):
        """The work, until the master says stop (Stopped) or the job ends."""
        raise NotImplementedError

    def _ready_line(self):
        """The log line once ready."""
        raise NotImplementedError

    def control_queue(self):
        """Where the master's control messages to this process come (default: its own queue)."""
        return self.name

    def _leave(self):
        self.store.leave(self.name)

    # --- the master's messages ---------------------------------------------------------------------------------------

    def _control(self, message):
        """A control message (checked: wire.CONTROL): stop ends the process (Stopped; a StoreError where the master
        says why: a failure), ack clears `unacked`; returns its status."""
        status = message["status"]
        if status == "stop":
            if message.get("why"):
                raise jobs.stopped_by_master(self.job, message["why"])
            raise Stopped()
        if status == "ack":
            self.unacked = False
        return status

    def _poll_control(self):
        """Every control message waiting, without waiting."""
        while True:
            message = self.store.next_reply(self.control_queue(), 0, wire.CONTROL)
            if message is None:
                return
            self._control(message)

    def _check_master(self):
        """Gives up when this process failed, the job is over or its master gone: called whenever a wait found
        nothing."""
        if self.error is not None:
            raise self.error
        if self.store.job_state() != "running":
            self._poll_control()                # the master's stop (queued before "done") says why, if it failed
            raise Stopped()
        if self.store.master_alive():
            self.last_master = time.monotonic()
        elif time.monotonic() - self.last_master > self.master_timeout_s:
            raise StoreError("the master of job %s has not been seen for %.0f s" % (self.job, self.master_timeout_s))

    def _beat(self):
        beat(self, self.name)

    # --- the frame ---------------------------------------------------------------------------------------------------

    def run(self):
        """Build, say ready, work until stopped; a failure goes to the master in one message and is raised."""
        beat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self.store.worker_heartbeat(self.name, self.heartbeat_s)
        beat.start()
        self.last_master = time.monotonic()
        try:
            self._build()
            self._say_ready()
            self._ready_line()
            self._main()
        except Stopped:
            pass
        except PycaffeDistError as exc:
            self._tell_master(str(exc))
            raise
        except Exception as exc:
            self._tell_master("%s: %s" % (type(exc).__name__, exc))
            raise
        finally:
            self.stopping.set()
            try:
                self._leave()
            except StoreError:
                pass
        return self.stats

    def _say_ready(self):
        """Tell the master this process is ready (built): a ready message in its inbox."""
        self.store.send_to_master(dict(self.identity(), type="ready", host=socket.gethostname(),
                                       address=local_address(self.store.urls[0]), pid=os.getpid()))

    def _tell_master(self, text):
        try:
            self.store.send_to_master(dict(self.identity(), type="error", error=text[:2000]))
        except StoreError:
            pass
