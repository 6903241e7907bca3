"""`--metrics-port P`: a run's progress record (record.py) served to Prometheus over HTTP (prometheus-client), read
afresh at every scrape, so a scrape sees what the progress line shows at that moment.

The metrics, all gauges, prefixed dist_caffe_: info{job, mode} (1), started, iteration (a data-parallel job's
merges), max_iter, loss (the smoothed loss), learning_rate (one process), images_per_second, elapsed_seconds,
worker_images_per_second{worker}, workers (those reporting: a pipeline's stages), exchange_share or idle_share,
mean_staleness (the modes that scale by it), and per test net test_iteration{net} and test_output{net, output}: the
last test of each net, kept across scrapes because a record holds only the job's last test.

The server listens on 127.0.0.1 unless --metrics-host says otherwise: the figures name the job and its hosts' rates,
and the endpoint has no authentication."""
import importlib
import sys
import threading

from ..errors import PycaffeDistError
from . import record as records

PREFIX = "dist_caffe_"
# (record field, metric name, help): the record's plain numbers
FIGURES = (("count", "iteration", "iterations done (a data-parallel job: merges)"),
           ("max_iter", "max_iter", "iterations (merges) the run trains for"),
           ("loss", "loss", "the training loss, smoothed as Caffe's display line (average_loss)"),
           ("lr", "learning_rate", "the learning rate of the last update"),
           ("elapsed_s", "elapsed_seconds", "seconds since training started"),
           ("exchange_share", "exchange_share", "share of the workers' (stages') rounds spent exchanging"),
           ("idle_share", "idle_share", "share of Sandblaster's workers' time spent idle"),
           ("mean_staleness", "mean_staleness", "mean staleness (merges) of the results merged at 1/staleness"))


class RecordCollector:
    """A prometheus-client collector of the record `source()` returns now (None: nothing yet, only what is kept)."""

    def __init__(self, source):
        self.source = source
        self.lock = threading.Lock()                # (scrapes are served on threads of their own)
        self.tests = {}                             # test net id -> its last entry seen

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        def gauge(name, text, value=None, labels=()):
            return GaugeMetricFamily(PREFIX + name, text, value=value, labels=list(labels) or None)
        record = self.source()
        record = record if isinstance(record, dict) else {}
        if record:
            info = gauge("info", "the run: its job id and mode", labels=("job", "mode"))
            info.add_metric([str(record.get("job") or ""), str(record.get("mode") or "")], 1)
            yield info
            yield gauge("started", "1 once training started (0: waiting for workers)",
                        1.0 if record.get("started") else 0.0)
        for field, name, text in FIGURES:
            value = records.figure(record, field)
            if value is not None:
                yield gauge(name, text, value)
        total = records.images_per_s(record)
        if total is not None:
            yield gauge("images_per_second", "images trained on per second, all workers together", total)
        rates = records.worker_rates(record)
        if "workers" in record:
            yield gauge("workers", "workers (a pipeline's stages) reporting", len(rates))
            per_worker = gauge("worker_images_per_second", "each worker's images per second", labels=("worker",))
            for worker, rate in sorted(rates.items()):
                per_worker.add_metric([worker], rate)
            yield per_worker
        yield from self._tests(record, gauge)

    def _tests(self, record, gauge):
        with self.lock:
            for entry in records.tests_of(record):
                kept = self.tests.get(entry["net"])
                if kept is None or entry["iter"] >= kept["iter"]:
                    self.tests[entry["net"]] = entry
            tests = [self.tests[net] for net in sorted(self.tests)]
        if not tests:
            return
        when = gauge("test_iteration", "the iteration (merge) of each test net's last test", labels=("net",))
        outputs = gauge("test_output", "each output of each test net's last test (accuracy, loss)",
                        labels=("net", "output"))
        for entry in tests:
            when.add_metric([str(entry["net"])], entry["iter"])
            for name, value in sorted(entry["scores"].items()):
                outputs.add_metric([str(entry["net"]), name], value)
        yield when
        yield outputs


def check_available():
    """One line, before anything starts, where prometheus-client is missing."""
    try:
        importlib.import_module("prometheus_client")
    except ImportError:
        raise PycaffeDistError("--metrics-port needs prometheus-client: pip install prometheus-client") from None


class MetricsServer:
    """The metrics of `source()` at http://HOST:PORT/metrics, on a daemon thread, until close(). Port 0 takes a
    free one (`port` is then the one taken); the address is said on stderr."""

    def __init__(self, port, host, source):
        check_available()
        from prometheus_client import CollectorRegistry, start_http_server
        registry = CollectorRegistry()
        registry.register(RecordCollector(source))
        try:
            self.server, _ = start_http_server(port, addr=host, registry=registry)
        except (OSError, ValueError) as exc:        # in use, not ours, no such address; a port out of range
            raise PycaffeDistError("--metrics-port %d: cannot serve metrics on %s: %s"
                                   % (port, host, getattr(exc, "strerror", None) or exc)) from None
        self.host, self.port = host, self.server.server_address[1]
        print("metrics for Prometheus at http://%s:%d/metrics" % (_url_host(host), self.port), file=sys.stderr,
              flush=True)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _url_host(host):
    return "[%s]" % host if ":" in host else host
