"""The coordinator of an all-reduce job (distributed/allreduce/master.py) and what a user sees: a worker killed
mid-run (the others go on from the checkpoint), NaN (one line, the last finite W on disk), SIGTERM (a clean stop with
a snapshot), a world started by the user's own mpiexec (a cluster's way), and the flags it refuses."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pycaffe_dist.distributed.redis_client import PASSWORD_ENV

from ..conftest import train_on_workers
from .conftest import MPIEXEC, REPO, mpi_env, needs_mpi
from .test_worker import assert_one_process_with_iter_size, read_model

pytestmark = needs_mpi


def start_training(solver, workers, tmp_path, *extra):
    """`train --workers N --mode allreduce` in the background, its output in a file."""
    env = dict(os.environ)
    env.pop(PASSWORD_ENV, None)
    log = open(tmp_path / "train.log", "w")
    return subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver), "--workers",
                             str(workers), "--mode", "allreduce", "--stats", str(tmp_path / "stats.json")] +
                            [str(a) for a in extra], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def wait_for_line(path, pattern, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text(errors="replace"))
        if found:
            return found
        time.sleep(0.1)
    pytest.fail("no line %r within %d s:\n%s" % (pattern, timeout, path.read_text(errors="replace")[-3000:]))


def ranks_of(job):
    """The pids of the worker processes of `job` (their command lines name the job; mpiexec's names them after its
    own flags)."""
    found = subprocess.run(["pgrep", "-f", r"^\S+ -m pycaffe_dist worker --redis .* --job %s" % job],
                           capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def test_a_worker_killed_mid_run_and_the_others_finish_the_job(make_solver, tmp_path):
    solver = make_solver(max_iter=6000, test_interval=6000, test_initialization=False, display=500)
    job = "killed-%d" % os.getpid()
    train = start_training(solver, 3, tmp_path, "--job", job, "--checkpoint-every", "100", "--lr-scaling", "none")
    try:
        wait_for_line(tmp_path / "train.log", r"Iteration 500 ")
        pids = ranks_of(job)
        assert len(pids) == 3, pids
        os.kill(pids[1], signal.SIGKILL)
        assert train.wait(180) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        if train.poll() is None:
            train.kill()
    log = (tmp_path / "train.log").read_text()
    lost = re.findall(r"worker (\d+) was lost \((.*?)\) at iteration (\d+): the 2 others go on from iteration (\d+), "
                      r"the last checkpoint", log)
    assert len(lost) == 1, log[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["restarts"] == 1 and stats["workers_at_end"] == 2 and stats["count"] == 6000
    assert stats["lost"][0]["from"] % 100 == 0 and stats["lost"][0]["from"] <= stats["lost"][0]["iteration"]
    assert stats["weights_identical"] and stats["tests"][-1]["scores"]["accuracy"] > 0.9


def test_nan_stops_every_worker_with_one_line_and_the_last_finite_weights_on_disk(make_solver, tmp_path):
    solver = make_solver(max_iter=200, base_lr=1e6, test_interval=1000, test_initialization=False)
    done = train_on_workers(solver, 2, "allreduce", tmp_path / "stats.json", "--lr-scaling", "none")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    found = re.fullmatch(r"dist_caffe: error: the gradients averaged over the 2 workers at iteration (\d+) hold NaN "
                         r"or Inf; the last finite weights are in (\S+)", last)
    assert found, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    from pycaffe_dist.io.load import read_solver
    weights = read_model(found.group(2), read_solver(str(solver)))
    assert all(np.isfinite(w).all() for w in weights)


# Open: in 1 of 2 full CI runs (2 cores) the private Redis stopped answering every client ~0.4 s after the stop
# request (all processes: "Timeout reading"), so worker 0 never saw the stop; not seen in 13 runs of its own, nor in
# the 4 CI runs since. Likely starved: Open MPI's ranks spun in their Sendrecv on both cores; they now yield
# (worlds.mpi_env). Kept open until CI shows it gone.
@pytest.mark.xfail(strict=False, reason="open: a CI run saw the job's Redis stop answering right after the stop "
                   "request (not reproduced alone)")
def test_sigterm_stops_every_worker_after_the_same_iteration_with_a_snapshot(make_solver, tmp_path):
    solver = make_solver(max_iter=100000, test_interval=100000, test_initialization=False, display=200)
    train = start_training(solver, 2, tmp_path)
    try:
        wait_for_line(tmp_path / "train.log", r"Iteration 400 ")
        train.send_signal(signal.SIGTERM)
        assert train.wait(60) == 128 + signal.SIGTERM, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        if train.poll() is None:
            train.kill()
    log = (tmp_path / "train.log").read_text()
    snapshot = re.findall(r"Snapshotting to binary proto file (\S+_iter_(\d+)\.caffemodel)", log)
    assert snapshot and os.path.exists(snapshot[-1][0]), log[-2000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["count"] == int(snapshot[-1][1]) and stats["weights_identical"]


def test_a_world_started_by_mpiexec_joins_a_coordinator_that_waits_for_it(make_solver, redis_server, tmp_path):
    """A cluster's way: the coordinator (launch false) publishes the job; mpiexec runs `dist_caffe worker` on the
    hosts, each worker's rank the MPI world's."""
    solver = make_solver(max_iter=50, test_interval=50, test_initialization=False)
    env = mpi_env(dict(os.environ, **{PASSWORD_ENV: redis_server.password}))
    settings = json.dumps({"redis": redis_server.url, "solver": str(solver), "job": "cluster-%d" % os.getpid(),
                           "workers": 2, "launch": False, "stats_path": str(tmp_path / "stats.json")})
    master = subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "allreduce-master", "--settings", "-"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              cwd=REPO, text=True)
    master.stdin.write(settings)
    master.stdin.close()
    try:
        world = subprocess.run([MPIEXEC, "-n", "2", "--oversubscribe", "--bind-to", "none", sys.executable, "-m",
                                "pycaffe_dist", "worker", "--redis", redis_server.url, "--job",
                                "cluster-%d" % os.getpid()], capture_output=True, text=True, env=env, cwd=REPO,
                               timeout=120)
        assert world.returncode == 0, world.stderr[-3000:]
        assert master.wait(60) == 0, master.stdout.read()[-3000:]
    finally:
        if master.poll() is None:
            master.kill()
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["count"] == 50 and stats["world"] == 2 and stats["weights_identical"]
    assert re.search(r"worker 1: 50 iterations", world.stderr)


def test_workers_started_one_by_one_with_ring_form_a_world_on_sockets(make_solver, redis_server, tmp_path):
    """The playbook's way, without MPI across the hosts: the coordinator (launch false) publishes the job and each
    `dist_caffe worker --ring R/N` is started on its own; their ring runs on TCP sockets. With --lr-scaling none,
    what one process gives with iter_size 2. `--ring` on a data-parallel job, or out of range, is one line."""
    solver = make_solver(max_iter=20, test_interval=1000, test_initialization=False, snapshot_after_train=True)
    env = dict(os.environ, **{PASSWORD_ENV: redis_server.password})
    job = "ring-%d" % os.getpid()
    settings = json.dumps({"redis": redis_server.url, "solver": str(solver), "job": job, "workers": 2,
                           "launch": False, "options": {"lr_scaling": "none"},
                           "stats_path": str(tmp_path / "stats.json")})
    master = subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "allreduce-master", "--settings", "-"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              cwd=REPO, text=True)
    master.stdin.write(settings)
    master.stdin.close()
    workers = [subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "worker", "--redis", redis_server.url, "--job",
                                 job, "--ring", "%d/2" % rank], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=env, cwd=REPO, text=True) for rank in (1, 0)]
    try:
        ends = [w.communicate(timeout=120)[1] for w in workers]
        assert [w.returncode for w in workers] == [0, 0], ends[0][-2000:] + ends[1][-2000:]
        assert master.wait(60) == 0, master.stdout.read()[-3000:]
    finally:
        for process in workers + [master]:
            if process.poll() is None:
                process.kill()
    assert "worker 1: 20 iterations" in ends[0]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["count"] == 20 and stats["world"] == 2 and stats["weights_identical"]
    assert_one_process_with_iter_size(solver, 2, tmp_path / "snap_iter_20.caffemodel")
    bad = subprocess.run([sys.executable, "-m", "pycaffe_dist", "worker", "--redis", redis_server.url, "--ring", "2/2"],
                         capture_output=True, text=True, env=env, cwd=REPO)
    assert bad.returncode == 2 and "argument --ring: expected RANK/SIZE (0 <= RANK < SIZE), got '2/2'" in bad.stderr


@pytest.mark.parametrize("flags, line", [
    ([], "--mode allreduce trains on workers: give --workers N"),
    (["--workers", "2", "--tau", "4"], "--tau: not options of mode allreduce (it takes --lr-scaling, --lr-warmup, "
                                       "--lars)"),
    (["--workers", "2", "--redis", "redis://127.0.0.1:1"], "--redis is not supported with --mode allreduce (its "
                                                           "workers run on this machine, at a private redis-server)"),
    (["--workers", "2", "--mode", "sync", "--bucket-mb", "4"], "--bucket-mb: option of --mode allreduce"),
])
def test_the_flags_it_cannot_take_are_one_line(flags, line, make_solver):
    argv = ["train", "--solver", str(make_solver(max_iter=10))] + flags
    if "--mode" not in flags:
        argv += ["--mode", "allreduce"]
    done = subprocess.run([sys.executable, "-m", "pycaffe_dist"] + argv, capture_output=True, text=True, cwd=REPO)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["dist_caffe: error: " + line] or \
        done.stderr.strip().startswith("dist_caffe: error: " + line), done.stderr
