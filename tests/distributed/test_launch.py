"""`dist_caffe train --workers N` on one machine: its own redis-server, master and workers, merged logs, a clean
end, and a clean stop on Ctrl-C; nothing left running."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _running(pattern):
    result = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split()]


def _launch(solver, job, tmp_path, *extra):
    env = dict(os.environ)
    env.pop("PCD_REDIS_PASSWORD", None)
    return subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver), "--workers", "2",
                             "--job", job, "--stats", str(tmp_path / "stats.json"), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)


def test_train_with_workers_runs_everything_and_leaves_nothing(make_solver, tmp_path):
    proc = _launch(make_solver(max_iter=300), "launch-end", tmp_path, "--mode", "easgd", "--tau", "2")
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    assert "[master] " in out and "[worker 0] " in out and "[worker 1] " in out
    assert "Optimization Done after 300 merges." in out
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["count"] == 300 and stats["tests"][-1]["scores"]["accuracy"] > 0.8
    assert not _running("--job launch-end")
    assert (tmp_path / "snap_iter_300.caffemodel").exists()


def test_ctrl_c_stops_cleanly_with_a_snapshot(make_solver, tmp_path):
    proc = _launch(make_solver(max_iter=10 ** 6), "launch-int", tmp_path, "--mode", "async")
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if "Starting: 2 worker(s)" in line or time.monotonic() > deadline:
            break
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    out = "".join(lines) + out
    assert proc.returncode == 130, out[-3000:]
    assert "Stop requested" in out and "Optimization stopped after" in out
    assert list(tmp_path.glob("snap_iter_*.caffemodel"))
    assert not _running("--job launch-int")


def test_workers_on_a_gpu_each(make_solver, tmp_path, monkeypatch):
    """--gpu 0,1: one worker per GPU, synchronous, the master on the CPU (here on the emulated device, which stands
    for a GPU of any id)."""
    monkeypatch.setenv("PCD_DEVICE", "emulated")
    env = dict(os.environ)
    env.pop("PCD_REDIS_PASSWORD", None)
    proc = subprocess.run([sys.executable, "-m", "pycaffe_dist", "-v", "train", "--solver",
                           str(make_solver(max_iter=60)), "--gpu", "0,1", "--job", "launch-gpu", "--stats",
                           str(tmp_path / "stats.json")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Optimization Done after 60 merges." in proc.stderr
    for i in (0, 1):
        assert "[worker %d] computing on GPU %d: emulated GPU" % (i, i) in proc.stderr, proc.stderr[-3000:]
    assert "[worker 2] " not in proc.stderr
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["mode"] == "sync" and stats["count"] == 60
