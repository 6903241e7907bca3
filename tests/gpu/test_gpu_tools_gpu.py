"""tools/gpu_calls.py (every call of a training step counted, nothing run) and tools/gpu_host_costs.py (the host's
time of each call), on the emulated device: they must count the path a real GPU takes, cuDNN's calls included."""
import os
import pathlib
import subprocess
import sys

import pytest

from pycaffe_dist import common

TOOLS = pathlib.Path(__file__).resolve().parents[2] / "tools"


@pytest.fixture
def gpu_calls():
    sys.path.insert(0, str(TOOLS))
    try:
        import gpu_calls
        yield gpu_calls
    finally:
        sys.path.remove(str(TOOLS))


def cudnn_calls_by_name(gpu_calls, monkeypatch, net_name):
    """gpu_calls.measure of one step of `net_name`, and the counting cuDNN's calls of that step by function."""
    devices = []
    made = gpu_calls.counting_device
    monkeypatch.setattr(gpu_calls, "counting_device", lambda: devices.append(made()) or devices[-1])
    per, _, fused, _ = gpu_calls.measure(net_name, 1)
    return per, dict(devices[0].cudnn_calls), fused


def test_the_counts_follow_the_cudnn_path_of_a_real_gpu(gpu_calls, monkeypatch):
    """CIFAR-10 quick on a GPU with cuDNN: 3 convolutions forward, each with a weight gradient and a bias gradient,
    2 with a bottom gradient (not conv1's: the data needs none); conv2 and conv3 fused with their ReLUs forward (the
    bias and the ReLU in our kernel), relu1 after pool1 on cuDNN's activation; MAX pooling on our kernels (as Caffe's
    factory: cuDNN's max pooling is not Caffe's)."""
    assert common.mode() == "cpu"
    per, names, fused = cudnn_calls_by_name(gpu_calls, monkeypatch, "cifar10_quick")
    assert per["cuDNN"] == 16 and fused == "2 (4 layers)"
    assert names == {
        "cudnnConvolutionForward": 3, "cudnnAddTensor": 1, "cudnnActivationForward": 1, "cudnnActivationBackward": 3,
        "cudnnConvolutionBackwardBias": 3, "cudnnConvolutionBackwardFilter": 3, "cudnnConvolutionBackwardData": 2}
    assert common.mode() == "cpu"       # measure leaves the process as it found it
    without, _, _, _ = gpu_calls.measure("cifar10_quick", 1, with_cudnn=False)
    assert "cuDNN" not in without and without["kernel launches"] > per["kernel launches"]


def test_host_costs_time_the_calls_the_counts_name():
    """gpu_host_costs on the emulated device: its calls a step agree with gpu_calls's count of the same path (our
    kernels: the emulated device has no cuDNN)."""
    out = subprocess.run([sys.executable, str(TOOLS / "gpu_host_costs.py"), "--nets", "lenet", "--iterations", "1",
                          "--top", "50"], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PCD_DEVICE": "emulated"})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "lenet: step" in text and "Python between them" in text
    assert "calls that wait for the GPU: not asked (the emulated device" in text
    kinds = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in text.splitlines()
             if line.startswith("| ") and line.split("|")[1].strip() in ("kernel", "BLAS", "memory")}
    sys.path.insert(0, str(TOOLS))
    try:
        import gpu_calls
        per, _, _, _ = gpu_calls.measure("lenet", 1, with_cudnn=False)
    finally:
        sys.path.remove(str(TOOLS))
    assert kinds["kernel"] == per["kernel launches"]
    assert kinds["BLAS"] == sum(per.get(kind, 0) for kind in ("GEMM", "GEMV", "axpy, scal", "dot", "asum"))


def test_host_costs_name_the_calls_that_wait_for_the_gpu(gpu):
    """The probe for calls that wait for the GPU: steps with a GEMM queued ahead are timed as the others (on the
    emulated device every call runs at once, so this checks the mechanics), and a call whose time a step grew by
    more than half the queued work is named; the first of a step that waits takes all of it."""
    sys.path.insert(0, str(TOOLS))
    try:
        import gpu_host_costs
    finally:
        sys.path.remove(str(TOOLS))
    queue, ahead_ms = gpu_host_costs.gpu_work(gpu, n=32)
    assert ahead_ms > 0
    out = gpu.empty(4)
    clock, wall, host = gpu_host_costs.timed_steps(gpu, lambda: gpu.memset(out, 0), 3, ahead=queue)
    assert clock.calls == {("memory", "memset"): 3} and wall >= host > 0
    grown = {("cuDNN", "cudnnConvolutionBackwardFilter"): 2.6e-3, ("cuBLAS", "cublasSgemm_v2"): 1.4e-3,
             ("kernel", "relu_forward"): 4e-6}
    assert gpu_host_costs.waiting_calls(2.7, grown) == [("cuDNN", "cudnnConvolutionBackwardFilter"),
                                                        ("cuBLAS", "cublasSgemm_v2")]
    assert gpu_host_costs.waiting_calls(2.7, {("kernel", "relu_forward"): 4e-6}) == []
