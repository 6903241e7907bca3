"""The GPU options of the CLI: device-query, --gpu, a solver's solver_mode GPU, and a whole `train --gpu 0` on the
emulated device (PCD_DEVICE=emulated), which must give the CPU run's weights."""
import subprocess
import sys

import numpy as np
import pytest

from pycaffe_dist.errors import DeviceError
from tests.cli.commands import assert_clean_error, child_env, dist_caffe
from tests.cli.test_training import case, params  # noqa: F401  (the fixture)


def _gpu_reason():
    """Why this machine has no usable GPU, or None where it has one."""
    try:
        from pycaffe_dist.backend.cuda import CudaDevice
        CudaDevice(0)
        return None
    except DeviceError as exc:
        return str(exc)


NO_GPU = _gpu_reason()
needs_no_gpu = pytest.mark.skipif(NO_GPU is None, reason="this machine has a GPU")


def test_device_query_names_the_gpu_or_why_there_is_none():
    run = dist_caffe("device-query")
    assert run.returncode == 0 and "CPU: " in run.stdout and "CUDA kernels: " in run.stdout
    if NO_GPU is None:
        assert "GPU 0:" in run.stdout and "Compute capability" in run.stdout
    else:
        assert "GPU: none (%s); training runs on the CPU" % NO_GPU in run.stdout


@needs_no_gpu
def test_gpu_flag_without_a_gpu_is_a_clean_error(case):
    assert_clean_error(dist_caffe("train", "--solver", "solver.prototxt", "--gpu", "0", cwd=case), NO_GPU)


def test_gpu_flag_is_checked(case):
    assert_clean_error(dist_caffe("train", "--solver", "solver.prototxt", "--gpu", "first", cwd=case),
                       "--gpu takes a device id, a comma-separated list of ids or 'all', got 'first'")


@needs_no_gpu
def test_solver_mode_gpu_without_a_gpu_trains_on_the_cpu_with_a_warning(case):
    solver = case / "solver.prototxt"
    solver.write_text(solver.read_text().replace("solver_mode: CPU", "") + "\nsolver_mode: GPU\ndevice_id: 0\n")
    run = dist_caffe("train", "--solver", "solver.prototxt", "--iterations", "2", cwd=case)
    assert run.returncode == 0, run.stderr
    assert "solver_mode is GPU (device_id 0), but there is no usable GPU: %s. Training on the CPU." % NO_GPU \
        in run.stderr and "Use CPU." in run.stderr


def test_train_on_the_emulated_gpu_gives_the_cpu_weights(case):
    cpu = dist_caffe("train", "--solver", "solver.prototxt", "--weights", "init.caffemodel", cwd=case)
    assert cpu.returncode == 0, cpu.stderr
    want = params(case / "snap_iter_10.caffemodel")
    gpu = subprocess.run([sys.executable, "-m", "pycaffe_dist", "train", "--solver", "solver.prototxt", "--weights",
                          "init.caffemodel", "--gpu", "0"], capture_output=True, text=True, cwd=case,
                         env=dict(child_env(), PCD_DEVICE="emulated"))
    assert gpu.returncode == 0, gpu.stderr
    assert "Using GPU 0: emulated GPU" in gpu.stderr
    for key, value in params(case / "snap_iter_10.caffemodel").items():
        np.testing.assert_allclose(value, want[key], rtol=1e-5, atol=1e-7, err_msg=key)
