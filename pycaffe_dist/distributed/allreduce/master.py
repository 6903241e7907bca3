"""The coordinator of an all-reduce job (`train --workers N --mode allreduce`): it is not on the data path. It
publishes the job (the spec and the checkpoint the workers start from: the solver's initialisation, --weights or
--snapshot), starts the workers' MPI world (its own mpiexec on one machine; on a cluster the user's mpiexec or
srun runs `dist_caffe worker` and the coordinator waits for that world), watches it, and ends the job: Caffe's
lines and the tests come from worker 0 (worker.py, keeper.py), the progress record too.

A lost worker: MPI ends the whole world when one process dies (Open MPI's default). The coordinator then starts a
world of the others (an elastic restart, as torchrun's), from the last checkpoint, with one line naming the worker
lost and the iteration the others go on from; the data shards and the rate follow the new N. A world the
coordinator did not start (a cluster's) it cannot start again: the job ends with one line, and goes on from worker
0's last snapshot (--snapshot) when run again.
With --link the coordinator starts the workers itself, each behind its emulated link, and their ring runs on
sockets (worlds.py, sockets.py): Open MPI's ranks in namespaces of one machine cannot reach each other.

Stop (Ctrl-C, SIGTERM): worker 0 is asked; every worker stops after the same iteration, worker 0 snapshots. NaN
or Inf in the averaged gradients: every worker stops before the update; worker 0's snapshot holds the last finite W,
and the job ends with one line naming it."""
import dataclasses
import logging
import os
import sys
import time

from ...errors import DivergedError, PycaffeDistError, StoreError
from ...solver.solver import Solver
from .. import job as jobs
from .. import lr_scaling, wire
from ..coordinator import Coordinator
from ..settings import JsonSettings
from . import buckets
from .keys import SPEC, AllreduceStore
from .worlds import MpiWorld, SocketWorld

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
    # --link: the command prefixes that put worker r behind its emulated link (`ip netns exec NS`); the world then
    # runs on sockets (sockets.py), not MPI
    namespaces: list = dataclasses.field(default_factory=list)
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
        self.world = None               # the running world (worlds.py: one this process started)
        self.worlds = 0                 # worlds started: the number of the next (the sockets' rendezvous)
        self.size = settings.workers
        self.members = {}
        self.restarts, self.lost = 0, []
        self.images_before = 0          # the images of the worlds before the last (a restart's)
        self.outcome = None             # the last world's end: a "done" or "diverged" message
        self.errors = {}                # rank -> the error a worker of the running world reported
        self.last_progress = None

    # --- the frame ---------------------------------------------------------------------------------------------

    def _begin(self):
        weights, histories, (count, current_step) = self.initial
        self.store.publish_job(self.spec)
        self.store.put_checkpoint(weights, histories, count, current_step)
        self.store.master_heartbeat(self.settings.heartbeat_s)
        log.info("All-reduce: %d workers average their gradients over %s every iteration (a ring, in buckets "
                 "that overlap the backward); no master on the data path", self.size,
                 "sockets behind their links" if self.settings.namespaces else "MPI")

    def _serve(self):
        while True:
            self.outcome, self.members, self.errors = None, {}, {}
            if self.settings.launch:
                self.world = self._start_world()
            self._watch()
            if self.outcome is not None:
                break
            lost = self.world.lost() if self.world is not None else None
            if self.errors and (lost is None or lost[0] in self.errors and not lost[2]):
                # a worker failed (its own error, not its neighbours' broken ring): the job fails, as any process's
                worker = lost[0] if lost is not None and lost[0] in self.errors else min(self.errors)
                raise PycaffeDistError("worker %s: %s" % (worker, self.errors[worker]))
            if self.stop_requested:
                break
            if not self.settings.launch:
                raise StoreError("job %s: the workers' MPI world ended at iteration %d (a worker was lost), and "
                                 "this coordinator did not start it: run the job again from worker 0's last "
                                 "snapshot (--snapshot)" % (self.job, self._count()))
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
        state = self.store.master_state()
        # (the progress record is written every half second, the checkpoint may be newer)
        at = max(self._count(), state.get("count", 0))
        rank, how, _ = lost if lost is not None else (None, "the world ended with status %s" %
                                                      (self.world.returncode if self.world else "?"), False)
        if self.size < 2:
            raise StoreError("job %s: worker %s was lost (%s) and no worker is left" % (self.job, rank, how))
        self._end_world(wait=False)
        self._drop_messages_of_the_ended_world()
        self.lost.append({"worker": rank, "how": how, "iteration": at, "from": state.get("count", 0)})
        self.images_before += (self.last_progress or {}).get("images", 0)
        self.size -= 1
        self.restarts += 1
        log.warning("worker %s was lost (%s) at iteration %d: the %d others go on from iteration %d, the last "
                    "checkpoint", "?" if rank is None else rank, how, at, self.size, state.get("count", 0))

    def _drop_messages_of_the_ended_world(self):
        """What the ended world's workers said after the watch stopped reading (the second neighbour's broken ring,
        a ready line): its processes are all gone now, so nothing more comes from them, and none of it is about
        the next world. Left in the inbox, a dead neighbour's error would end the new world the moment it starts."""
        dropped = 0
        while True:
            stale = self.store.next_messages(0, 64, wire.ALLREDUCE_INBOX)
            if not stale:
                break
            dropped += len(stale)
        if dropped:
            log.debug("%d messages of the ended world dropped", dropped)

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
                if not self.world.running():
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
            log.info("Worker %s ready on %s%s (pid %s)", worker, message.get("host", "?"),
                     " at " + message["address"] if message.get("address") else "", message.get("pid", "?"))
            if len(self.members) == message["world"]:
                if not self.started:
                    self.started_at = time.monotonic()
                self.started = True
                log.info("Starting: %d workers ready", len(self.members))
        elif kind == "error":
            self.errors[int(worker)] = message.get("error", "failed")
        elif kind in ("done", "diverged"):
            self.outcome = message

    def _start_world(self):
        """A world of the workers left: MPI's, or on sockets behind the emulated links."""
        argv = [sys.executable, "-m", "pycaffe_dist", "worker", "--redis", self.settings.redis, "--job", self.job,
                "--threads", str(self.settings.worker_threads)]
        if self.settings.python_layers:
            argv += ["--python-layers", ",".join(self.settings.python_layers)]
        if self.settings.gpus:
            argv += ["--gpu", ",".join(map(str, self.settings.gpus))]
        number, self.worlds = self.worlds, self.worlds + 1
        if not self.settings.namespaces:
            return MpiWorld(self.size, argv, os.environ)
        return SocketWorld(self.size, lambda r: argv + ["--ring", "%d/%d/%d" % (r, self.size, number)],
                           os.environ, self.settings.namespaces)

    def _end_world(self, wait):
        if self.world is None:
            return
        if wait:
            deadline = time.monotonic() + 15
            while self.world.running() and time.monotonic() < deadline:
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

