"""All-reduce workers (distributed/allreduce/worker.py) as a user runs them, `dist_caffe train --workers N --mode
allreduce`: the same W as one process with iter_size N, on every worker; LeNet's accuracy on a given number of
images at 2 and 8 workers; what a worker moves per iteration."""
import numpy as np
import pytest

from pycaffe_dist.io import caffemodel
from pycaffe_dist.io.load import read_solver
from pycaffe_dist.solver.solver import Solver

from ..conftest import accuracies, needs_fashion_mnist, train_on_workers
from .conftest import needs_mpi

pytestmark = needs_mpi


def read_model(path, solver):
    """The weights of a .caffemodel, in the order of `solver`'s learnable blobs."""
    other = Solver(solver)
    caffemodel.load_weights(other.train_net, str(path))
    return [w.copy() for w in other.weights]


def assert_one_process_with_iter_size(solver, workers, snapshot, iterations=20):
    """The workers' W in `snapshot` is what one process gives with iter_size `workers` (--lr-scaling none), to 1e-5
    relative."""
    param = read_solver(str(solver))
    param.iter_size, param.snapshot_after_train = workers, False
    one = Solver(param)
    one.step(iterations)
    for mine, theirs in zip(one.weights, read_model(snapshot, param)):
        assert np.abs(mine - theirs).max() <= 1e-5 * np.abs(mine).max()


def test_four_workers_equal_one_process_with_iter_size_four_and_each_other(make_solver, tmp_path):
    solver = make_solver(max_iter=20, test_interval=1000, test_initialization=False, snapshot_after_train=True)
    done = train_on_workers(solver, 4, "allreduce", tmp_path / "stats.json", "--lr-scaling", "none")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_one_process_with_iter_size(solver, 4, tmp_path / "snap_iter_20.caffemodel")
    import json
    stats = json.loads((tmp_path / "stats.json").read_text())
    # every worker's W hashed and gathered at the end: the job fails where they differ
    assert stats["weights_identical"] and stats["count"] == 20 and stats["world"] == 4
    # a ring: each worker sends 2 (N - 1) / N of the gradients (and three floats of flags) per iteration
    assert stats["hub_bytes_per_merge"] == pytest.approx(2 * 3 / 4 * (stats["model_bytes"] + 12), rel=0.01)


@needs_fashion_mnist
@pytest.mark.parametrize("workers, least", [(2, 0.85), (8, 0.82)])
def test_lenet_reaches_its_accuracy_on_the_images_of_2000_batches(workers, least, lenet_solver, tmp_path):
    """No options: the rate scaled by N (lr_scaling.py), so N workers need about one process's images."""
    solver = lenet_solver(max_iter=2000 // workers)
    done = train_on_workers(solver, workers, "allreduce", tmp_path / "stats.json")
    assert done.returncode == 0, done.stderr[-3000:]
    import json
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert accuracies(stats)[-1] >= least, (accuracies(stats), done.stderr[-2000:])
    assert stats["hub_bytes_per_merge"] <= 2 * stats["model_bytes"]


@pytest.mark.parametrize("device", ["emulated", "cuda"])
def test_workers_on_a_gpu_move_their_gradients_through_pinned_buffers(device, make_solver, tmp_path, monkeypatch):
    """`--gpu 0`: every worker computes on GPU 0; each bucket goes device -> page-locked host buffer -> ring ->
    device (buckets.py), and W stays the same on every worker."""
    from ..data_parallel.test_worker_gpu import use_device
    use_device(monkeypatch, device)
    solver = make_solver(max_iter=100, test_interval=100, test_initialization=False)
    done = train_on_workers(solver, 2, "allreduce", tmp_path / "stats.json", "--gpu", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("computing on GPU 0: ") == 2, done.stderr[-3000:]
    import json
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["weights_identical"] and stats["tests"][-1]["scores"]["accuracy"] > 0.8, stats["tests"]
