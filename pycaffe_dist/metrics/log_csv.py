"""`dist_caffe plot --csv LOG`: the two tables of Caffe's tools/extra/parse_log.py, LOG.train and LOG.test beside
the log (or in --csv-dir), from our logs and Caffe's, read by the plot verb's own parser (solver/training_log.py
parse_log).

Each table has the columns NumIters, Seconds, LearningRate and one per output name, a row per display (the train
net's outputs, from its "Train net output" lines) or per test, as Caffe's:
- Seconds count from the "Solving" line (Caffe's start; without one, from the log's first time stamp) and are
  empty in a log without glog's time prefixes (Caffe's parse_log skips such lines, so it gives no rows there);
- LearningRate is that of the last lr line before the row's iteration (Caffe's: the last read before the row,
  the same in a log of one run); the first rows, logged before any rate, take the first one (Caffe's first row
  takes the second's).
Deliberate differences: NumIters is written as an integer (Caffe's keeps it as a float: "100.0"); every row is
written, the last too (Caffe's drops a last row it has not seen complete, and so the only test of a log); a log of
several test nets has a row per net and test (Caffe's merges the first test's nets into one row, their equal
names overwritten, and splits the later ones); and a log without "Train net output" lines (our distributed
masters' logs) has a train table of the display lines' smoothed loss, as column "loss". A table without rows is not
written, as Caffe's."""
import csv
import math
import os

from ..errors import PycaffeDistError

FIXED = ("NumIters", "Seconds", "LearningRate")


def tables(parsed):
    """(train rows, test rows) of a parsed log (training_log.parse_log), each row a dict of FIXED and the
    outputs."""
    base = parsed.get("solving")
    if base is None:
        base = 0.0
    rates = sorted((it, lr) for it, _, lr in parsed["lr"])
    outputs = parsed["outputs"] or [(it, sec, "loss", loss) for it, sec, loss in parsed["train"]]
    train = _rows([((it,), it, sec, name, value) for it, sec, name, value in outputs], rates, base)
    test = _rows([((it, net), it, sec, name, value) for it, sec, net, name, value in parsed["test"]], rates, base)
    return train, test


def _rows(lines, rates, base):
    """Rows of consecutive output lines of one key (an iteration; a test net's test), in the log's order."""
    rows, key = [], None
    for line_key, iteration, seconds, name, value in lines:
        if line_key != key:
            key = line_key
            rows.append({"NumIters": iteration, "Seconds": None if seconds is None else round(seconds - base, 6),
                         "LearningRate": _rate_before(rates, iteration)})
        rows[-1][name] = value
    # Caffe logs the first rate after the first rows: they take the first one logged (Caffe's, the second row's)
    known = next((row["LearningRate"] for row in rows if not math.isnan(row["LearningRate"])), None)
    for row in rows:
        if known is None or not math.isnan(row["LearningRate"]):
            break
        row["LearningRate"] = known
    return rows


def _rate_before(rates, iteration):
    found = float("nan")
    for it, lr in rates:
        if it >= iteration:
            break
        found = lr
    return found


def write_tables(log_path, parsed, out_dir=None):
    """Write LOG.train and LOG.test (those with rows) into out_dir (default: the log's folder); their paths."""
    out_dir = out_dir or os.path.dirname(os.path.abspath(log_path))
    written = []
    for suffix, rows in zip((".train", ".test"), tables(parsed)):
        if not rows:
            continue
        path = os.path.join(out_dir, os.path.basename(log_path) + suffix)
        columns = list(FIXED)
        for row in rows:
            columns.extend(name for name in row if name not in columns)
        try:
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
        except OSError as exc:
            raise PycaffeDistError("%s: cannot write the table: %s" % (path, exc.strerror or exc)) from None
        written.append(path)
    return written
