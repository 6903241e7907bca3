"""The GPU code path, on two devices: `emulated` (the CUDA kernels compiled for the host, numpy's BLAS; runs
everywhere) and `cuda` (a real GPU through pycuda; skipped, with the reason, where there is none)."""
import pytest

from pycaffe_dist import common
from pycaffe_dist.backend import select
from pycaffe_dist.errors import DeviceError

_cuda = {}


@pytest.fixture(autouse=True)
def convolutions_without_transforms(monkeypatch):
    """cuDNN's convolutions without FFT or Winograd (PCD_CUDNN_TRANSFORMS=0) unless a test allows them: these tests
    hold cuDNN to our kernels and Caffe's goldens at summation-order tolerances. The transforms, allowed by default
    (backend/cudnn.py), are held to their own tolerance in test_cudnn_gpu.py; the CLI and worker tests outside
    tests/gpu train with the default."""
    monkeypatch.setenv("PCD_CUDNN_TRANSFORMS", "0")


def cuda_device():
    """The real device, or pytest.skip with why there is none (asked once per session)."""
    if "device" not in _cuda:
        try:
            from pycaffe_dist.backend.cuda import CudaDevice
            _cuda["device"] = CudaDevice(0)
        except DeviceError as exc:
            _cuda["device"], _cuda["why"] = None, str(exc)
    if _cuda["device"] is None:
        pytest.skip("no GPU: " + _cuda["why"])
    return _cuda["device"]


@pytest.fixture(params=["emulated", "cuda"])
def gpu(request):
    """GPU mode on the emulated or the real device, back to CPU mode afterwards; yields the device."""
    if request.param == "cuda":
        dev = cuda_device()
    else:
        from pycaffe_dist.backend.emulated import EmulatedDevice
        dev = EmulatedDevice()
    previous = common.mode()
    select.use(dev)
    common.set_mode_gpu()
    try:
        yield dev
    finally:
        if previous == "cpu":
            common.set_mode_cpu()
        select.forget()
