"""Parameter server shards (`--servers K`, data_parallel/shard.py and shards.py) as real processes: each merges one
K-th of W at a redis-server of its own. Sync's W is the one master's, bit for bit; every mode with a central W trains;
a lost shard and NaN end the job with one line and the last W every shard published on disk; `dist_caffe master
--servers K` with `dist_caffe shard` on their own (as on many machines)."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import Future

import numpy as np
import pytest

from pycaffe_dist.distributed.data_parallel.modes import MODES, resolve_options
from pycaffe_dist.distributed.data_parallel.shard import Shard
from pycaffe_dist.distributed.launch import LocalRedis
from pycaffe_dist.distributed.redis_client import PASSWORD_ENV
from pycaffe_dist.errors import PycaffeDistError
from pycaffe_dist.proto import caffe_pb2

from ..conftest import needs_fashion_mnist, train_on_workers

pytestmark = pytest.mark.redis
CENTRAL_W = ("sync", "async", "partial-sync", "weed-out", "easgd", "gradient-only")


def weights(path):
    net = caffe_pb2.NetParameter()
    net.ParseFromString(open(path, "rb").read())
    return [np.array(b.data, np.float32) for layer in net.layer for b in layer.blobs]


@needs_fashion_mnist
def test_sync_with_2_and_4_shards_is_one_masters_w_bit_for_bit(lenet_solver, tmp_path):
    """8 workers, 15 rounds: each shard sums its slice of the deltas in the workers' slot order and adds their mean
    as the master does on W; the assembled W equals --servers 1's to the bit."""
    found = {}
    for k in (1, 2, 4):
        solver = lenet_solver(max_iter=15, snapshot_prefix=str(tmp_path / ("k%d" % k)))
        run = train_on_workers(solver, 8, "sync", tmp_path / ("k%d.json" % k), "--servers", k)
        assert run.returncode == 0, run.stderr[-3000:]
        stats = json.loads((tmp_path / ("k%d.json" % k)).read_text())
        assert stats["servers"] == k and stats["count"] == 15
        if k > 1:
            assert len(stats["shard_cpu_ms_per_merge"]) == k
            assert "Waiting for %d parameter server shards" % k in run.stderr
        found[k] = weights(tmp_path / ("k%d_iter_15.caffemodel" % k))
    for k in (2, 4):
        assert all(np.array_equal(a, b) for a, b in zip(found[1], found[k])), k


@needs_fashion_mnist
@pytest.mark.slow
@pytest.mark.parametrize("servers", [2, 4])
@pytest.mark.parametrize("mode", CENTRAL_W)
def test_every_central_w_mode_trains_at_8_workers_on_shards(mode, servers, lenet_solver, tmp_path):
    """The images of 1000 batches (125 rounds of 8 in sync, 1000 results else), no options but --servers: a finite
    loss and at least 0.75 (one process: 0.84 on these images), each shard moving its K-th of the bytes.
    Gradient-only gets 2000, as at one master (test_modes_scale.py): its scaled rate's warmup lasts 2 % of the job
    a step, and over 800 or 1000 merges it climbed too fast for 8 workers' stale gradients, with one master as
    with shards (NaN after the backoff had reached the solver's own rate: the time-to-accuracy issue's open case)."""
    merges = (2000 if mode == "gradient-only" else 1000) // (8 if mode == "sync" else 1)
    run = train_on_workers(lenet_solver(max_iter=merges), 8, mode, tmp_path / "stats.json", "--servers", servers)
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    final = stats["tests"][-1]["scores"]
    assert stats["servers"] == servers and stats["count"] == merges
    assert math.isfinite(final["loss"]) and final["accuracy"] >= 0.75, (final, stats.get("lr_backoffs"))
    # No process (master, shard, Redis server) moved all of a result's bytes: a Redis server sends its slice of
    # each result (to its shard) and of each W pulled (to a worker), 2 x 1/K of the model per result merged, and
    # some more (the first server carries the job's messages; a backoff's reset has every worker pull W again and
    # throws away the results in flight): bench/scaling.py --servers measures the ratio to one server's figure.
    results = (8 if mode == "sync" else 1) * (stats["count"] + stats["dropped"]) / stats["count"]
    assert stats["hub_bytes_per_merge"] < results * 2 * stats["model_bytes"] * 1.5 / servers, stats["lr_backoffs"]


def _process_of(job, index):
    """The pid of the job's shard `index` (its command line names the job)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if b"shard" in argv and job.encode() in argv and str(index).encode() in argv[argv.index(b"--index") + 1:][:1]:
            return int(pid)
    return None


@needs_fashion_mnist
def test_a_lost_shard_ends_the_job_with_one_line_and_the_last_w_on_disk(lenet_solver, tmp_path):
    job = "shardkill-" + uuid.uuid4().hex[:6]
    solver = lenet_solver(max_iter=100000, snapshot_prefix=str(tmp_path / "lost"))
    env = dict(os.environ)
    env.pop(PASSWORD_ENV, None)
    with open(tmp_path / "train.log", "w") as log:       # (a pipe left unread would stall the job)
        proc = subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver), "--workers",
                                 "2", "--mode", "async", "--servers", "2", "--heartbeat", "1", "--job", job],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline, pid = time.monotonic() + 60, None
        while pid is None and time.monotonic() < deadline:
            pid = _process_of(job, 1)
            time.sleep(0.2)
        assert pid is not None, "shard 1 did not start"
        while "Iteration 100 " not in (tmp_path / "train.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)                             # merges go on
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = (tmp_path / "train.log").read_text()
    assert proc.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("dist_caffe: error:")]
    assert len(errors) == 1 and "parameter server shard 1 has no heartbeat" in errors[0], out[-3000:]
    model = re.search(r"the weights at merge (\d+) are in (\S+) ", errors[0])
    assert model and int(model.group(1)) > 0, errors[0]
    assert all(np.isfinite(w).all() for w in weights(model.group(2)))
    assert "Traceback" not in out


@needs_fashion_mnist
def test_nan_on_shards_stops_the_job_with_the_last_finite_w(lenet_solver, tmp_path):
    """A rate that sends W to NaN at the solver's own rate: a shard finds it before it publishes, every shard
    goes back to the last W they all published, and that W is the snapshot."""
    solver = lenet_solver(max_iter=300, base_lr=80.0, snapshot_prefix=str(tmp_path / "nan"))
    run = train_on_workers(solver, 2, "sync", tmp_path / "stats.json", "--servers", 2, "--lr-scaling", "none")
    assert run.returncode == 1, run.stderr[-3000:]
    line = run.stderr.strip().splitlines()[-1]
    found = re.search(r"training diverged in mode sync at merge \d+: .* NaN or Inf in layer \w+'s blob \d; the last "
                      r"finite weights are in (\S+) ", line)
    assert found, run.stderr[-3000:]
    assert all(np.isfinite(w).all() for w in weights(found.group(1)))


def test_the_verbs_on_their_own_as_on_many_machines(procs, make_solver, redis_server, tmp_path):
    """`dist_caffe master --servers 2` over two Redis servers, `dist_caffe shard --index S` for each, two workers:
    the job ends with each shard's slice published at the last merge."""
    second = LocalRedis()
    try:
        urls = ",".join(s.url.replace("//", "//:%s@" % s.password) for s in (redis_server, second))
        job = "verbs-" + uuid.uuid4().hex[:6]
        procs.start("master", "master", "--redis", urls, "--job", job, "--solver", make_solver(max_iter=30),
                    "--mode", "async", "--workers", 2, "--servers", 2, "--stats", tmp_path / "master.json")
        for s in (0, 1):
            procs.start("shard%d" % s, "shard", "--redis", urls, "--job", job, "--index", s)
        for w in (0, 1):
            procs.start("worker%d" % w, "worker", "--redis", urls, "--job", job, "--id", w)
        procs.check("master")
        for s in (0, 1):
            procs.check("shard%d" % s)
            assert "shard %d: W published at merge 30" % s in procs.log("shard%d" % s)
        assert procs.stats("master")["servers"] == 2
    finally:
        second.stop()


@needs_fashion_mnist
@pytest.mark.parametrize("args, expected", [
    (["--mode", "gossip", "--servers", "2"], "--servers 2: mode gossip keeps no central W to shard"),
    (["--mode", "sync", "--servers", "2", "--compress", "1bit"], "--servers 2: --compress sends each result as one"),
    (["--mode", "sync", "--servers", "0"], "--servers must be at least 1, got 0"),
    (["--mode", "sync", "--servers", "2", "--redis-servers", "3"], "--servers 2 runs one private redis-server per"),
    (["--mode", "allreduce", "--servers", "2"], "--servers is not supported with --mode allreduce"),
])
def test_what_cannot_be_sharded_is_said_in_one_line_before_anything_starts(args, expected, lenet_solver):
    run = subprocess.run([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(lenet_solver()),
                          "--workers", "2"] + args, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and expected in run.stderr, run.stderr[-2000:]
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr


class _Results:
    """A shard's store, reduced to the result slices it reads."""

    def __init__(self, slices):
        self.slices = slices

    def get_result_slice(self, worker, server, out):
        out[...] = self.slices[worker]
        return 1


def _shard(mode, size=6):
    """A shard of `mode` holding a slice of `size` floats (one blob), without its process around it."""
    shard = Shard.__new__(Shard)
    shard.index, shard.mode, shard.size = 1, mode, size
    shard.pieces, shard.names = [(0, 10, 10 + size, 0)], ["ip1/0"]
    shard.rule = MODES[mode].MergeRule(shard, resolve_options(mode, {}))
    shard.w, shard.history = np.ones(size, np.float32), []
    shard.slots, shard.pending, shard.copies, shard.dirty, shard.bad = {}, [], {}, False, None
    return shard


def test_a_shard_replays_the_masters_events_on_its_slice():
    """Sync: two results, the second closing the round, merged as their mean; a NaN in one is named, by blob."""
    shard = _shard("sync")
    shard.store = _Results({"3": np.full(6, 2.0, np.float32), "5": np.full(6, 4.0, np.float32)})

    def read(worker):                                   # (the read-ahead's future, done)
        future = Future()
        future.set_result(shard._read(worker))
        return future
    shard._event({"e": "start", "workers": ["3", "5"], "slots": [0, 1], "m": []}, None)
    shard._event({"e": "result", "worker": "5", "staleness": 1, "m": []}, read("5"))
    assert not shard.dirty                              # the round waits for worker 3
    shard._event({"e": "result", "worker": "3", "staleness": 1, "m": [[0, 2.0]]}, read("3"))
    assert shard.dirty and np.array_equal(shard.w, np.full(6, 4.0, np.float32))     # 1 + (2 + 4) / 2
    shard.store.slices["5"][2] = np.nan
    shard._event({"e": "result", "worker": "5", "staleness": 1, "m": []}, read("5"))
    shard._event({"e": "result", "worker": "3", "staleness": 1, "m": [[1, 2.0]]}, read("3"))
    assert shard.bad == "worker 5's result holds NaN or Inf in layer ip1's blob 0"


def test_a_shard_refuses_what_its_rule_did_not_decide_in_one_line():
    shard = _shard("async")
    with pytest.raises(PycaffeDistError, match=r"^shard 1: the master merged at merge 7 where this shard's copy of "
                                               r"the rule did not \(the master and its shards disagree\)$"):
        shard._event({"e": "lost", "worker": "3", "m": [[7, 1.0]]}, None)
    shard._event({"e": "keep", "count": 4, "kept": [4]}, None)
    with pytest.raises(PycaffeDistError, match=r"^shard 1: told to go back to the W of merge 9, of which it kept no "
                                               r"copy \(it has \[4\]\)$"):
        shard._event({"e": "restore", "count": 9}, None)
