"""Process-wide state, as Caffe's `Caffe` singleton holds it: mode (CPU/GPU), device and the random stream."""
import numpy as np

_state = {"mode": "cpu", "device": 0, "rng": np.random.default_rng()}


def set_mode_cpu():
    _state["mode"] = "cpu"


def set_mode_gpu():
    _state["mode"] = "gpu"


def set_device(device_id):
    _state["device"] = int(device_id)


def mode():
    return _state["mode"]


def device():
    return _state["device"]


def set_random_seed(seed):
    """Seed every random choice we make (fillers, dropout, shuffling); like caffe.set_random_seed."""
    _state["rng"] = np.random.default_rng(int(seed))


def rng():
    return _state["rng"]


def set_num_threads(n):
    """Threads for the CPU work: the BLAS's (GEMMs) and the OpenMP kernels' (csrc/). Caffe's CPU build uses
    OPENBLAS_NUM_THREADS for the former and is single-threaded otherwise."""
    from threadpoolctl import threadpool_limits
    from ._kernels import parallel
    n = max(1, int(n))
    _state["blas_limits"] = threadpool_limits(limits=n, user_api="blas")   # kept: the limit holds while it lives
    parallel.set_num_threads(n)


def num_threads():
    from ._kernels import parallel
    return parallel.get_num_threads()
