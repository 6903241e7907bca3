"""Sandblaster's workers on a GPU (`train --workers N --mode sandblaster --gpu 0`: the workers share GPU 0, the
coordinator stays on the CPU), on the emulated device everywhere and on the real one where there is one: they
compute what workers on the CPU compute."""
import numpy as np
import pytest

from .test_sandblaster import sandblaster, weights
from .data_parallel.test_worker_gpu import use_device

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.parametrize("device", ["emulated", "cuda"])
def test_workers_on_a_gpu_compute_what_workers_on_the_cpu_compute(make_solver, tmp_path, monkeypatch, device):
    """The same samples and points, the gradients summed in the device's order: the weights after 4 L-BFGS
    iterations agree to float32 rounding (the emulated device's BLAS sums as the CPU's; a real GPU's cuDNN and
    cuBLAS in orders of their own)."""
    found = {}
    for where in ("cpu", "gpu"):
        if where == "gpu":
            use_device(monkeypatch, device)
        run = sandblaster(make_solver(max_iter=4, snapshot_prefix=str(tmp_path / where)), 2, tmp_path / "stats.json",
                          "--sample-batches", 6, "--unit-batches", 2, *(["--gpu", "0"] if where == "gpu" else []))
        assert run.returncode == 0, run.stderr[-3000:]
        found[where] = weights(tmp_path / ("%s_iter_4.caffemodel" % where))
    assert "[worker 1] computing on GPU 0: " in run.stderr, run.stderr[-3000:]
    tolerance = 1e-5 if device == "emulated" else 1e-3
    assert np.linalg.norm(found["gpu"] - found["cpu"]) / np.linalg.norm(found["cpu"]) < tolerance
