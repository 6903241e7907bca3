"""The master refuses NaN and Inf: a job whose results diverge stops at once with one line (mode, merge, blob,
what to change), a snapshot of the last finite W, a non-zero exit, and no process or key left behind."""
import json
import re
import subprocess

import numpy as np
import pytest

from pycaffe_dist.io.caffemodel import load_weights
from pycaffe_dist.pycaffe import TEST, Net

from ..conftest import needs_fashion_mnist, train_on_workers

ERROR = re.compile(r"dist_caffe: error: training diverged in mode (\S+) at merge (\d+): (worker \d+'s result holds "
                   r"NaN or Inf|W overflowed to Inf or NaN) in layer \w+'s blob \d+; the last finite weights are in "
                   r"(\S+\.caffemodel) \((lower the solver's base_lr.*)\)$")


@pytest.mark.redis
@pytest.mark.slow
@needs_fashion_mnist
@pytest.mark.parametrize("mode, extra", [("async", []), ("sync", []), ("easgd", []), ("gradient-only", []),
                                         ("local-sgd", ["--tau", 1]), ("async", ["--compress", "1bit"])],
                         ids=["async", "sync", "easgd", "gradient-only", "local-sgd", "async-1bit"])
def test_base_lr_1_stops_the_job_with_one_line_and_a_finite_snapshot(mode, extra, lenet_solver, tmp_path):
    """A compressed NaN is sent as NaN (compression.py), and refused as any result holding NaN."""
    job = "diverge-" + mode + ("-compressed" if "--compress" in extra else "")
    servers = _redis_servers()
    run = train_on_workers(lenet_solver(base_lr=1.0, max_iter=2000), 8, mode, tmp_path / "stats.json",
                           "--job", job, *extra, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert len(errors) == 1, errors
    found = ERROR.match(errors[0])
    assert found and found.group(1) == mode, errors[0]
    merge, snapshot = int(found.group(2)), found.group(4)
    assert snapshot.endswith("lenet_iter_%d.caffemodel" % merge)
    net = Net(_net_of(tmp_path), TEST)
    load_weights(net, snapshot)
    assert all(np.isfinite(blob.data).all() for blob in net.learnable_params)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["count"] == merge and merge < 2000
    left = subprocess.run(["pgrep", "-f", "--job %s" % job], capture_output=True, text=True).stdout
    assert left == "" and _redis_servers() == servers


def _redis_servers():
    return len(subprocess.run(["pgrep", "-x", "redis-server"], capture_output=True, text=True).stdout.split())


def _net_of(tmp_path):
    from pycaffe_dist.io.load import read_solver
    return read_solver(str(tmp_path / "lenet_solver.prototxt")).net
