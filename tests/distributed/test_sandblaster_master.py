"""Sandblaster's coordinator (distributed/sandblaster/master.py): the objective L-BFGS sees (the loss, the L2 weight
decay, fixed parameters), training to accuracy with real processes at a real redis-server (the tiny data set, and
LeNet on Fashion-MNIST), resuming from a snapshot, the NaN guard, and its errors in one line."""
import json
import math
import re

import numpy as np
import pytest

from pycaffe_dist.distributed.sandblaster.master import SandblasterMaster, Settings
from pycaffe_dist.distributed.redis_client import PASSWORD_ENV

from .conftest import accuracies, needs_fashion_mnist, train_on_workers

pytestmark = [pytest.mark.redis]


def sandblaster(solver, workers, stats, *extra, timeout=300):
    return train_on_workers(solver, workers, "sandblaster", stats, *extra, timeout=timeout)


def one_error_line(run):
    lines = [line for line in run.stderr.splitlines() if line.startswith("dist_caffe: ")]
    assert run.returncode == 1 and len(lines) == 1, run.stderr[-3000:]
    return lines[0]


def test_the_objective_is_the_mean_loss_plus_the_l2_weight_decay(make_solver, tiny_data, tmp_path, redis_server,
                                                                 monkeypatch):
    """f = loss + wd/2 sum decay_mult |x|^2 and g = gradient + wd decay_mult x, with lr_mult 0's blob held (g 0)."""
    net = (tiny_data / "net.prototxt").read_text().replace(
        'top: "ip2"\n', 'top: "ip2"\n        param { lr_mult: 0 } param { lr_mult: 1 decay_mult: 3 }\n', 1)
    (tmp_path / "net.prototxt").write_text(net)
    monkeypatch.setenv(PASSWORD_ENV, redis_server.password)
    solver = make_solver(net=str(tmp_path / "net.prototxt"), weight_decay=0.01)
    master = SandblasterMaster(Settings(redis=redis_server.url, solver=str(solver), job="objective"))
    x = np.random.default_rng(0).standard_normal(master.x.size).astype(np.float32)
    gradient = np.random.default_rng(1).standard_normal(master.x.size).astype(np.float32)
    monkeypatch.setattr(master, "_evaluate", lambda point, sample: (0.75, gradient.copy()))
    f, g = master._objective(x, 0)
    blobs = master.views(x)
    assert [tuple(b.shape) for b in blobs] == [(32, 16), (32,), (4, 32), (4,)]
    mults = [1, 1, 0, 3]                                    # ip1's two, ip2's weights (fixed), ip2's bias at 3
    expected_f = 0.75 + 0.5 * 0.01 * sum(m * float(np.dot(b.ravel(), b.ravel())) for m, b in zip(mults, blobs))
    assert f == pytest.approx(expected_f, rel=1e-6)
    expected_g = [gb + np.float32(0.01 * m) * b for gb, b, m in zip(master.views(gradient), blobs, mults)]
    expected_g[2][...] = 0                                  # lr_mult 0: held where it is
    np.testing.assert_allclose(g, np.concatenate([e.ravel() for e in expected_g]), rtol=1e-6)


@pytest.mark.slow
def test_sandblaster_trains_the_tiny_net(make_solver, tmp_path):
    run = sandblaster(make_solver(max_iter=10, display=2), 3, tmp_path / "stats.json", "--sample-batches", 8)
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    final = stats["tests"][-1]["scores"]
    assert math.isfinite(final["loss"]) and final["accuracy"] >= 0.95, stats["tests"]
    assert stats["count"] == 10 and stats["evaluations"] >= 20 and len(stats["units"]) == 3
    assert "Optimization Done after 10 iterations (%d evaluations, %d batches of 32 images)." % (
        stats["evaluations"], stats["batches"]) in run.stderr
    assert re.search(r"Iteration 8 \(.* iter/s, .*\), loss = ", run.stderr) and "Iteration 8, step = " in run.stderr
    assert (tmp_path / "snap_iter_10.caffemodel").exists()


@pytest.mark.slow
def test_a_snapshot_resumes_at_its_iteration(make_solver, tmp_path):
    first = sandblaster(make_solver(max_iter=3), 2, tmp_path / "a.json", "--sample-batches", 4)
    assert first.returncode == 0, first.stderr[-3000:]
    again = sandblaster(make_solver(max_iter=5), 2, tmp_path / "b.json", "--sample-batches", 4, "--snapshot",
                        tmp_path / "snap_iter_3.solverstate")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Optimization Done after 5 iterations" in again.stderr and (tmp_path / "snap_iter_5.caffemodel").exists()
    stats = json.loads((tmp_path / "b.json").read_text())
    assert stats["count"] == 5 and stats["evaluations"] >= 4


@pytest.mark.slow
def test_nan_is_refused_in_one_line_with_the_last_finite_weights(make_solver, tiny_data, tmp_path):
    """Inputs scaled to Inf: the loss at the first point is NaN; the job stops, x0 is on disk."""
    net = (tiny_data / "net.prototxt").read_text().replace("scale: 0.00390625", "scale: 1e38", 1)
    (tmp_path / "net.prototxt").write_text(net)
    run = sandblaster(make_solver(max_iter=5, net=str(tmp_path / "net.prototxt")), 2, tmp_path / "stats.json")
    line = one_error_line(run)
    assert "training diverged in mode sandblaster at iteration 0: the loss or its gradient" in line, line
    assert (tmp_path / "snap_iter_0.caffemodel").exists()


@pytest.mark.parametrize("extra, expected", [
    (["--mode", "sandblaster", "--lbfgs-memory", "0"], "--lbfgs-memory must be at least 1, got 0"),
    (["--mode", "sandblaster", "--sample-batches", "2", "--unit-batches", "3"],
     "--unit-batches 3 is more than a sample (--sample-batches 2): a unit is a part of a sample"),
    (["--mode", "sandblaster", "--tau", "2"], "--tau: not options of mode sandblaster (it takes --lbfgs-memory, "
                                              "--sample-batches, --unit-batches)"),
    (["--mode", "async", "--lbfgs-memory", "5"], "--lbfgs-memory: option of --mode sandblaster"),
    (["--mode", "sandblaster", "--pipeline", "2"], "--pipeline is not supported with --mode sandblaster"),
])
def test_bad_options_are_one_line(make_solver, tmp_path, extra, expected):
    run = train_on_workers(make_solver(max_iter=2), 2, extra[1], tmp_path / "s.json", *extra[2:])
    assert expected in one_error_line(run)


def test_l1_weight_decay_is_refused_in_one_line(make_solver, tmp_path):
    run = sandblaster(make_solver(max_iter=2, regularization_type="L1"), 2, tmp_path / "s.json")
    assert "regularization_type L1 is not differentiable at 0" in one_error_line(run)


@pytest.mark.slow
@needs_fashion_mnist
def test_lenet_on_fashion_mnist_at_4_workers(lenet_solver, tmp_path):
    """Caffe's LeNet on Fashion-MNIST: 0.80 test accuracy (all 10,000 images) with a finite loss within 10 passes over
    the 60,000 training images. 100 iterations on samples of 32 batches of 64 take about 2.1 evaluations each:
    ~430,000 images, 7 passes."""
    run = sandblaster(lenet_solver(max_iter=100, display=10), 4, tmp_path / "stats.json", timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    final = stats["tests"][-1]["scores"]
    assert math.isfinite(final["loss"]) and final["accuracy"] >= 0.80, (final, stats["images"])
    assert stats["images"] <= 10 * 60000, stats["images"]
    assert accuracies(stats) and all(c["units"] > 0 for c in stats["units"].values())
