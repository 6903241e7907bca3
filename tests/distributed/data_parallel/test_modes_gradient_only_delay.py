"""bench/delayed_gradients.py, the measurement behind gradient-only's figures: one process whose gradients arrive D
updates late (D = 0 is Caffe's own loop). The quadratic model's bound it prints is lr_scaling.delayed_step_bound
(tests/distributed/test_lr_scaling.py)."""
import sys

import numpy as np
import pytest

from ..conftest import REPO, needs_fashion_mnist

sys.path.insert(0, str(REPO / "bench"))
import delayed_gradients  # noqa: E402
import scaling  # noqa: E402


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
