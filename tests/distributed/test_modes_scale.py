"""Every mode at 8 workers with no mode options at all, as a new user runs it: Caffe's LeNet solver on
Fashion-MNIST, the images of 2000 batches of 64 (2000 merges; 250 rounds of 8 in sync and gossip; 31 rounds of 8
workers x 8 steps in local-sgd), on whatever cores there are (2 in CI: the workers take turns, which makes results staler than on 8 cores). The defaults must
converge: SpeeDO's (async adding every delta whole, EASGD's moving rate 0.5) ended in NaN at 4 and 8 workers."""
import json
import math

import pytest

from .conftest import needs_fashion_mnist, train_on_workers

pytestmark = [pytest.mark.redis, pytest.mark.slow, needs_fashion_mnist]

MODES = ("sync", "async", "partial-sync", "weed-out", "easgd", "gradient-only", "gossip", "local-sgd")
WORKERS, BATCHES = 8, 2000
# Batches of 64 per merge: a round of every worker in sync and gossip, of every worker's tau 8 steps in local-sgd.
BATCHES_PER_MERGE = {"sync": WORKERS, "gossip": WORKERS, "local-sgd": WORKERS * 8}


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_converges_at_8_workers_with_no_options(mode, lenet_solver, tmp_path):
    merges = BATCHES // BATCHES_PER_MERGE.get(mode, 1)
    run = train_on_workers(lenet_solver(max_iter=merges), WORKERS, mode, tmp_path / "stats.json")
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    final = stats["tests"][-1]["scores"]
    assert math.isfinite(final["loss"]) and final["accuracy"] >= 0.78, final
    assert stats["count"] == merges and len(stats["workers"]) == WORKERS, run.stderr[-5000:]


def test_gossip_trains_lenet_at_4_workers(lenet_solver, tmp_path):
    """Gossip with no central W: the mean of the 4 workers' weights, tested at the end, after the images of 2000
    batches (500 rounds of each worker); nearly every round averaged with a peer."""
    workers = 4
    run = train_on_workers(lenet_solver(max_iter=BATCHES // workers), workers, "gossip", tmp_path / "stats.json")
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    final = stats["tests"][-1]["scores"]
    assert math.isfinite(final["loss"]) and final["accuracy"] >= 0.80, final
    assert stats["count"] == BATCHES // workers and len(stats["workers"]) == workers
    assert stats["averaged_share"] > 0.9 and stats["averagings_per_worker"] > 0.9 * BATCHES / workers, stats
