"""The coordinating side of every kind of job, written once: the data-parallel master (master.py), Sandblaster's
(sandblaster_master.py) and the pipeline's (pipeline_master.py) are Coordinators.

What they share: the job id and the store, with the job's lease taken (one master per job) and a job of that id
refused; the tester of the TEST nets and its scores; the last ten snapshots; the training loss averaged as Caffe
averages it (average_loss) and its display line; the frame of a run (stop signals caught, begin, serve, and on any
failure the kind's end with the failure said to its processes); the fields every progress report has.

What a kind fills in:
  kind              its name in the progress reports ("pipeline", "sandblaster"; a data-parallel job: its mode)
  _begin()          publish the job and say so
  _serve()          its loop, until done or asked to stop, then its finish (snapshot, test, stop its processes)
  _failed(exc)      a failure's end: by default _end(failed=True, why), the failure said to every process
  _diverged(exc)    NaN or Inf: snapshot the last finite state, end, raise DivergedError
  _end(failed, why) stop its processes, write the stats, remove the job's keys (unless --keep)
"""
import logging
import os
import time

import numpy as np

from ..errors import DivergedError, PycaffeDistError, StoreError
from ..io.load import read_solver
from ..solver.training_log import caffe_number
from . import job as jobs
from . import stop_signals
from .redis_client import describe
from .store import Store
from .tester import Tester

log = logging.getLogger("pycaffe_dist.solver")
SNAPSHOTS_KEPT = 10             # the snapshots a progress report lists (the newest)


def failure_text(exc):
    """What a coordinator's processes are told when it fails: our own errors' line, or the kind of a bug."""
    return str(exc) if isinstance(exc, PycaffeDistError) else "the master stopped (%s)" % type(exc).__name__


class Coordinator(stop_signals.StopRequests):
    kind = None
    store_class = Store                 # the job's store, with the keys of this kind's protocol

    @staticmethod
    def _solver_param(settings):
        """The solver the settings name, its nets inlined (the job's spec carries them), with the --weights and
        --max-iter given over its own."""
        param = jobs.inline_nets(read_solver(settings.solver))
        if settings.weights:
            param.ClearField("weights")
            param.weights.append(settings.weights)
        if settings.max_iter is not None:
            param.max_iter = settings.max_iter
        return param

    def _open_job(self, settings, param, existing_hint="choose another --job", tests=True):
        """The job's id (given, or made from the solver's name), its store, its lease, its tester (`tests`: where the
        coordinator tests) and what every coordinator keeps; a job of that id already on Redis is refused."""
        self.param = param
        self.job = settings.job or jobs.new_job_id(os.path.splitext(os.path.basename(settings.solver))[0])
        self.store = self.store_class(settings.redis, self.job, settings.retry_s)
        self.store.claim_master(settings.heartbeat_s)
        if self.store.job_spec() is not None:
            self.store.release_master()
            raise StoreError("job %s already exists on %s (%s)" % (self.job, describe(self.store.urls[0]),
                                                                   existing_hint))
        self._keep_records(param, tests)

    def _keep_records(self, param, tests=True):
        """The tester (unless not `tests`), the test results, the snapshots, the losses and the clocks of a
        coordinator."""
        self.param = param
        self.tester = Tester(param, self._scored) if tests and (param.test_interval or param.test_iter) else None
        self.test_results, self.snapshots, self.losses = [], [], []
        self.started = False
        self.started_at = self.display_at = time.monotonic()

    # --- the frame of a run -----------------------------------------------------------------------------------------

    def run(self):
        """Begin, serve until done (or a stop request), finish; the summary. Any failure ends the job the kind's
        way, its processes told why (a DivergedError: with the last finite state on disk)."""
        restore = stop_signals.catch(self._request_stop)
        try:
            self._begin()
            self._serve()
        except DivergedError as exc:
            self._diverged(exc)
        except BaseException as exc:
            self._failed(exc)
            raise
        finally:
            restore()
        return self.summary()

    def _failed(self, exc):
        self._end(failed=True, why=failure_text(exc))

    def _diverged(self, exc):
        """NaN or Inf (a kind that keeps a last finite state overrides this): the job ends as on any failure."""
        self._failed(exc)
        raise exc

    # --- tests, snapshots, the loss ---------------------------------------------------------------------------------

    def _test_weights(self, weights, count):
        """Score `weights` (of iteration or merge `count`) on the tester's thread, while the job goes on."""
        if self.tester is not None:
            self.tester.start(weights, count)

    def _scored(self, iteration, scores):
        """The tester's scores at `iteration` (on the tester's thread)."""
        for i, net_scores in enumerate(scores):
            self.test_results.append({"iter": iteration, "time_s": time.monotonic() - self.started_at,
                                      "net": i, "scores": dict(net_scores)})

    def _snapshotted(self, model):
        self.snapshots = (self.snapshots + [os.path.abspath(model)])[-SNAPSHOTS_KEPT:]

    def _add_loss(self, loss):
        """One iteration's (or merge's) loss, into Caffe's average of the last average_loss."""
        self.losses = (self.losses + [loss])[-max(1, self.param.average_loss):]

    def mean_loss(self):
        return float(np.mean(self.losses)) if self.losses else None

    def _display(self, iteration, iterations, lapse):
        """Caffe's display line (`dist_caffe plot` reads it): `iterations` done in `lapse` seconds."""
        log.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", iteration,
                 caffe_number(iterations / (lapse or 1)), caffe_number(lapse), self.param.display,
                 caffe_number(np.float32(np.mean(self.losses))))

    # --- reporting --------------------------------------------------------------------------------------------------

    def progress_of(self, count, workers, **shares):
        """What every kind's progress report holds; `workers`: id -> images/s; `shares`: its one share figure
        (exchange_share of a round, or idle_share of the workers' time)."""
        now = time.monotonic()
        return dict({"job": self.job, "mode": self.kind, "count": count, "max_iter": self.param.max_iter,
                     "loss": self.mean_loss(), "started": self.started, "elapsed_s": now - self.started_at,
                     "workers": workers, "test": self.test_results[-1] if self.test_results else None,
                     "snapshots": self.snapshots}, **shares)
