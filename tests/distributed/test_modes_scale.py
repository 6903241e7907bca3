"""Every mode at 8 workers with no mode options at all, as a new user runs it: Caffe's LeNet solver on
Fashion-MNIST, the images of 2000 batches of 64 (2000 merges; 250 rounds of 8 in sync), on whatever cores there
are (2 in CI: the workers take turns, which makes results staler than on 8 cores). The defaults must converge:
SpeeDO's (async adding every delta whole, EASGD's moving rate 0.5) ended in NaN at 4 and 8 workers."""
import json
import math

import pytest

from .conftest import needs_fashion_mnist, train_on_workers

pytestmark = [pytest.mark.redis, pytest.mark.slow, needs_fashion_mnist]

MODES = ("sync", "async", "partial-sync", "weed-out", "easgd", "gradient-only")
WORKERS, BATCHES = 8, 2000


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_converges_at_8_workers_with_no_options(mode, lenet_solver, tmp_path):
    merges = BATCHES // WORKERS if mode == "sync" else BATCHES
    run = train_on_workers(lenet_solver(max_iter=merges), WORKERS, mode, tmp_path / "stats.json")
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    final = stats["tests"][-1]["scores"]
    assert math.isfinite(final["loss"]) and final["accuracy"] >= 0.78, final
    assert stats["count"] == merges and len(stats["workers"]) == WORKERS, run.stderr[-5000:]
