"""All-reduce workers on emulated links (`--link`: distributed/allreduce/sockets.py, worlds.py): each worker in its
network namespace, their ring on sockets across the links; the same W on every worker, as one process with
iter_size N; a worker killed mid-run and the others go on; nothing left after. Needs root and tc (the links'
fixture skips with the reason elsewhere)."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest


from ..test_launch import _running
from ..test_links import _ours
from ..test_links import delay_ms as links_delay
from .conftest import REPO
from .test_master import wait_for_line
from .test_worker import assert_one_process_with_iter_size

pytestmark = [pytest.mark.slow, pytest.mark.redis]
delay_ms = links_delay          # the links' fixture: the delay this kernel's links can have, or a skip


def test_two_workers_behind_links_equal_one_process_with_iter_size_two(delay_ms, make_solver, tmp_path):
    solver = make_solver(max_iter=20, test_interval=1000, test_initialization=False, snapshot_after_train=True)
    env = dict(os.environ)
    env.pop("PCD_REDIS_PASSWORD", None)
    done = subprocess.run([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver), "--workers", "2",
                           "--mode", "allreduce", "--lr-scaling", "none", "--link", "1gbit:%dms" % delay_ms,
                           "--stats", str(tmp_path / "stats.json")], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r"^\[links\] 2 worker host\(s\) in network namespaces pcdl-(\w+)-w0\.\.1, .* to the hub "
                      r"([\d.]+);", done.stderr, re.M)
    assert found, done.stderr[:3000]
    tag, hub = found.groups()
    addresses = dict(re.findall(r"Worker (\d) ready on \S+ at ([\d.]+) \(pid", done.stderr))
    assert sorted(addresses) == ["0", "1"] and len(set(addresses.values())) == 2
    assert all(a.startswith(hub.rsplit(".", 1)[0] + ".") and a != hub for a in addresses.values()), addresses
    assert_one_process_with_iter_size(solver, 2, tmp_path / "snap_iter_20.caffemodel")
    assert json.loads((tmp_path / "stats.json").read_text())["weights_identical"]
    assert not [name for name in _ours() if tag in name]


# (Once a race: the second survivor's "left neighbour closed its connection", sent after the coordinator had stopped
# reading the ended world's messages, was read by the next world's watch and ended it. The coordinator now drops
# the ended world's messages before it starts the next.)
def test_a_worker_killed_behind_its_link_and_the_others_go_on(delay_ms, make_solver, tmp_path):
    solver = make_solver(max_iter=4000, test_interval=4000, test_initialization=False, display=200)
    job = "sockets-%d" % os.getpid()
    env = dict(os.environ)
    env.pop("PCD_REDIS_PASSWORD", None)
    log = open(tmp_path / "train.log", "w")
    train = subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver), "--workers",
                              "3", "--mode", "allreduce", "--job", job, "--link", "1gbit:%dms" % delay_ms,
                              "--checkpoint-every", "100", "--stats", str(tmp_path / "stats.json")],
                             stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        wait_for_line(tmp_path / "train.log", r"Iteration 400 ", timeout=120)
        ranks = subprocess.run(["pgrep", "-f", r"^\S+ -m pycaffe_dist worker --redis .* --job %s .*--ring 2/3/0" % job],
                               capture_output=True, text=True).stdout.split()
        assert len(ranks) == 1, ranks
        os.kill(int(ranks[0]), signal.SIGKILL)
        assert train.wait(180) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        if train.poll() is None:
            train.kill()
    text = (tmp_path / "train.log").read_text()
    assert re.search(r"worker 2 was lost \(pid \d+, signal 9\) at iteration \d+: the 2 others go on from iteration "
                     r"\d+, the last checkpoint", text), text[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["restarts"] == 1 and stats["count"] == 4000 and stats["weights_identical"]
    time.sleep(0.5)
    assert not _running("--job " + job)
