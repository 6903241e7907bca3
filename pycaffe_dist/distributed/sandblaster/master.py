"""The coordinator of Sandblaster L-BFGS (`train --workers N --mode sandblaster`, DistBelief's Sandblaster, Dean et
al. 2012): L-BFGS (solver/lbfgs.py) over the net's weights x, on the master, every evaluation of the objective at a
point cut into work units that the workers (worker.py) take as they ask; the master adds their sums up.

The objective. Iteration k minimises the mean loss over a sample of B batches (--sample-batches) of the TRAIN data,
batches kB to kB + B - 1 of the stream its data layers read, plus the solver's L2 weight decay:
    f(x) = mean loss + weight_decay / 2 * sum_i decay_mult_i |x_i|^2,   g = its gradient + weight_decay decay_mult_i x_i
The sample stays fixed within an iteration, for the line search and for the pair it stores: the Wolfe conditions
compare values of one function, and y = g_{k+1} - g_k is a difference of gradients of one function, so it holds the
curvature rather than the noise between two samples (multi-batch L-BFGS, Berahas, Nocedal and Takac 2016). It
changes from one iteration to the next, so that the run sees the whole training set (a sample fixed for the run
would be L-BFGS on B batches: it fits them, not the data). The price is one evaluation more per iteration: the new
sample's gradient at the point the last one ended at. An iteration thus takes 2 evaluations (2B batches) when its
line search takes the step of 1, which it mostly does.

What of the solver applies: the net, weight_decay (L2 only: L1 is not differentiable at 0), each parameter's
decay_mult, lr_mult 0 (the parameter stays fixed: its gradient is taken as 0), random_seed, test_iter/interval,
snapshot, snapshot_prefix, display; max_iter counts L-BFGS iterations (each 2 or more evaluations of B batches).
The rest does not: L-BFGS picks its own steps, so base_lr, lr_policy, momentum, the solver type, other lr_mult
values, clip_gradients and iter_size are not used. Snapshots are Caffe's .caffemodel of x with a .solverstate that
holds the iteration (and an SGD history of zeros): the (s, y) pairs are not in it. `--snapshot` resumes from x and
the iteration there, with no pairs (a restart, as after a failed line search) and sample k, where the data would
have been; the data layers read from the start again to get there. There is no --resume from Redis, as the
data-parallel master has: the pairs and the line search live in this process only, so a coordinator that died is
started again from a snapshot.

An evaluation's f, g that are NaN or Inf at the point an iteration starts from are refused: the job stops with one
line and a snapshot of x, the last finite point. Inside a line search a point where they are not finite only
counts as a step too long.
"""
import dataclasses
import logging
import math
import secrets
import time

import numpy as np
from google.protobuf import text_format

from ... import common
from ...errors import DivergedError, PycaffeDistError, StoreError
from ...net import partition as net_cuts
from ...solver import lbfgs
from ...solver.solver import Solver
from ...solver.training_log import caffe_number
from .. import job as jobs
from .. import wire
from ..coordinator import Coordinator
from ..settings import JsonSettings
from .keys import SPEC, SandblasterStore

log = logging.getLogger("pycaffe_dist.solver")
POLL_S = 0.2
MEMORY, SAMPLE_BATCHES, UNIT_BATCHES = 10, 32, 1


@dataclasses.dataclass
class Settings(JsonSettings):
    """What the coordinator is told (as JSON by the one-machine launcher)."""
    SOURCE = "sandblaster settings"
    workers: int = 1
    memory: int = MEMORY
    sample_batches: int = SAMPLE_BATCHES
    unit_batches: int = UNIT_BATCHES

    def check(self):
        """One line for a setting out of range, before anything starts."""
        for flag, value in (("--workers", self.workers), ("--lbfgs-memory", self.memory),
                            ("--sample-batches", self.sample_batches), ("--unit-batches", self.unit_batches)):
            if value is None or value < 1:
                raise PycaffeDistError("%s must be at least 1, got %s" % (flag, value))
        if self.unit_batches > self.sample_batches:
            raise PycaffeDistError("--unit-batches %d is more than a sample (--sample-batches %d): a unit is a part "
                                   "of a sample" % (self.unit_batches, self.sample_batches))
        return self


class Evaluation:
    """One evaluation in progress: its units not yet summed (and who took each), and the sums so far."""

    def __init__(self, number, units, size):
        self.number = number
        self.units = {u["unit"]: u for u in units}
        self.pending, self.holders = set(self.units), {}
        self.gradient = np.zeros(size, np.float64)
        self.loss, self.batches = 0.0, 0


class SandblasterMaster(Coordinator):
    store_class = SandblasterStore
    kind = "sandblaster"

    def __init__(self, settings):
        common.set_num_threads(settings.threads)
        self.settings = settings.check()
        param = self._solver_param(settings)
        if param.weight_decay and param.regularization_type != "L2":
            raise PycaffeDistError("%s: regularization_type %s is not differentiable at 0: L-BFGS needs a smooth "
                                   "objective (use L2, or weight_decay 0)" % (settings.solver,
                                                                              param.regularization_type))
        self.param = param
        self.solver = Solver(param)
        if settings.snapshot:
            self.solver.restore(settings.snapshot, data_position=False)
        self.count = self.solver.position[0]
        net = self.solver.train_net
        self.names, self.shapes = self.solver.weight_names(), self.solver.weight_shapes
        sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.bounds = list(zip(np.cumsum([0] + sizes[:-1]).tolist(), np.cumsum(sizes).tolist()))
        self.x = np.concatenate([w.reshape(-1) for w in self.solver.weights]).astype(np.float32)
        # weight decay per element (the solver's, times each blob's decay_mult), and the blobs that stay fixed (lr_mult
        # 0: Caffe never moves them)
        self.decay = np.zeros(self.x.size, np.float32)
        self.fixed = np.zeros(self.x.size, bool)
        for (a, b), decay_mult, lr_mult in zip(self.bounds, net.params_weight_decay, net.params_lr):
            self.fixed[a:b] = lr_mult == 0
            self.decay[a:b] = 0 if lr_mult == 0 else param.weight_decay * decay_mult     # a constant: left out
        self.batch = self.solver.images_per_iteration // max(1, param.iter_size)
        self.optimizer = lbfgs.LBFGS(settings.memory)
        options = {"lbfgs_memory": settings.memory, "sample_batches": settings.sample_batches,
                   "unit_batches": settings.unit_batches}
        self.spec = dict(jobs.make_spec(param, "sandblaster", options, self.names, self.shapes, settings.heartbeat_s,
                                        settings.workers),
                         kind=SPEC.name, net=text_format.MessageToString(net_cuts.stage_net_param(net, 1)),
                         feed=text_format.MessageToString(net_cuts.feed_net_param(net)),
                         state=text_format.MessageToString(net.state), start=self.count,
                         seed=param.random_seed if param.random_seed >= 0 else secrets.randbelow(1 << 31))
        self._open_job(settings, param)
        self.members = {}               # live workers: id -> what they said when ready
        self.counts = {}                # id -> {"units", "batches", "compute_s", "pushes"}
        self.evaluation, self.evaluations, self.batches_done = None, 0, 0
        self.scratch = np.empty(self.x.size, np.float32)
        self.last_message = time.monotonic()
        self.last_housekeeping = 0.0
        self.slowest_unit_s = 0.0
        self.lbfgs_events = {"skipped": 0, "restarts": 0, "failed": 0}

    def views(self, flat):
        """The blobs' arrays as views of a flat vector."""
        return [flat[a:b].reshape(s) for (a, b), s in zip(self.bounds, self.shapes)]

    # --- the loop ------------------------------------------------------------------------------------------------

    def _begin(self):
        self.store.publish_job(self.spec)
        self.store.master_heartbeat(self.settings.heartbeat_s)
        log.info("Sandblaster L-BFGS: %d pairs of memory; samples of %d batches of %d images, in units of %d "
                 "batches; learning rates, momentum and the lr policy do not apply", self.settings.memory,
                 self.settings.sample_batches, self.batch, self.settings.unit_batches)

    def _serve(self):
        self._wait_for_workers()
        self._train()

    def _wait_for_workers(self):
        while len(self.members) < self.settings.workers:
            for message in self.store.next_messages(POLL_S, 64, wire.SANDBLASTER_INBOX):
                self._handle(message)
            self._housekeeping()
            if time.monotonic() - self.started_at > self.settings.join_timeout_s:
                if not self.members:
                    raise StoreError("job %s: no worker ready after %.0f s" % (self.job,
                                                                              self.settings.join_timeout_s))
                log.warning("Starting with the %d of %d workers ready after %.0f s", len(self.members),
                            self.settings.workers, self.settings.join_timeout_s)
                break
        self.started = True
        self.started_at = self.display_at = time.monotonic()
        log.info("Starting: %d workers ready", len(self.members))

    def _train(self):
        p = self.param
        if p.test_interval and p.test_initialization and self.count == 0:
            self._test()
        while self.count < p.max_iter and not self.stop_requested:
            # The sample of iteration k: its gradient at x first, then the line search's points.
            sample = self.count * self.settings.sample_batches
            f, g = self._objective(self.x, sample)
            if not (math.isfinite(f) and np.isfinite(g).all()):
                raise DivergedError("the loss or its gradient at the weights of iteration %d is NaN or Inf (f = %g)"
                                    % (self.count, f))
            step = self.optimizer.iterate(self.x, f, g, lambda point: self._objective(point, sample))
            if step.moved and not np.isfinite(step.x).all():
                raise DivergedError("the step of iteration %d overflowed the weights" % self.count)
            self._report(f, step)
            self.x = step.x
            self.count += 1
            if p.snapshot and self.count % p.snapshot == 0:
                self._snapshot()
            if p.test_interval and self.count % p.test_interval == 0 and self.count < p.max_iter:
                self._test()
        self._finish()

    def _report(self, f, step):
        it, p = self.count, self.param
        if step.restarted:
            self.lbfgs_events["restarts"] += 1
            log.info("Iteration %d: %s; L-BFGS restarts (its pairs cleared)", it, step.why)
        if not step.moved:
            self.lbfgs_events["failed"] += 1
            log.info("Iteration %d: no step (%s); x stays, the next sample is tried", it, step.why)
        elif step.curvature is None and not step.restarted:
            self.lbfgs_events["skipped"] += 1
            log.info("Iteration %d: pair skipped: s'y <= %g |s| |y| (no curvature to store)", it,
                     self.optimizer.pairs.eps)
        self._add_loss(step.f)
        if p.display and it % p.display == 0:
            now = time.monotonic()
            lapse, self.display_at = now - self.display_at, now
            self._display(it, p.display if it else 0, lapse)
            log.info("Iteration %d, step = %s, evaluations = %d (%d in all), pairs = %d, loss at the start = %s",
                     it, caffe_number(np.float32(step.step)), step.evaluations + 1, self.evaluations,
                     len(self.optimizer.pairs), caffe_number(np.float32(f)))
            log.info("Workers: %s", self.workers_text())

    # --- evaluations ---------------------------------------------------------------------------------------------

    def _objective(self, x, sample):
        """f(x) and g(x) over the sample that starts at batch `sample`, with the L2 weight decay; g is 0 on the
        parameters that stay fixed."""
        loss, gradient = self._evaluate(x, sample)
        with np.errstate(over="ignore", invalid="ignore"):
            f = loss + 0.5 * float(np.dot(self.decay * x, x))
            g = gradient + self.decay * x
        g[self.fixed] = 0
        return f, g

    def _evaluate(self, x, sample):
        """The mean loss and gradient at x over the sample's B batches: the units out on the queue, their sums in."""
        self.evaluations += 1
        number = self.evaluations
        self.store.put_weights(self.views(x), number, self.count)
        B, b = self.settings.sample_batches, self.settings.unit_batches
        units = [{"type": "unit", "eval": number, "unit": u, "first": sample + first, "count": min(b, B - first),
                  "sample": sample}
                 for u, first in enumerate(range(0, B, b))]
        self.evaluation = Evaluation(number, units, x.size)
        self.store.hand_out(units)
        self.last_message = time.monotonic()
        while self.evaluation.pending:
            for message in self.store.next_messages(POLL_S, 64, wire.SANDBLASTER_INBOX):
                self._handle(message)
            if time.monotonic() - self.last_housekeeping > 0.25:
                self._housekeeping()
        done, self.evaluation = self.evaluation, None
        self.batches_done += done.batches
        return done.loss / done.batches, (done.gradient / done.batches).astype(np.float32)

    def _hand_out_again(self, units, why):
        e = self.evaluation
        if units:
            log.warning("Units %s of evaluation %d handed out again: %s", ", ".join(map(str, sorted(units))),
                        e.number, why)
            for u in units:
                e.holders.pop(u, None)
            self.store.hand_out([e.units[u] for u in sorted(units)])

    def _handle(self, message):
        """One message of the inbox, checked by the store (wire.SANDBLASTER_INBOX)."""
        self.last_message = time.monotonic()
        kind, worker = message["type"], message["worker"]
        e = self.evaluation
        if kind == "error":
            raise PycaffeDistError("worker %s: %s" % (worker, message.get("error")))
        if kind in ("taken", "sums") and message["eval"] > self.evaluations:
            self.store.refuse("%s: a %s message from worker %s for evaluation %d, which has not begun (%d is the "
                              "latest)" % (self.store.key("inbox"), kind, worker, message["eval"], self.evaluations))
            return
        if kind == "ready":
            self._joined(worker, message)
        elif kind == "leave":
            if message.get("error"):
                log.warning("Worker %s left: %s", worker, message["error"])
            self.members.pop(worker, None)
            if e is not None:
                self._hand_out_again({u for u in e.pending if e.holders.get(u) == worker}, "worker %s left" % worker)
        elif kind == "taken":
            self._joined(worker, message)
            if e is not None and message["eval"] == e.number and message["unit"] in e.pending:
                e.holders[message["unit"]] = worker
        elif kind == "sums":
            self._joined(worker, message)
            self._summed(worker, message)

    def _joined(self, worker, message):
        """A worker heard from: counted in (again, if its heartbeat had lapsed)."""
        if worker not in self.members:
            info = {k: message[k] for k in ("host", "address", "pid") if message.get(k) is not None}
            self.members[worker] = info
            self.counts.setdefault(worker, {"units": 0, "batches": 0, "pushes": 0, "compute_s": 0.0})
            self.store.add_member(worker, info)
            if message.get("type") == "ready":
                log.info("Worker %s ready on %s%s (pid %s)", worker, info.get("host", "?"),
                         " at " + info["address"] if "address" in info else "", info.get("pid", "?"))

    def _summed(self, worker, message):
        """A push of sums: added when every unit in it is still wanted; otherwise (some were summed already, from
        a copy handed out again) dropped whole, since a sum cannot be taken apart, and its other units go out
        again."""
        e, units = self.evaluation, message["units"]
        if e is None or message["eval"] != e.number:
            self.store.reply_to(worker, {"status": "ack"})
            return
        if not set(units) <= e.pending:
            self.store.reply_to(worker, {"status": "ack"})
            self._hand_out_again({u for u in units if u in e.pending and e.holders.get(u) in (None, worker)},
                                 "worker %s's sums held units summed already" % worker)
            return
        try:
            read = self.store.get_sums(worker, self.shapes, out=self.views(self.scratch))
            problem = None if read is not None else "it has none on Redis"
        except wire.DamagedData as exc:
            problem = str(exc)
        self.store.reply_to(worker, {"status": "ack"})         # (it pushes on; what it held is handed out again)
        if problem is not None:
            self.store.refuse("%s: sums from worker %s not added: %s" % (self.store.key("inbox"), worker, problem))
            self._hand_out_again({u for u in units if e.holders.get(u) in (None, worker)},
                                 "worker %s's sums were not readable" % worker)
            return
        e.gradient += self.scratch
        e.loss += message["loss"]
        e.batches += message["batches"]
        e.pending -= set(units)
        counts = self.counts[worker]
        counts["units"] += len(units)
        counts["batches"] += message["batches"]
        counts["pushes"] += 1
        counts["compute_s"] += message.get("compute_s", 0.0)
        if units:
            self.slowest_unit_s = max(self.slowest_unit_s, message.get("compute_s", 0.0) / len(units))

    def _housekeeping(self):
        self.last_housekeeping = time.monotonic()
        self.store.master_heartbeat(self.settings.heartbeat_s)
        self.store.put_progress(self.progress())
        ids = list(self.members)
        e = self.evaluation
        for worker, alive in zip(ids, self.store.workers_alive(ids)):
            if not alive:
                log.warning("Worker %s has no heartbeat for %g s: counted out", worker, self.settings.heartbeat_s)
                del self.members[worker]
                if e is not None:
                    self._hand_out_again({u for u in e.pending if e.holders.get(u) == worker},
                                         "worker %s is gone" % worker)
        if e is not None:
            # A unit taken from the queue by a worker that went before it could say so: nobody holds it, and nothing
            # has been heard for far longer than a unit takes.
            quiet = time.monotonic() - self.last_message
            if quiet > max(3 * self.settings.heartbeat_s, 10 * self.slowest_unit_s):
                self.last_message = time.monotonic()
                self._hand_out_again({u for u in e.pending if u not in e.holders},
                                     "nothing heard for %.0f s and nobody holds them" % quiet)
            if not self.members and quiet > self.settings.join_timeout_s:
                raise StoreError("job %s: no worker left for %.0f s" % (self.job, self.settings.join_timeout_s))

    # --- tests, snapshots, the end -------------------------------------------------------------------------------

    def _test(self):
        self._test_weights(self.views(self.x), self.count)

    def _snapshot(self):
        self.solver.set_weights(self.views(self.x))
        self.solver.set_position(self.count, 0)
        model, _ = self.solver.snapshot_at(self.count)
        self._snapshotted(model)
        return model

    def _finish(self):
        p = self.param
        stopped_early = self.count < p.max_iter
        if p.snapshot_after_train and (not p.snapshot or self.count % p.snapshot != 0):
            self._snapshot()
        if not stopped_early:
            self._test()
        if self.tester is not None:
            self.tester.wait()
        log.info("Optimization %s after %d iterations (%d evaluations, %d batches of %d images).",
                 "stopped" if stopped_early else "Done", self.count, self.evaluations, self.batches_done, self.batch)
        log.info("Workers: %s", self.workers_text())
        self._end(failed=False)

    def _diverged(self, exc):
        """Keep x, the last finite point, on disk; stop the workers, leave no key; one line, non-zero exit."""
        model = self._snapshot()
        self._end(failed=True, why="training diverged")
        raise DivergedError("training diverged in mode sandblaster at iteration %d: %s; the last finite weights are "
                            "in %s (the line search takes only finite points of its own sample: a new sample gave "
                            "this one; check the data, or give a larger --sample-batches)" % (self.count, exc, model)) \
            from None

    def _end(self, failed, why=None):
        """Tell the workers to stop (with `why`, a failure), wait a little for them to go, write the stats, remove
        the job's keys."""
        try:
            jobs.end_job(self.store, list(self.counts), list(self.counts), 2.0 if failed else 10.0,
                         self.settings.stats_path, self.summary, self.settings.keep, why)
        except StoreError:
            if not failed:
                raise

    # --- reporting -----------------------------------------------------------------------------------------------

    def workers_text(self):
        return ", ".join("%s %d units" % (w, c["units"]) for w, c in sorted(self.counts.items(), key=lambda kv:
                                                                             int(kv[0]) if kv[0].isdigit() else 0))

    def idle_share(self, elapsed):
        """The share of the workers' time spent not computing units: waiting for the next evaluation (while the
        master runs the two-loop recursion and hands out the units), pulling x, pushing sums, reading batches."""
        busy = sum(c["compute_s"] for c in self.counts.values())
        return max(0.0, 1.0 - busy / (elapsed * len(self.counts))) if self.counts and self.started else 0.0

    def progress(self):
        elapsed = max(1e-9, time.monotonic() - self.started_at)
        return self.progress_of(self.count, {w: c["batches"] * self.batch / elapsed for w, c in self.counts.items()},
                                idle_share=self.idle_share(elapsed))

    def summary(self):
        return dict(self.progress(), evaluations=self.evaluations, batches=self.batches_done,
                    images=self.batches_done * self.batch, tests=self.test_results, units=self.counts,
                    restarts=self.lbfgs_events["restarts"], skipped_pairs=self.lbfgs_events["skipped"],
                    refused_messages=self.store.refused,
                    options=self.spec["options"],
                    # a worker's push per evaluation: its sums, float32 (as the data-parallel modes' results)
                    bytes_per_result=self.x.nbytes, float32_bytes_per_result=self.x.nbytes)
