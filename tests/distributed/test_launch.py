"""`dist_caffe train --workers N` on one machine: its own redis-server, master and workers, merged logs, a clean
end, and a clean stop on Ctrl-C; nothing left running."""
import json
import re
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


def _redis_servers():
    return len(subprocess.run(["pgrep", "-x", "redis-server"], capture_output=True, text=True).stdout.split())


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


def _until_started(proc):
    """The launcher's lines up to its master's start (or 120 s)."""
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if "Starting: 2 worker(s)" in line or time.monotonic() > deadline:
            break
    return lines


@pytest.mark.parametrize("number, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_ctrl_c_sigterm_and_sighup_stop_cleanly_with_a_snapshot(make_solver, tmp_path, number, code):
    """What `timeout`, systemd, `kill` and a closed terminal send stops the job as Ctrl-C does: the master
    snapshots, tests and stops its workers, and no process (the private redis-server included) is left."""
    servers = _redis_servers()
    proc = _launch(make_solver(max_iter=10 ** 6), "launch-int", tmp_path, "--mode", "async")
    lines = _until_started(proc)
    time.sleep(2)
    proc.send_signal(number)
    out, _ = proc.communicate(timeout=120)
    out = "".join(lines) + out
    assert proc.returncode == code, out[-3000:]
    assert "Stop requested" in out and "Optimization stopped after" in out
    assert list(tmp_path.glob("snap_iter_*.caffemodel"))
    assert not _running("--job launch-int") and _redis_servers() == servers


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open("/proc/%d/stat" % pid) as f:           # a zombie has ended, whoever reaps it
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_sigkilled_launcher_leaves_no_process_and_keeps_the_weights(make_solver, tmp_path):
    """SIGKILL cannot be caught: the children ask Linux for a signal when the launcher dies (PR_SET_PDEATHSIG), so
    the master stops as on Ctrl-C and snapshots W (to disk even if Redis went first), and the workers and the
    private redis-server end."""
    proc = _launch(make_solver(max_iter=10 ** 6), "launch-kill", tmp_path, "--mode", "async")
    lines = _until_started(proc)
    time.sleep(1)
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                               text=True).stdout.split()]
    assert len(children) == 4, "".join(lines)[-3000:]        # the redis-server, the master and 2 workers
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in children if _alive(pid)]
    assert not _running("--job launch-kill")
    assert list(tmp_path.glob("snap_iter_*.caffemodel"))


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


def test_an_error_of_the_master_is_the_launchers_one_line_at_once(make_solver, tmp_path):
    """A snapshot folder that does not exist: the master refuses at once, and so does the launcher, with the
    master's line (it used to wait 15 s for workers that nobody had told to stop)."""
    solver = make_solver(max_iter=100, snapshot_prefix=str(tmp_path / "missing" / "snap"))
    started = time.monotonic()
    proc = _launch(solver, "launch-err", tmp_path, "--mode", "async")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out[-3000:]
    assert time.monotonic() - started < 12
    errors = [line for line in out.splitlines() if "dist_caffe:" in line]
    assert len(errors) == 1 and "cannot write to snapshot prefix" in errors[0], out[-3000:]
    assert errors[0].startswith("dist_caffe: error: ") and "missing/snap" in errors[0]
    assert not _running("--job launch-err")


LINES_FROM_THREADS = '''
import sys, threading
from pycaffe_dist.distributed.launch import print_line
def child(i):
    for j in range(2000):
        print_line("[child %d] line %d of its output" % (i, j))
threads = [threading.Thread(target=child, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
'''


def test_the_childrens_lines_never_run_together():
    """The launcher's reader threads print the children's lines at once to a pipe (print() writes a line and its
    newline apart: two children's lines ran together, about 1 in 12 under 8 threads)."""
    run = subprocess.run([sys.executable, "-c", LINES_FROM_THREADS], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stderr.split("\n")
    assert lines.pop() == "" and len(lines) == 16000
    bad = [line for line in lines if not re.fullmatch(r"\[child \d\] line \d+ of its output", line)]
    assert not bad, bad[:5]
