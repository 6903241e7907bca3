"""bench/delayed_gradients.py, the arithmetic behind gradient-only's figures: the quadratic model's bound on the step
of a delayed heavy ball, and one process whose gradients arrive D updates late (D = 0 is Caffe's own loop)."""
import sys

import numpy as np
import pytest

from ..conftest import REPO, needs_fashion_mnist

sys.path.insert(0, str(REPO / "bench"))
import delayed_gradients  # noqa: E402
import scaling  # noqa: E402


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_the_bound_without_delay_is_the_heavy_balls_and_one_update_late_is_one(momentum):
    """No delay: a / (1 - M) < 2 (1 + M) / (1 - M) (Polyak's heavy ball on a quadratic); one update late the constant
    term M + a of z^2 - (1 + M) z + M + a must stay below 1, so a / (1 - M) < 1 whatever M."""
    assert delayed_gradients.steady_step_bound(momentum, 0) == pytest.approx(2 * (1 + momentum) / (1 - momentum))
    assert delayed_gradients.steady_step_bound(momentum, 1) == pytest.approx(1.0)


def test_the_bound_falls_as_one_over_the_delay_whatever_the_momentum():
    """What gradient-only's docstring cites: past D = 1 the largest stable steady step is about 1.5 / D, and no
    momentum lifts it (a lower one helps a little: 0.209 at D = 7 with none, 0.158 with 0.9)."""
    for momentum in (0.0, 0.5, 0.9):
        bounds = [delayed_gradients.steady_step_bound(momentum, d) for d in range(1, 17)]
        assert all(later < earlier for earlier, later in zip(bounds, bounds[1:])), bounds
        for delay in (7, 15):
            assert 1.0 < delay * bounds[delay - 1] < 1.6, (momentum, delay, bounds[delay - 1])
    assert delayed_gradients.steady_step_bound(0.0, 7) == pytest.approx(0.209, abs=1e-3)
    assert delayed_gradients.steady_step_bound(0.9, 7) == pytest.approx(0.158, abs=1e-3)


def test_a_bad_run_entry_is_one_line():
    with pytest.raises(SystemExit, match=r"'7:1.5:1': expected DELAY:MOMENTUM:RATE"):
        delayed_gradients.parse_runs("0:0.9:1,7:1.5:1")
    assert delayed_gradients.parse_runs("7:0:3, 15:0.5:1.5") == [(7, 0.0, 3.0), (15, 0.5, 1.5)]


@needs_fashion_mnist
def test_no_delay_is_caffes_loop_and_a_delay_is_applied(fashion_mnist, tmp_path, monkeypatch):
    """Delay 0 at the solver's momentum and rate gives the weights of the Solver's own step(), bit for bit; delay 1
    takes the second update's gradient at the first weights, which changes them. One thread, as the bench runs:
    with more, the GEMMs' split sums differ in the last bit from run to run."""
    from pycaffe_dist import common
    from pycaffe_dist.pycaffe import Solver
    monkeypatch.setattr(scaling, "NET", fashion_mnist / "lenet.prototxt")
    threads = common.num_threads()
    common.set_num_threads(1)
    try:
        check_against_caffes_loop(tmp_path, Solver)
    finally:
        common.set_num_threads(threads)


def check_against_caffes_loop(tmp_path, Solver):
    class Args:
        batches, every, out = 4, 2, tmp_path

    def weights(delay):
        run = delayed_gradients.Delayed(Args, delay, 0.9, 1.0)
        run.train(Args.batches, Args.every, lambda arrays: 0.0)
        return run.weights()

    path = scaling.write_solver({"max_iter": Args.batches, "every": Args.every, "dir": tmp_path / "caffe"})
    caffe = Solver(str(path))
    caffe.step(Args.batches)
    expected = [np.array(blob.data) for blob in caffe.net.learnable_params]
    for got, want in zip(weights(0), expected):
        np.testing.assert_array_equal(got, want)
    assert any(not np.array_equal(got, want) for got, want in zip(weights(1), expected))
