"""Every mode trains the tiny net with 2 worker processes on a real redis-server, and survives a worker killed
with SIGKILL mid-run."""
import signal

import pytest

from ..conftest import accuracies, keys_of, wait_for_merges

pytestmark = [pytest.mark.redis, pytest.mark.slow]

MODES = [("sync", []), ("async", []), ("partial-sync", ["--max-advance", 1]), ("weed-out", ["--weedout", 2]),
         ("easgd", ["--moving-rate", 0.3, "--tau", 2]), ("gradient-only", []), ("gossip", []),
         ("local-sgd", ["--tau", 2])]
ROUNDS = ("sync", "local-sgd")         # a merge is a round of every worker: half the merges
STALENESS_SCALED = ("async", "partial-sync", "weed-out", "gradient-only")     # a result scaled by 1 / its staleness


@pytest.mark.parametrize("mode,options", MODES, ids=[m for m, _ in MODES])
def test_mode_trains_with_two_workers(mode, options, procs, make_solver, redis_client):
    job = "train-" + mode
    procs.master(job, make_solver(max_iter=150 if mode in ROUNDS else 300), mode, 2, *options)
    procs.worker(job, 0)
    procs.worker(job, 1)
    procs.check("master")
    procs.check("worker0", 30)
    procs.check("worker1", 30)
    stats = procs.stats()
    first, last = accuracies(stats)[0], accuracies(stats)[-1]
    assert first < 0.45 and last > 0.8, (first, last)
    assert stats["count"] == (150 if mode in ROUNDS else 300)
    assert set(stats["workers"]) == {"0", "1"}
    if mode in STALENESS_SCALED:
        assert 1 <= stats["mean_staleness"] < 4, stats["mean_staleness"]    # about N = 2 merges old
    else:
        assert stats["mean_staleness"] is None              # not a mean of zeros where nothing is stale
    assert keys_of(redis_client, job) == []


@pytest.mark.parametrize("mode,options", MODES, ids=[m for m, _ in MODES])
def test_mode_survives_a_killed_worker(mode, options, procs, make_solver, store_for):
    job = "kill-" + mode
    merges = 800 if mode in ROUNDS else 1500
    procs.master(job, make_solver(max_iter=merges), mode, 2, *options)
    procs.worker(job, 0)
    victim = procs.worker(job, 1)
    wait_for_merges(store_for(job), 60)
    victim.send_signal(signal.SIGKILL)
    procs.check("master", 180)
    procs.check("worker0", 30)
    log = procs.log("master")
    assert "Worker 1 has no heartbeat" in log
    if mode in ROUNDS:
        assert "Synchronous round: worker 1 is gone; the round goes on with 1 worker(s)" in log
    stats = procs.stats()
    assert stats["count"] == merges and list(stats["workers"]) == ["0"]
    assert accuracies(stats)[-1] > 0.8


def test_sync_backup_workers_drop_a_slow_workers_results_and_do_not_wait_for_it(procs, make_solver):
    """3 workers, --backup 1, worker 2 sleeping 0.5 s after each round: the rounds close with workers 0 and 1 and
    take the fast workers' time; the slow worker's results arrive after their round closed and are dropped."""
    job, rounds = "backup", 2000
    procs.master(job, make_solver(max_iter=rounds), "sync", 3, "--backup", 1)
    for index in (0, 1):
        procs.worker(job, index)
    procs.worker(job, 2, "--delay", 0.5)
    procs.check("master", 180)
    stats = procs.stats()
    assert stats["count"] == rounds and stats["dropped"] >= 2
    assert stats["elapsed_s"] / rounds < 0.1                # a round that waited for worker 2 would take 0.5 s
    assert accuracies(stats)[-1] > 0.8
