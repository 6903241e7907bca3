"""Compressed W updates (distributed/data_parallel/broadcast.py):
a worker that rebuilds W from the updates holds the master's W
bit for bit, round after round, and falls back to a whole pull when it missed one; the master's residual keeps
what the updates did not carry; and sync with --compress pulls W as updates in real processes."""
import numpy as np
import pytest

from pycaffe_dist.distributed.data_parallel.broadcast import MasterUpdates, WorkerUpdates
from pycaffe_dist.distributed.data_parallel.compression import Damaged, OneBit, TopK, Format

from ..conftest import accuracies

SHAPES = [(20, 1, 5, 5), (20,), (50, 20 * 4 * 4), (50,), (10, 50), (10,)]


def _bits(arrays):
    return [a.view(np.uint32).tobytes() for a in arrays]


@pytest.mark.parametrize("codec", [OneBit(), TopK(0.01), TopK(1.0)], ids=["1bit", "topk:0.01", "topk:1"])
def test_a_worker_rebuilds_the_masters_w_bit_for_bit(codec):
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    start = [w.copy() for w in weights]
    master, worker = MasterUpdates(Format(codec, SHAPES), SHAPES), WorkerUpdates(Format(codec, SHAPES), SHAPES)
    worker.pulled_whole(weights, 0)
    truth = [np.zeros(s, np.float64) for s in SHAPES]
    out = [np.empty(s, np.float32) for s in SHAPES]
    for version in range(1, 41):
        master.begin(weights)
        for w, t in zip(weights, truth):                  # a round's step: W += the mean delta
            delta = (0.01 * rng.standard_normal(w.shape)).astype(np.float32)
            w += delta
            t += delta
        master.end(weights, version)
        assert master.version == version
        if version == 20:
            # a worker that missed merge 20 cannot apply 21's update: it says so and pulls W whole
            continue
        if version == 21:
            assert not worker.apply(master.payload, version, out)
            worker.pulled_whole(weights, version)
            continue
        assert worker.apply(master.payload, version, out)
        assert _bits(out) == _bits(weights) and _bits(worker.known) == _bits(weights)
    assert (worker.applied, worker.whole) == (38, 2)
    # error feedback: what W moved plus what the master still owes it is the sum of the true steps
    for w, s, r, t in zip(weights, start, master.residual, truth):
        np.testing.assert_allclose(w.astype(np.float64) - s + r, t, rtol=0, atol=2e-5)
    if codec.name == "topk" and codec.kept(1000) == 1000:
        assert all(not r.any() for r in master.residual)        # every value sent: nothing owed


def test_an_update_of_another_merge_or_a_damaged_one_is_not_applied():
    fmt = Format(OneBit(), SHAPES)
    master, worker = MasterUpdates(fmt, SHAPES), WorkerUpdates(fmt, SHAPES)
    weights = [np.ones(s, np.float32) for s in SHAPES]
    out = [np.empty(s, np.float32) for s in SHAPES]
    assert not worker.apply(fmt.encode(weights), 1, out)            # nothing held yet
    worker.pulled_whole(weights, 5)
    master.begin(weights)
    master.end(weights, 7)
    assert not worker.apply(master.payload, 7, out) and worker.version == 5
    damaged = master.payload.copy()
    damaged.view(np.uint8)[:4] = 0                                   # the magic
    with pytest.raises(Damaged):
        worker.apply(damaged, 6, out)


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("mode, options, merges", [("sync", [], 200), ("local-sgd", ["--tau", 2], 100)])
def test_round_modes_pull_w_as_compressed_updates(mode, options, merges, procs, make_solver):
    job = "updates-" + mode
    procs.master(job, make_solver(max_iter=merges), mode, 2, "--compress", "1bit", *options)
    procs.worker(job, 0)
    procs.worker(job, 1)
    procs.check("master")
    for w in (0, 1):
        procs.check("worker%d" % w, 30)
        line = [l for l in procs.log("worker%d" % w).splitlines() if "rounds," in l][-1]
        pulled = int(line.split("W pulled as ")[1].split()[0])
        assert pulled >= merges - 3, line               # all but the first pulls (and a reset's) by update
    stats = procs.stats()
    assert stats["bytes_per_pull"] == stats["bytes_per_result"] < stats["float32_bytes_per_result"] / 10
    assert accuracies(stats)[-1] > 0.8
