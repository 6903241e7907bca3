"""The pipeline's stages on a GPU (`train --pipeline K --gpu 0`: the stages share GPU 0, the master stays on the
CPU), on the emulated device everywhere and on the real one where there is one: they train what one process trains
on the CPU."""
import numpy as np
import pytest

from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.proto.binary import read_binary

from .test_pipeline import relative, train, weights
from .data_parallel.test_worker_gpu import use_device

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.parametrize("device", ["emulated", "cuda"])
@pytest.mark.parametrize("stages, micro, solver", [(3, 2, {}), (2, 1, {"type": "Adam", "momentum2": 0.999})])
def test_stages_on_a_gpu_train_what_one_process_trains(make_solver, tmp_path, monkeypatch, device, stages, micro,
                                                       solver):
    """Same solver, seed and data, on GPU 0: the snapshot after 10 iterations is one CPU process's to rounding (the
    device's sums in other orders). The stages update their parameters on the device (solver/updates_gpu.py): SGD
    over 2 micro-batches, and Adam's history."""
    one = train(make_solver(max_iter=10, snapshot_prefix=str(tmp_path / "one"), **solver))
    assert one.returncode == 0, one.stderr[-3000:]
    use_device(monkeypatch, device)
    piped = train(make_solver(max_iter=10, snapshot_prefix=str(tmp_path / "pipe"), **solver), "--pipeline", stages,
                  "--micro-batches", micro, "--gpu", "0")
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert all("[stage %d] computing on GPU 0: " % s in piped.stderr for s in range(stages)), piped.stderr[-3000:]
    whole, worst = relative(weights(tmp_path / "one_iter_10.caffemodel"), weights(tmp_path / "pipe_iter_10.caffemodel"))
    tolerance = 1e-5 if device == "emulated" else 1e-3
    assert whole < tolerance, (whole, worst)
    # the solver's history, updated on the device, is read back for the snapshot
    one_history, piped_history = (history(tmp_path / ("%s_iter_10.solverstate" % name)) for name in ("one", "pipe"))
    assert one_history.shape == piped_history.shape
    assert np.linalg.norm(piped_history - one_history) / np.linalg.norm(one_history) < tolerance


def history(path):
    state = caffe_pb2.SolverState()
    read_binary(str(path), state)
    return np.concatenate([np.array(blob.data, np.float64) for blob in state.history])
