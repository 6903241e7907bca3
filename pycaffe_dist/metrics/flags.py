"""The metrics flags of the command line (`train --tensorboard DIR`, `--metrics-port P`, `--metrics-host H`) and
what they open for each kind of run, for as long as it trains: a one-process run's solver is watched through its
observers and iteration hooks; a job launched on this machine (`train --workers N`, and every other kind the
launcher runs) through the master's progress records, as the launcher's progress line reads them, and its summary at
the end; a master process (`dist_caffe master`, `allreduce-master`, ...) serves its own record, read from Redis.
A missing package or a bad port is one line before anything starts (check)."""
import contextlib
import importlib
import json
import os
import tempfile

from ..errors import PycaffeDistError

# (the modules of the metrics themselves are imported where a flag asks for them: every verb imports this one)
DEFAULT_HOST = "127.0.0.1"


def add_serving_flags(parser):
    """--metrics-port and --metrics-host."""
    parser.add_argument("--metrics-port", type=int, metavar="PORT", help="serve the run's figures (iteration, loss, "
                        "images/s, tests, workers, exchange share) to Prometheus at http://HOST:PORT/metrics (0: a "
                        "free port, said on stderr; needs prometheus-client)")
    parser.add_argument("--metrics-host", default=DEFAULT_HOST, metavar="HOST", help="the address --metrics-port "
                        "listens on (default %s: this machine only; the endpoint has no authentication)"
                        % DEFAULT_HOST)


def add_train_flags(parser):
    """`train`'s: --tensorboard and the serving flags."""
    parser.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard event files into DIR while training: "
                        "loss, lr, images/s, every test output; distributed: each worker's rate, the exchange share, "
                        "staleness (needs tensorboardX)")
    add_serving_flags(parser)


def check(args):
    """One line, before anything starts, where a flag given needs a package that is missing or a port is out of
    range."""
    if getattr(args, "tensorboard", None):
        try:
            importlib.import_module("tensorboardX")
        except ImportError:
            raise PycaffeDistError("--tensorboard needs tensorboardX: pip install tensorboardX") from None
    port = getattr(args, "metrics_port", None)
    if port is not None:
        if not 0 <= port <= 65535:
            raise PycaffeDistError("--metrics-port must be a TCP port (0 to 65535), got %d" % port)
        from .prometheus import check_available
        check_available()


@contextlib.contextmanager
def watching_solver(args, solver):
    """A one-process run's --tensorboard and --metrics-port, while `solver` trains in the block."""
    from .record import SolverRecord
    writer = server = None
    try:
        if args.tensorboard:
            from .tensorboard import SolverScalars, open_writer
            writer = open_writer(args.tensorboard)
            solver.observers.append(SolverScalars(writer, solver.images_per_iteration))
        if args.metrics_port is not None:
            from .prometheus import MetricsServer
            server = MetricsServer(args.metrics_port, args.metrics_host, SolverRecord(solver, solver.max_iter).get)
        yield
    finally:
        if server is not None:
            server.close()
        if writer is not None:
            writer.close()


@contextlib.contextmanager
def job_summary(args):
    """A launched job with --tensorboard and no --stats: the master's summary (every test, where the records show
    only the last) goes to a temporary --stats file, read by watching_job at the end and removed after the block."""
    if not getattr(args, "tensorboard", None) or args.stats:
        yield
        return
    handle, args.stats = tempfile.mkstemp(prefix="dist_caffe-summary-", suffix=".json")
    os.close(handle)
    try:
        yield
    finally:
        os.remove(args.stats)
        args.stats = None


@contextlib.contextmanager
def watching_job(args, show=None):
    """A launched job's --tensorboard and --metrics-port: yields the progress callback for the launcher, which hands
    each record to `show` (the progress line, or None) and to them (`show` itself where neither flag is given)."""
    tensorboard = getattr(args, "tensorboard", None)
    port = getattr(args, "metrics_port", None)
    if not tensorboard and port is None:
        yield show
        return
    writer = server = scalars = None
    sinks = [show] if show is not None else []
    try:
        if tensorboard:
            from .tensorboard import JobScalars, open_writer
            writer = open_writer(tensorboard)
            scalars = JobScalars(writer)
            sinks.append(scalars)
        if port is not None:
            from .prometheus import MetricsServer
            from .record import Latest
            latest = Latest()
            server = MetricsServer(port, args.metrics_host, latest.get)
            sinks.append(latest)

        def progress(record):
            for sink in sinks:
                sink(record)
        yield progress
        if scalars is not None:
            scalars.finish(_summary(args.stats))
    finally:
        if server is not None:
            server.close()
        if writer is not None:
            writer.close()


def _summary(path):
    """The master's summary (its --stats JSON), or None where it wrote none (a job that failed early)."""
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def serving_job(args, urls, job):
    """A master process's --metrics-port: its job's progress record, read from Redis at each scrape, served while
    the block runs."""
    if getattr(args, "metrics_port", None) is None:
        yield
        return
    from .prometheus import MetricsServer
    from .record import RedisRecord
    server = MetricsServer(args.metrics_port, args.metrics_host, RedisRecord(urls, job))
    try:
        yield
    finally:
        server.close()
