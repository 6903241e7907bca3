"""With one worker, the distributed modes must train what the local Solver trains: async (overlapped: the next
round starts from W plus the delta in flight) and sync give the local run's weights, up to float32 rounding of
W + (x' - x). Gradient-only without overlap is the local run with the update on the master. A gossip worker alone has
no peer to average with: it is the local run, and the master's mean is its weights. Local SGD with outer rate 1 and
no momentum is sync with tau local steps, bit for bit, at 3 workers (where the order of a sum shows)."""
import numpy as np
import pytest

from pycaffe_dist.io.caffemodel import load_weights
from pycaffe_dist.solver.solver import Solver

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ITERS = 60


def _local_weights(solver_path):
    solver = Solver(str(solver_path))
    solver.step(ITERS)
    return [b.data.copy() for b in solver.net.learnable_params], solver


@pytest.mark.parametrize("mode,options", [("async", []), ("sync", []), ("async", ["--tau", 3]),
                                          ("gradient-only", ["--no-overlap"]), ("gossip", [])])
def test_one_worker_trains_what_the_local_solver_trains(mode, options, procs, make_solver, tmp_path):
    solver_path = make_solver(max_iter=ITERS // (3 if "--tau" in options else 1))
    expected, solver = _local_weights(solver_path)
    procs.master("one-" + mode, solver_path, mode, 1, *options)
    procs.worker("one-" + mode, 0)
    procs.check("master")
    net = solver.net
    load_weights(net, str(tmp_path / ("snap_iter_%d.caffemodel" % (ITERS // (3 if "--tau" in options else 1)))))
    got = [b.data for b in net.learnable_params]
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=2e-6)
    assert max(np.abs(e).max() for e in expected) > 0.1     # the weights did move


def _final_weights(procs, solver_path, job, mode, workers, *options):
    procs.master(job, solver_path, mode, workers, *options, name=job)
    for index in range(workers):
        procs.start("%s-worker%d" % (job, index), "worker", "--redis", procs.url, "--job", job, "--id", index)
    procs.check(job)
    return load_weights_of(solver_path)


def load_weights_of(solver_path):
    """The weights of the solver's last snapshot (snapshot_prefix, max_iter)."""
    solver = Solver(str(solver_path))
    path = "%s_iter_%d.caffemodel" % (solver.param.snapshot_prefix, solver.param.max_iter)
    load_weights(solver.net, path)
    return [b.data.copy() for b in solver.net.learnable_params]


@pytest.mark.parametrize("overlap", ["--no-overlap", "--overlap"])
def test_local_sgd_with_rate_1_and_no_momentum_is_sync_bit_for_bit(overlap, procs, make_solver, tmp_path):
    """Same seed, same shards, 3 workers, 20 rounds of 3 local steps: the final snapshots are equal to the bit."""
    runs = []
    for mode, options in (("sync", []), ("local-sgd", ["--outer-lr", 1, "--outer-momentum", 0])):
        solver_path = make_solver(max_iter=20, snapshot_prefix=str(tmp_path / mode))
        runs.append(_final_weights(procs, solver_path, mode, mode, 3, "--tau", 3, overlap, *options))
    for s, l in zip(*runs):
        np.testing.assert_array_equal(l, s)
    assert max(np.abs(w).max() for w in runs[0]) > 0.1
