"""`dist_caffe status` on a running job: members, rates, the global iteration, the last test, the snapshots."""
import json
import signal
import subprocess
import sys

import pytest

from .conftest import wait_for_merges

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _status(procs, *args):
    result = subprocess.run([sys.executable, "-m", "pycaffe_dist", "status", "--redis", procs.url] + list(args),
                            capture_output=True, text=True, env=procs.env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_status_shows_a_running_job(procs, make_solver, store_for):
    master = procs.master("watched", make_solver(max_iter=10 ** 6, snapshot=100), "async", 2)
    procs.worker("watched", 0)
    procs.worker("watched", 1)
    wait_for_merges(store_for("watched"), 250)
    status = json.loads(_status(procs, "--job", "watched", "--json"))
    assert status["mode"] == "async" and status["state"] == "running" and status["master_alive"]
    assert status["count"] >= 250 and status["test"]["scores"]["accuracy"] < 0.5    # the test at merge 0
    assert [(w["id"], w["alive"]) for w in status["workers"]] == [("0", True), ("1", True)]
    assert sorted(w["slot"] for w in status["workers"]) == [0, 1]          # a shard each, in the order they joined
    assert all(w["images_per_s"] > 0 for w in status["workers"])
    assert status["snapshots"] and status["snapshots"][-1].endswith(".caffemodel")
    text = _status(procs)
    assert "job watched: mode async, running, master alive" in text and "workers (2 of 2 wanted):" in text
    master.send_signal(signal.SIGINT)
    procs.check("master")
    assert "job watched" not in _status(procs)           # its keys are gone


def test_status_of_an_unknown_job_is_a_clear_error(procs):
    result = subprocess.run([sys.executable, "-m", "pycaffe_dist", "status", "--redis", procs.url, "--job", "nope"],
                            capture_output=True, text=True, env=procs.env, timeout=60)
    assert result.returncode == 1 and "job nope is not on this Redis" in result.stderr
