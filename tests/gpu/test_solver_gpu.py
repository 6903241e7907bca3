"""The solvers in GPU mode: Caffe's solver goldens, equality with the CPU path, state on the device, snapshots
and restores through the host copies, no device allocation per iteration."""
import threading

import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.blob import synced_memory
from tests.solver import test_golden_solvers as golden
from tests.solver.test_golden_solvers import CASES, make_solver, params_of


@pytest.mark.parametrize("case", CASES)
def test_ten_iterations_match_caffe_on_gpu(gpu, case, tmp_path, monkeypatch):
    golden.test_ten_iterations_match_caffe(case, tmp_path, monkeypatch)


@pytest.mark.parametrize("case", ["sgd_clip_gradients", "adam", "adadelta"])
def test_caffes_solverstate_restores_and_continues_on_gpu(gpu, case, tmp_path, monkeypatch):
    golden.test_caffes_solverstate_restores_and_continues(case, tmp_path, monkeypatch)


@pytest.mark.parametrize("case", CASES)
def test_gpu_run_equals_cpu_run(gpu, case, tmp_path, monkeypatch):
    common.set_mode_cpu()
    cpu = make_solver(case, tmp_path, monkeypatch)
    cpu.step(12)
    common.set_mode_gpu()
    on_gpu = make_solver(case, tmp_path, monkeypatch)
    on_gpu.step(5)
    # Count the allocations of the training thread (the prefetch threads allocate until their queues are full).
    allocate, main_thread_allocations = gpu.allocator._alloc, []

    def counting(nbytes):
        if threading.current_thread() is threading.main_thread():
            main_thread_allocations.append(nbytes)
        return allocate(nbytes)
    gpu.allocator._alloc = counting
    # The weights, the history and the gradients never left the device during training.
    for blob in on_gpu.net.learnable_params:
        assert blob.data_memory.head == synced_memory.DEVICE and blob.diff_memory.head == synced_memory.DEVICE
    on_gpu.step(7)
    assert main_thread_allocations == [], "device memory allocated after iteration 5 (tests at 5 and 10 included)"
    # Emulated: the same float operations as the CPU path (tolerance for BLAS summation order); a real GPU
    # contracts multiply-adds into FMAs.
    tol = dict(rtol=1e-5, atol=1e-7) if gpu.name.startswith("emulated") else dict(rtol=1e-4, atol=1e-6)
    ours, want = params_of(on_gpu), params_of(cpu)
    for key in want:
        np.testing.assert_allclose(ours[key], want[key], err_msg=key, **tol)
    for i, (h_gpu, h_cpu) in enumerate(zip(on_gpu.history, cpu.history)):
        np.testing.assert_allclose(h_gpu, h_cpu, err_msg="history/%d" % i, **tol)


def test_snapshot_on_gpu_restores_on_cpu(gpu, tmp_path, monkeypatch):
    solver = make_solver("adam", tmp_path, monkeypatch)
    solver.step(3)
    _, state = solver.snapshot()
    weights = params_of(solver)
    history = [h.copy() for h in solver.history]
    common.set_mode_cpu()
    restored = make_solver("adam", tmp_path, monkeypatch, weights=False)
    restored.restore(state)
    for key, value in params_of(restored).items():
        np.testing.assert_array_equal(value, weights[key], err_msg=key)
    for ours, theirs in zip(restored.history, history):
        np.testing.assert_array_equal(ours, theirs)


def test_a_workers_weights_move_between_the_device_and_host_arrays_directly(gpu, tmp_path, monkeypatch):
    """What a distributed worker uses: set_weights uploads straight into the device copies (the host copies are
    not written), read_weights and compute_gradients download into the arrays given, leaving the device copies
    current."""
    solver = make_solver("sgd_lr_step", tmp_path, monkeypatch)
    blobs = solver.net.learnable_params
    rng = np.random.default_rng(3)
    start = [rng.standard_normal(shape).astype(np.float32) for shape in solver.weight_shapes]
    hosts_before = [blob.data_memory._host.copy() if blob.data_memory._host is not None else None for blob in blobs]
    solver.set_weights(start)
    for blob, before in zip(blobs, hosts_before):
        assert blob.data_memory.head == synced_memory.DEVICE
        if before is not None:
            np.testing.assert_array_equal(blob.data_memory._host, before)
    out = [np.empty(shape, np.float32) for shape in solver.weight_shapes]
    assert solver.read_weights(out) is out
    for got, want in zip(out, start):
        np.testing.assert_array_equal(got, want)
    gradients, loss = solver.compute_gradients(out=[np.empty(s, np.float32) for s in solver.weight_shapes])
    assert np.isfinite(loss)
    for blob, g in zip(blobs, gradients):
        assert blob.diff_memory.head == synced_memory.DEVICE
        np.testing.assert_array_equal(g, blob.cpu_diff)


def test_an_sgd_update_is_two_launches_over_every_parameter(gpu, tmp_path, monkeypatch):
    """SGD with L2 decay updates every parameter in one launch and applies the steps in one more (Caffe: a
    regularize, an update and an axpy per parameter); a rate scale (the distributed modes') remakes the table,
    and the weights are the CPU's."""
    results = []
    for on_gpu in (False, True):
        (common.set_mode_gpu if on_gpu else common.set_mode_cpu)()
        solver = make_solver("sgd_momentum", tmp_path, monkeypatch)
        assert solver.param.weight_decay and len(solver.net.learnable_params) >= 4
        solver.step(2)
        calls = []
        if on_gpu:
            for name in ("_launch", "axpy", "scal"):
                method = getattr(gpu, name)

                def logged(*args, _name=name, _method=method, **kwargs):
                    calls.append(args[0] if _name == "_launch" else _name)
                    return _method(*args, **kwargs)
                setattr(gpu, name, logged)
        try:
            solver.net.forward_backward()
            del calls[:]
            solver.apply_update()
            update_calls = list(calls)
            solver.net.clear_param_diffs()
            solver.net.forward_backward()
            solver.apply_update(rate_scale=0.5)
        finally:
            for name in ("_launch", "axpy", "scal"):
                gpu.__dict__.pop(name, None)
        if on_gpu:
            assert update_calls == ["sgd_update_many", "apply_update_many"]
        results.append(params_of(solver))
    cpu, dev = results
    for key in cpu:
        np.testing.assert_allclose(dev[key], cpu[key], err_msg=key, rtol=1e-5, atol=1e-7)


def test_lars_clips_a_scaled_rate_on_the_device_as_on_the_cpu(gpu, tmp_path, monkeypatch):
    """--lars on a GPU worker (Solver._trust_clipped): the blobs' norms come from the device, and the clipped
    multipliers, hence the weights, are the CPU run's; the clip binds at this scale (the run differs from the
    unclipped one)."""
    runs = {}
    for mode, trust in (("cpu", 0.001), ("gpu", 0.001), ("unclipped", None)):
        (common.set_mode_gpu if mode == "gpu" else common.set_mode_cpu)()
        solver = make_solver("sgd_momentum", tmp_path, monkeypatch)
        solver.trust = trust
        solver.step_from(0, 4, rate_scale=100.0)
        runs[mode] = params_of(solver)
    tol = dict(rtol=1e-5, atol=1e-7) if gpu.name.startswith("emulated") else dict(rtol=1e-4, atol=1e-6)
    for key in runs["cpu"]:
        np.testing.assert_allclose(runs["gpu"][key], runs["cpu"][key], err_msg=key, **tol)
    assert any(not np.allclose(runs["cpu"][key], runs["unclipped"][key]) for key in runs["cpu"])
