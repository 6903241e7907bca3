"""Training logs in Caffe's format: writing them (glog's line prefix, a progress line on a terminal) and reading
them back for plots (what Caffe's tools/extra/parse_log.py reads).

glog prefixes each line with `I1121 15:24:00.123456  4242 solver.py:212] `: severity, month and day, time
with microseconds, thread id, source file and line. Caffe's parse_log.py takes the time from there and the
numbers from the message, so our logs and Caffe's parse the same way; logs with the prefixes stripped (as the
golden ones) still give the numbers against iterations, only not against seconds.
"""
import datetime
import logging
import os
import re
import sys
import threading
import time

import numpy as np

from ..errors import DataError


def caffe_number(x):
    """A number as Caffe's log lines print it: C++'s ostream on a float (6 significant digits)."""
    return "%g" % x


def loss_note(weight, value):
    """What Caffe's log adds to an output with a loss weight: " (* weight = weighted loss)"."""
    return " (* %s = %s loss)" % (caffe_number(weight), caffe_number(np.float32(weight * value))) if weight else ""


_LEVELS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "F"}


class GlogFormatter(logging.Formatter):
    def format(self, record):
        stamp = datetime.datetime.fromtimestamp(record.created)
        prefix = "%s%s %5d %s:%d] " % (_LEVELS.get(record.levelno, "I"), stamp.strftime("%m%d %H:%M:%S.%f"),
                                       threading.get_native_id() % 100000, record.filename, record.lineno)
        return prefix + record.getMessage()


class TerminalHandler(logging.StreamHandler):
    """Log lines on a terminal with one extra line under them that keeps being rewritten (the progress), cleared
    before each log line and drawn again after it, so the log lines stay whole."""

    def __init__(self, stream):
        super().__init__(stream)
        self.status = ""

    def emit(self, record):
        try:
            self.write_line(self.format(record))
        except Exception:
            self.handleError(record)

    def write_line(self, line):
        """A line above the progress line (which is drawn again under it)."""
        self.acquire()
        try:
            self.stream.write("\r\x1b[K" + line + "\n" + self.status)
            self.flush()
        finally:
            self.release()

    def set_status(self, text):
        self.acquire()
        try:
            self.status = text
            self.stream.write("\r\x1b[K" + text)
            self.flush()
        finally:
            self.release()

    def finish(self):
        self.set_status("")


class Progress:
    """An iteration hook (Solver.iteration_hooks) that shows iteration, smoothed loss, lr, images/s and the
    time left on a TerminalHandler, at most 10 times a second."""

    def __init__(self, handler, images_per_iteration, max_iter):
        self.handler, self.images, self.max_iter = handler, images_per_iteration, max_iter
        self.start = self.last_draw = time.perf_counter()
        self.first_iter = None

    def __call__(self, solver):
        now = time.perf_counter()
        if self.first_iter is None:
            self.first_iter, self.start = solver.iter - 1, now - 1e-9
        if now - self.last_draw < 0.1 and solver.iter < self.max_iter:
            return
        self.last_draw = now
        done = solver.iter - self.first_iter
        per_s = done / (now - self.start)
        left = (self.max_iter - solver.iter) / per_s if per_s > 0 else 0
        self.handler.set_status("[iter %d/%d] loss %.4g  lr %.3g  %.0f images/s  ETA %s"
                                % (solver.iter, self.max_iter, solver.smoothed_loss, solver.rate,
                                   per_s * self.images, _duration(left)))


class DistributedProgress:
    """The progress line of a distributed run, from the master's published stats: merges, loss, each worker's
    images/s, the exchange share of a round and the time left."""

    def __init__(self, handler):
        self.handler = handler

    def __call__(self, stats):
        if not stats.get("started"):
            self.handler.set_status("[job %s] waiting for workers" % stats.get("job"))
            return
        count, total, elapsed = stats["count"], stats["max_iter"], stats["elapsed_s"]
        left = (total - count) * elapsed / count if count else 0
        workers = sorted(stats["workers"].items(), key=lambda item: int(item[0]))
        rates = ", ".join("w%s %.0f img/s" % (w, r) for w, r in workers)
        loss = "%.4g" % stats["loss"] if stats.get("loss") is not None else "-"
        self.handler.set_status("[%s merge %d/%d] loss %s  %s  %s  ETA %s"
                                % (stats["mode"], count, total, loss, rates, share_text(stats), _duration(left)))


def share_text(stats):
    """The one figure of a job's progress that says where its time goes: the data-parallel workers' and the
    stages' share of a round spent exchanging, or Sandblaster's workers' share of the time spent idle."""
    if stats.get("idle_share") is not None:
        return "idle %.0f%%" % (100 * stats["idle_share"])
    return "exchange %.0f%%" % (100 * (stats.get("exchange_share") or 0.0))


def _duration(seconds):
    seconds = int(round(seconds))
    return "%d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)


def attach(logger, log_file=None, stream=None):
    """Send `logger` (INFO and up) to `stream` (default stderr) and to `log_file` in glog's format. Returns the
    TerminalHandler when the stream is a terminal (for a Progress), else None."""
    stream = stream or sys.stderr
    formatter = GlogFormatter()
    terminal = TerminalHandler(stream) if stream.isatty() else None
    handlers = [terminal or logging.StreamHandler(stream)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, mode="w"))
    for handler in handlers:
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return terminal


# --- reading logs ---------------------------------------------------------------------------------------------

_PREFIX = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)\s+\d+ [^\]]*\] ")
_ITERATION = re.compile(r"Iteration (\d+)")
_TRAIN_LOSS = re.compile(r"Iteration (\d+)(?: \([^)]*\))?, loss = ([-+\w.]+)")
_LR = re.compile(r"Iteration (\d+), lr = ([-+\w.]+)")
_TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = ([-+\w.]+)")
_TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = ([-+\w.]+)")
_TEST_NET = re.compile(r"Iteration (\d+), Testing net \(#(\d+)\)")


def parse_log(path):
    """Read a Caffe-format training log. Returns a dict: train (list of (iteration, seconds or None, loss)),
    lr (list of (iteration, seconds, lr)), test (list of (iteration, seconds, net id, output name, value)),
    outputs (the train net's: list of (iteration, seconds, output name, value)) and solving (the seconds of the
    "Solving" line, where Caffe's parse_log counts from; None without it or without times).
    A line whose time stamp is no date or whose value is no number is a DataError naming it."""
    train, rates, tests, outputs = [], [], [], []
    solving = None
    start = previous = None
    year = 2000
    iteration, net_id = 0, 0
    try:
        f = open(path, errors="replace")
    except FileNotFoundError:
        raise DataError("%s: no such log file" % path) from None
    except (OSError, ValueError) as exc:        # ValueError: a name with a NUL byte
        raise DataError("%r: cannot read the log: %s" % (str(path), exc)) from None
    with f:
        for number, line in enumerate(f, 1):
            where = "%s:%d" % (path, number)
            seconds = None
            m = _PREFIX.match(line)
            if m:
                stamp = _stamp(m, year, where)
                if previous is not None and stamp < previous - datetime.timedelta(days=1):
                    year += 1    # the log ran over new year's eve: glog's prefix has no year
                    stamp = _stamp(m, year, where)
                previous = stamp
                if start is None:
                    start = stamp
                seconds = (stamp - start).total_seconds()
                line = line[m.end():]
            if solving is None and line.startswith("Solving "):
                solving = seconds
            m = _ITERATION.search(line)
            if m:
                iteration = int(m.group(1))
            m = _TEST_NET.search(line)
            if m:
                net_id = int(m.group(2))
            m = _TRAIN_LOSS.search(line)
            if m:
                train.append((int(m.group(1)), seconds, _number(m.group(2), where)))
                continue
            m = _LR.search(line)
            if m:
                rates.append((int(m.group(1)), seconds, _number(m.group(2), where)))
                continue
            m = _TEST_OUTPUT.search(line)
            if m:
                tests.append((iteration, seconds, net_id, m.group(2), _number(m.group(3), where)))
                continue
            m = _TRAIN_OUTPUT.search(line)
            if m:
                outputs.append((iteration, seconds, m.group(2), _number(m.group(3), where)))
    return {"train": train, "lr": rates, "test": tests, "outputs": outputs, "solving": solving}


def _stamp(m, year, where):
    """glog's prefix as a datetime of `year` (microseconds from the digits as written: ".004636" is 4636)."""
    month, day, hour, minute, sec = (int(g) for g in m.groups()[:5])
    try:
        return datetime.datetime(year, month, day, hour, minute, sec, int(m.group(6)[:6].ljust(6, "0")))
    except ValueError as exc:
        raise DataError("%s: the time stamp %r is no date: %s" % (where, m.group(0).strip(), exc)) from None


def _number(text, where):
    try:
        return float(text)
    except ValueError:
        raise DataError("%s: %r is not a number" % (where, text)) from None


def plot_log(parsed, out, title=None):
    """Train loss and test outputs against iterations and, when the log has times, against seconds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    timed = bool(parsed["train"]) and all(s is not None for _, s, _ in parsed["train"])
    columns = [("iterations", 0)] + ([("seconds", 1)] if timed else [])
    fig, axes = plt.subplots(2, len(columns), figsize=(6 * len(columns), 7), squeeze=False)
    series = {}
    for it, sec, net_id, name, value in parsed["test"]:
        series.setdefault((net_id, name), []).append((it, sec, value))
    for col, (label, index) in enumerate(columns):
        top, bottom = axes[0][col], axes[1][col]
        if parsed["train"]:
            top.plot([r[index] for r in parsed["train"]], [r[2] for r in parsed["train"]], label="train loss")
        for (net_id, name), rows in sorted(series.items()):
            target = top if "loss" in name else bottom
            target.plot([r[index] for r in rows], [r[2] for r in rows], marker="o",
                        label="test #%d %s" % (net_id, name))
        top.set_ylabel("loss")
        bottom.set_ylabel("test output (accuracy)")
        for ax in (top, bottom):
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def default_plot_path(log_path):
    return os.path.splitext(log_path)[0] + ".png"
