"""`train --tensorboard DIR`: a run's figures as TensorBoard event files (through tensorboardX), written while it
runs, so TensorBoard shows the curves live.

One process: the figures of Caffe's log lines, when they are logged (SolverScalars, a Solver observer): at each
display train/loss (the smoothed loss), train/lr, train/images_per_s and the train net's outputs
(train_output/NAME); at each test test{N}/NAME for every output of test net N (test0/accuracy). The step is the
iteration of the line. Distributed (JobScalars): the master's progress records as the launcher reads them, the step
the job's count (merges, or iterations): train/loss, train/images_per_s, each worker's workers/ID/images_per_s,
job/workers, job/merges_per_s, its share figure (job/exchange_share, or job/idle_share), the staleness where the
mode has one (job/mean_staleness) and the tests; at the end the master's summary adds the tests the records
showed too briefly to be seen (a record holds the last test only)."""
from ..errors import PycaffeDistError
from ..solver.solver import SolverObserver
from . import record as records

FLUSH_S = 2             # how stale the event files may be (tensorboardX's default, 120 s, is not live)


def open_writer(logdir):
    """A tensorboardX SummaryWriter on `logdir`; one line where tensorboardX is missing or the folder cannot be
    written."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise PycaffeDistError("--tensorboard needs tensorboardX: pip install tensorboardX") from None
    try:
        return SummaryWriter(logdir, flush_secs=FLUSH_S)
    except OSError as exc:
        raise PycaffeDistError("--tensorboard %s: cannot write the event files there: %s"
                               % (logdir, exc.strerror or exc)) from None


def output_tags(prefix, outputs):
    """(tag, value) of each (index, name, value) of a net's outputs: prefix/name, or prefix/name/index where the
    name is an output of several elements (Caffe numbers them on, one line each)."""
    names = [name for _, name, _ in outputs]
    return [("%s/%s" % (prefix, name) if names.count(name) == 1 else "%s/%s/%d" % (prefix, name, index), value)
            for index, name, value in outputs]


class SolverScalars(SolverObserver):
    """A one-process run's log lines as scalars (see the module's notes)."""

    def __init__(self, writer, images_per_iteration):
        self.writer, self.images = writer, images_per_iteration

    def displayed(self, solver, iteration, loss, rate, iters_per_s, outputs):
        add = self.writer.add_scalar
        add("train/loss", loss, iteration)
        if rate is not None:
            add("train/lr", rate, iteration)
        if iters_per_s:             # (none at a first display, which has no iterations behind it: Caffe's 0 iter/s)
            add("train/images_per_s", iters_per_s * self.images, iteration)
        for tag, value in output_tags("train_output", outputs):
            add(tag, value, iteration)

    def tested(self, solver, test_net_id, iteration, outputs):
        for tag, value in output_tags("test%d" % test_net_id, outputs):
            self.writer.add_scalar(tag, value, iteration)


class JobScalars:
    """A distributed job's progress records as scalars (see the module's notes): call it with each record, then
    finish(summary) with the master's summary (or None)."""

    def __init__(self, writer):
        self.writer = writer
        self.last_count = None
        self.tests_seen = set()                     # (iteration, test net) written

    def __call__(self, record):
        if not isinstance(record, dict) or not record.get("started"):
            return
        self._tests(record)
        count = record.get("count")
        if not isinstance(count, int) or count == self.last_count:
            return                                  # (the launcher reads the record more often than it changes)
        self.last_count = count
        self._figures(record, count)

    def _figures(self, record, step):
        add = self.writer.add_scalar
        loss = records.figure(record, "loss")
        if loss is not None:
            add("train/loss", loss, step)
        total = records.images_per_s(record)
        if total is not None:
            add("train/images_per_s", total, step)
        rates = records.worker_rates(record)
        for worker, rate in sorted(rates.items()):
            add("workers/%s/images_per_s" % worker, rate, step)
        add("job/workers", len(rates), step)
        elapsed = records.figure(record, "elapsed_s")
        if elapsed:
            add("job/merges_per_s", step / elapsed, step)
        for field in ("exchange_share", "idle_share", "mean_staleness"):
            value = records.figure(record, field)
            if value is not None:
                add("job/%s" % field, value, step)

    def _tests(self, record):
        for entry in records.tests_of(record):
            key = (entry["iter"], entry["net"])
            if key in self.tests_seen:
                continue
            self.tests_seen.add(key)
            for name, value in sorted(entry["scores"].items()):
                self.writer.add_scalar("test%d/%s" % (entry["net"], name), value, entry["iter"])

    def finish(self, summary):
        """The master's summary (its --stats): the tests not seen in a record, and its last figures."""
        if not isinstance(summary, dict):
            return
        self._tests(summary)
        count = summary.get("count")
        if isinstance(count, int) and count != self.last_count:
            self.last_count = count
            self._figures(summary, count)
