"""Process-wide state, as Caffe's `Caffe` singleton holds it: mode (CPU/GPU), device and the random stream."""
import numpy as np

# seed: the last set_random_seed's (None: never seeded, draws come from fresh entropy); seed_version: how many times
# it was called, so that the layers' random streams (random_stream.py) restart at every reseeding.
_state = {"mode": "cpu", "device": 0, "rng": np.random.default_rng(), "seed": None, "seed_version": 0,
          "data_shard": (0, 1)}


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
    """Seed every random choice we make (fillers, dropout, shuffling); like caffe.set_random_seed. The layers that
    draw at every forward (Dropout, stochastic pooling) restart their streams from this seed (random_stream.py)."""
    _state["rng"] = np.random.default_rng(int(seed))
    _state["seed"] = int(seed)
    _state["seed_version"] += 1


def rng():
    return _state["rng"]


def random_seed():
    """The seed last given to set_random_seed, or None when the process was never seeded."""
    return _state["seed"]


def random_seed_version():
    """A number that changes at every set_random_seed."""
    return _state["seed_version"]


def set_data_shard(index, count):
    """Make the TRAIN-phase Data layers built from now on read shard `index` of `count`: the records at positions p
    with p % count == index. Caffe's multi-GPU DataLayer keeps (offset % solver_count) == solver_rank the same way;
    TEST-phase layers always read every record."""
    index, count = int(index), int(count)
    if count < 1 or not 0 <= index < count:
        raise ValueError("data shard %d of %d: need 0 <= index < count" % (index, count))
    _state["data_shard"] = (index, count)


def data_shard():
    return _state["data_shard"]


def set_num_threads(n):
    """Threads for the CPU work: our OpenMP threads run the kernels (csrc/) and split the GEMMs, while every BLAS
    stays at one thread (csrc/gemm.pyx says why). Caffe's CPU build threads only inside OpenBLAS
    (OPENBLAS_NUM_THREADS)."""
    from ._kernels import parallel
    single_threaded_blas()
    parallel.set_num_threads(max(1, int(n)))


def single_threaded_blas():
    """Keep every loaded BLAS at one thread: our threads already split the work (also without set_num_threads,
    as the GEMM kernels load: backend/blas.py)."""
    from threadpoolctl import ThreadpoolController
    for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
        lib.set_num_threads(1)


def num_threads():
    # the kernel module found once: an import statement per call cost 2 us, and a LeNet iteration asks 10 times
    parallel = _state.get("parallel")
    if parallel is None:
        from ._kernels import parallel
        _state["parallel"] = parallel
    return parallel.get_num_threads()
