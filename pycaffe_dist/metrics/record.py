"""Progress records: the figures of a run, in one shape for every kind of run, so that TensorBoard (tensorboard.py)
and Prometheus (prometheus.py) show what the progress line and `dist_caffe status` show, and nothing measured apart.

A distributed job's master writes its record to Redis a few times a second (Coordinator.progress_of: job, mode,
count, max_iter, loss, started, elapsed_s, workers {id: images/s}, the last test, its share figure; each kind adds
its own, such as the data-parallel staleness); the launcher of `train --workers N` reads it for its progress line.
A one-process run has no such record: SolverRecord makes one of the same fields from its solver. A record read
from Redis is not trusted: the readers here take a figure only where it is a number (figure())."""
import time

from ..solver.solver import SolverObserver


def figure(record, field):
    """record[field] as a float, or None where it is absent or no number (a damaged or forged record)."""
    value = record.get(field) if isinstance(record, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def worker_rates(record):
    """{worker id: images/s} of a record, numbers only."""
    workers = record.get("workers")
    if not isinstance(workers, dict):
        return {}
    return {str(w): float(r) for w, r in workers.items() if isinstance(r, (int, float)) and not isinstance(r, bool)}


def images_per_s(record):
    """The run's images per second: its own figure where it has one (a one-process run), else its workers' summed;
    a pipeline's stages all pass the same images, so there it is one stage's."""
    own = figure(record, "images_per_s")
    if own is not None:
        return own
    rates = worker_rates(record)
    if not rates:
        return None
    return max(rates.values()) if record.get("mode") == "pipeline" else sum(rates.values())


def tests_of(record):
    """The test entries ({iter, net, scores {output: mean}}) of a record or a summary: every one where it lists them
    (`tests`: all-reduce's record, every summary), else its last (`test`)."""
    found = record.get("tests") if isinstance(record, dict) else None
    if not isinstance(found, list):
        last = record.get("test") if isinstance(record, dict) else None
        found = [last] if last is not None else []
    entries = []
    for entry in found:
        if isinstance(entry, dict) and isinstance(entry.get("iter"), int) and isinstance(entry.get("scores"), dict):
            scores = {str(k): float(v) for k, v in entry["scores"].items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)}
            net = entry.get("net") if isinstance(entry.get("net"), int) else 0
            entries.append({"iter": entry["iter"], "net": net, "scores": scores})
    return entries


class Latest:
    """The newest record handed to it (the launcher's progress callback), for a reader on another thread (a
    scrape): a reference, replaced whole, so a reader never sees one half-written."""

    def __init__(self):
        self.record = None

    def __call__(self, record):
        if isinstance(record, dict):
            self.record = record

    def get(self):
        return self.record


class SolverRecord(SolverObserver):
    """A one-process run's progress record, kept by its solver: after each update (an iteration hook) the
    iteration, the smoothed loss, the rate and the images/s since the run began (as training_log.Progress counts
    them); after each test (an observer) that test net's means. `get()` is the record, replaced whole each time."""

    def __init__(self, solver, max_iter):
        self.images = solver.images_per_iteration
        self.first_iter = self.start = None
        self.tests = {}                                     # test net id -> its last test's entry
        self.record = {"job": None, "mode": "single", "count": solver.iter, "max_iter": max_iter, "loss": None,
                       "started": True, "elapsed_s": 0.0, "tests": []}
        solver.iteration_hooks.append(self.iterated)
        solver.observers.append(self)

    def iterated(self, solver):
        now = time.perf_counter()
        if self.first_iter is None:
            self.first_iter, self.start = solver.iter - 1, now - 1e-9
        per_s = (solver.iter - self.first_iter) / (now - self.start)
        self.record = dict(self.record, count=solver.iter, loss=float(solver.smoothed_loss), lr=float(solver.rate),
                           images_per_s=per_s * self.images, elapsed_s=now - self.start)

    def tested(self, solver, test_net_id, iteration, outputs):
        self.tests[test_net_id] = {"iter": iteration, "net": test_net_id,
                                   "scores": {name: mean for _, name, mean in outputs}}
        self.record = dict(self.record, tests=[self.tests[k] for k in sorted(self.tests)])

    def get(self):
        return self.record


class RedisRecord:
    """A master process's own record as it last wrote it to Redis, read at each call (a scrape) on a connection of
    its own, so that nothing of the master's loop is shared with the scrape's thread; where Redis does not answer,
    the last record read."""
    RETRY_S = 2.0                   # a scrape waits this long for Redis, not the job's --redis-retry

    def __init__(self, urls, job):
        self.urls, self.job = urls, job
        self.store = self.last = None

    def __call__(self):
        from ..distributed.store import Store
        from ..errors import StoreError
        try:
            if self.store is None:
                self.store = Store(self.urls, self.job, retry_s=self.RETRY_S)
            found = self.store.progress()
        except StoreError:
            found = None
        if isinstance(found, dict):
            self.last = found
        return self.last
