"""The pipeline's stages on a GPU (`train --pipeline K --gpu 0`: the stages share GPU 0, the master stays on the
CPU), on the emulated device everywhere and on the real one where there is one: they train what one process trains
on the CPU."""
import pytest

from .test_pipeline import relative, train, weights
from .test_worker_gpu import use_device

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.parametrize("device", ["emulated", "cuda"])
def test_stages_on_a_gpu_train_what_one_process_trains(make_solver, tmp_path, monkeypatch, device):
    """Same solver, seed and data, 3 stages of 2 micro-batches on GPU 0: the snapshot after 10 iterations is one
    CPU process's to rounding (the device's sums in other orders)."""
    one = train(make_solver(max_iter=10, snapshot_prefix=str(tmp_path / "one")))
    assert one.returncode == 0, one.stderr[-3000:]
    use_device(monkeypatch, device)
    piped = train(make_solver(max_iter=10, snapshot_prefix=str(tmp_path / "pipe")), "--pipeline", 3,
                  "--micro-batches", 2, "--gpu", "0")
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert all("[stage %d] computing on GPU 0: " % s in piped.stderr for s in range(3)), piped.stderr[-3000:]
    whole, worst = relative(weights(tmp_path / "one_iter_10.caffemodel"), weights(tmp_path / "pipe_iter_10.caffemodel"))
    assert whole < (1e-5 if device == "emulated" else 1e-3), (whole, worst)
