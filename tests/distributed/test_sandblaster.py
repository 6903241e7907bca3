"""Sandblaster's workers (distributed/sandblaster/worker.py)
as real processes at a real redis-server: any worker computes
any unit (the split over workers does not change what L-BFGS computes), a slow worker takes fewer units, and the
unit of a worker that is gone is handed out again."""
import json
import time

import numpy as np
import pytest

from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.proto.binary import read_binary

from .conftest import train_on_workers

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def weights(path):
    model = caffe_pb2.NetParameter()
    read_binary(str(path), model)
    return np.concatenate([np.array(b.data, np.float64) for layer in model.layer for b in layer.blobs])


def sandblaster(solver, workers, stats, *extra):
    return train_on_workers(solver, workers, "sandblaster", stats, *extra, timeout=300)


def test_the_split_over_workers_does_not_change_what_lbfgs_computes(make_solver, tmp_path):
    """1 worker and 3 workers: the same samples, points and sums (added in another order), so the weights after 4
    iterations agree to float32 rounding."""
    found = {}
    for n in (1, 3):
        run = sandblaster(make_solver(max_iter=4, snapshot_prefix=str(tmp_path / ("w%d" % n))), n,
                          tmp_path / ("stats%d.json" % n), "--sample-batches", 6, "--unit-batches", 2)
        assert run.returncode == 0, run.stderr[-3000:]
        found[n] = weights(tmp_path / ("w%d_iter_4.caffemodel" % n))
        stats = json.loads((tmp_path / ("stats%d.json" % n)).read_text())
        assert stats["batches"] == 6 * stats["evaluations"] and stats["evaluations"] >= 8
        assert sum(c["units"] for c in stats["units"].values()) == 3 * stats["evaluations"]
    assert np.linalg.norm(found[3] - found[1]) / np.linalg.norm(found[1]) < 1e-5


def test_a_slow_worker_takes_fewer_units(make_solver, tmp_path):
    run = sandblaster(make_solver(max_iter=3), 3, tmp_path / "stats.json", "--sample-batches", 12,
                      "--slow-worker", "0:0.3")
    assert run.returncode == 0, run.stderr[-3000:]
    units = {w: c["units"] for w, c in json.loads((tmp_path / "stats.json").read_text())["units"].items()}
    # at most the one unit it holds per evaluation, while the others share the rest
    assert 2 * units["0"] < min(units["1"], units["2"]), units


def test_the_unit_of_a_worker_that_is_gone_is_computed_again(make_solver, procs, redis_server, tmp_path):
    """Worker 0 takes the first unit and sits on it (--delay 60); worker 1 joins and computes the others; worker 0 is
    killed: once its heartbeat lapses its unit goes out again, worker 1 computes it, and the job ends."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"redis": redis_server.url, "solver": str(make_solver(max_iter=2)), "workers": 1,
                                    "sample_batches": 4, "job": "sandblaster-lost", "heartbeat_s": 1.5,
                                    "stats_path": str(tmp_path / "master.json")}))
    procs.start("master", "sandblaster-master", "--settings", settings)
    procs.start("worker0", "sandblaster-worker", "--redis", redis_server.url, "--job", "sandblaster-lost", "--id", 0,
                "--delay", 60)
    deadline = time.monotonic() + 60
    while "Starting: 1 workers ready" not in procs.log("master"):
        assert time.monotonic() < deadline, procs.log("master")[-3000:]
        time.sleep(0.2)
    time.sleep(1.0)                             # worker 0 has its unit: the only worker, it took the first one
    procs.start("worker1", "sandblaster-worker", "--redis", redis_server.url, "--job", "sandblaster-lost", "--id", 1)
    procs.procs["worker0"].kill()
    procs.check("master", timeout=120)
    log = procs.log("master")
    assert "Worker 0 has no heartbeat" in log and "of evaluation 1 handed out again: worker 0 is gone" in log, log
    units = procs.stats("master")["units"]
    assert units["0"]["units"] == 0 and units["1"]["units"] == 4 * procs.stats("master")["evaluations"], units
