"""Which device this process computes on, and the factory that opens it.

The process's device (`current()`) is opened on first use in GPU mode, for common.device(): a CudaDevice
(pycuda), or the host emulation where PCD_DEVICE=emulated (tests, machines without a GPU). `active()` says
whether GPU mode is on, so that layers and solvers run their GPU code.

A command chooses with --gpu, or a solver's solver_mode / device_id, as Caffe's tools/caffe.cpp:

- `--gpu N` (or `N,M,...`, or `all`) is a demand: without a usable GPU the command fails and says why.
- `solver_mode: GPU` in a solver file, without --gpu, asks for GPU `device_id` (default 0), as Caffe's train does.
  Model-zoo solvers say GPU almost always, so where there is no usable GPU we train on the CPU with a warning that
  says why, instead of refusing as a CPU-only Caffe build would.
"""
import logging
import os

from .. import common
from ..errors import DeviceError, PycaffeDistError

log = logging.getLogger("pycaffe_dist.cli")

_opened = {}        # device id -> its Device, opened once per process


def current():
    """The device of this process: opened on first use in GPU mode, for common.device()."""
    index = common.device()
    dev = _opened.get(index)
    if dev is None:
        dev = _opened[index] = open_device(index)
    return dev


def open_device(index):
    """PCD_DEVICE=emulated chooses the host emulation (tests, machines without a GPU); otherwise pycuda."""
    if os.environ.get("PCD_DEVICE", "") == "emulated":
        from .emulated import EmulatedDevice
        return EmulatedDevice(index)
    from .cuda import CudaDevice
    return CudaDevice(index)


def use(dev):
    """Make `dev` the device of common.device() (tests install an emulated device this way)."""
    _opened[common.device()] = dev
    return dev


def forget():
    _opened.clear()


def active():
    """Whether GPU mode is on: layers and solvers then run their GPU code."""
    return common.mode() == "gpu"


def parse_gpus(text):
    """'all' -> every GPU of this machine; '0' or '0,1' -> those ids."""
    if text is None:
        return []
    if text.strip() == "all":
        from .cuda import device_count
        count = device_count()
        if count == 0:
            raise DeviceError("--gpu all: the CUDA driver sees no GPU")
        return list(range(count))
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise PycaffeDistError("--gpu takes a device id, a comma-separated list of ids or 'all', got %r" % text) \
            from None
    if any(i < 0 for i in ids):
        raise PycaffeDistError("--gpu: device ids are at least 0, got %r" % text)
    return ids


def use_gpu(index):
    """GPU mode on device `index`, opened now so that a missing GPU is reported before any work."""
    common.set_device(index)
    common.set_mode_gpu()
    try:
        dev = current()
    except DeviceError:
        common.set_mode_cpu()
        raise
    log.info("Using GPU %d: %s", index, dev.name)
    return dev


def choose(gpu_flag, solver_param=None):
    """Set the process's mode for a single-process command; returns the GPU id used, or None for the CPU."""
    ids = parse_gpus(gpu_flag)
    if ids:
        if len(ids) > 1:
            raise PycaffeDistError("--gpu %s: one process computes on one GPU; train on several with --gpu and "
                                   "--workers (one worker per GPU)" % gpu_flag)
        use_gpu(ids[0])
        return ids[0]
    if solver_param is not None and solver_param.HasField("solver_mode") and \
            solver_param.solver_mode == solver_param.GPU:
        index = solver_param.device_id
        try:
            use_gpu(index)
            return index
        except DeviceError as exc:
            log.warning("solver_mode is GPU (device_id %d), but there is no usable GPU: %s. Training on the CPU.",
                        index, exc)
    common.set_mode_cpu()
    log.info("Use CPU.")
    return None
