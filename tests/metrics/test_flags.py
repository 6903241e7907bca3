"""metrics/flags.py: what --tensorboard and --metrics-port open for each kind of run. A one-process solver served
while it trains; `train --workers 2` and `dist_caffe master` scraped during a real distributed run (a real
redis-server, real processes); flags that cannot work are one line before anything starts."""
import argparse
import re
import subprocess
import sys
import time
import urllib.error

import pytest

from pycaffe_dist.distributed.launch import free_port
from pycaffe_dist.errors import PycaffeDistError
from pycaffe_dist.metrics import flags
from pycaffe_dist.solver.solver import Solver
from tests.cli.commands import child_env
from tests.metrics.conftest import scalars
from tests.metrics.test_prometheus import listening_address, scrape


def args_of(*argv):
    parser = argparse.ArgumentParser()
    flags.add_train_flags(parser)
    return parser.parse_args([str(a) for a in argv])


def test_a_one_process_solver_is_served_while_it_trains(make_solver, tmp_path):
    solver = Solver(str(make_solver(max_iter=30, test_interval=10, display=5)))
    port = free_port()
    args = args_of("--metrics-port", port, "--tensorboard", tmp_path / "tb")
    with flags.watching_solver(args, solver):
        solver.step(12)                             # a test at 0 and at 10
        got = scrape(port)
    assert got[("dist_caffe_iteration", ())] == 12.0 and got[("dist_caffe_max_iter", ())] == 30.0
    assert got[("dist_caffe_loss", ())] == pytest.approx(float(solver.smoothed_loss))
    assert got[("dist_caffe_learning_rate", ())] == pytest.approx(0.05)
    assert got[("dist_caffe_images_per_second", ())] > 0
    assert got[("dist_caffe_test_iteration", (("net", "0"),))] == 10.0
    assert got[("dist_caffe_test_output", (("net", "0"), ("output", "accuracy")))] == pytest.approx(
        dict(solver.test_scores[0])["accuracy"])
    assert ("dist_caffe_workers", ()) not in got                 # (one process has no workers)
    with pytest.raises(urllib.error.URLError):                  # closed with the run
        scrape(port)
    assert sorted(scalars(tmp_path / "tb")["train/loss"])[-1][0] == 10


@pytest.mark.parametrize("argv, line", [
    (("--metrics-port", 70000), "--metrics-port must be a TCP port (0 to 65535), got 70000"),
    (("--metrics-port", 9100), "--metrics-port needs prometheus-client: pip install prometheus-client"),
    (("--tensorboard", "tb"), "--tensorboard needs tensorboardX: pip install tensorboardX"),
])
def test_flags_that_cannot_work_are_one_line(monkeypatch, argv, line):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)     # (None in sys.modules: the import fails)
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(PycaffeDistError, match="^%s$" % line.replace("(", r"\(").replace(")", r"\)")):
        flags.check(args_of(*argv))


def scrape_until(port, proc, done, timeout=120):
    """Scrape every 50 ms until `done(figures)` (the figures returned) or the process ends (a failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            got = scrape(port)
        except OSError:                             # not listening yet
            got = None
        if got and done(got):
            return got
        time.sleep(0.05)
    out = proc.communicate()[0] if proc.poll() is not None else ""
    pytest.fail("no scrape showed the run training (exit %s):\n%s" % (proc.poll(), out[-3000:]))


def training(got):
    return got.get(("dist_caffe_started", ())) == 1.0 and got.get(("dist_caffe_iteration", ()), 0) >= 5 and \
        ("dist_caffe_test_output", (("net", "0"), ("output", "accuracy"))) in got


@pytest.mark.redis
@pytest.mark.slow
def test_train_on_workers_serves_the_progress_record_and_writes_events(make_solver, tmp_path):
    solver = make_solver(max_iter=150, display=25, test_interval=50)
    port = free_port()
    env = child_env()                               # (the job's own redis-server)
    proc = subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver), "--workers", "2",
                             "--mode", "sync", "--metrics-port", str(port), "--tensorboard", str(tmp_path / "tb"),
                             "--slow-worker", "0:0.01", "--slow-worker", "1:0.01"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        got = scrape_until(port, proc, training)
        assert listening_address(port) == "127.0.0.1"
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert got[("dist_caffe_workers", ())] == 2.0 and got[("dist_caffe_max_iter", ())] == 150.0
    rates = [got[("dist_caffe_worker_images_per_second", (("worker", w),))] for w in "01"]
    assert min(rates) > 0 and got[("dist_caffe_images_per_second", ())] == pytest.approx(sum(rates))
    assert 0 <= got[("dist_caffe_exchange_share", ())] < 1 and got[("dist_caffe_loss", ())] > 0
    assert [dict(labels)["mode"] for name, labels in got if name == "dist_caffe_info"] == ["sync"]
    # the event files: the records' figures and every test the master logged (at 0, 50, 100 and the end)
    events = scalars(tmp_path / "tb")
    for tag in ("train/loss", "train/images_per_s", "workers/0/images_per_s", "workers/1/images_per_s",
                "job/workers", "job/exchange_share", "job/merges_per_s"):
        assert events[tag], tag
    logged = [float(v) for v in re.findall(r"Test net output #0: accuracy = (\S+)", out)]
    assert [step for step, _ in events["test0/accuracy"]] == [0, 50, 100, 150]
    assert [v for _, v in events["test0/accuracy"]] == pytest.approx(logged, rel=1e-5)


@pytest.mark.redis
@pytest.mark.slow
def test_a_master_serves_its_own_record_from_redis(make_solver, procs, tmp_path):
    job = "metrics-%d" % time.monotonic_ns()
    port = free_port()
    master = procs.master(job, make_solver(max_iter=400, display=50), "async", 2, "--metrics-port", port)
    for i in range(2):
        procs.worker(job, i, "--delay", "0.005")
    got = scrape_until(port, master, lambda got: training(got) and ("dist_caffe_mean_staleness", ()) in got)
    assert listening_address(port) == "127.0.0.1"
    assert got[("dist_caffe_info", (("job", job), ("mode", "async")))] == 1.0
    assert got[("dist_caffe_workers", ())] == 2.0 and got[("dist_caffe_mean_staleness", ())] >= 1.0
    assert got[("dist_caffe_test_iteration", (("net", "0"),))] in (0.0, 400.0)    # (test_initialization; the end)
    procs.check("master")
    assert "metrics for Prometheus at http://127.0.0.1:%d/metrics" % port in procs.log("master")
