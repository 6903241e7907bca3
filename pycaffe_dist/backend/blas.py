"""numpy's BLAS, for the Cython kernels that call GEMM without the GIL.

numpy's wheels carry an ILP64 OpenBLAS (scipy-openblas64: symbols `scipy_sgemm_64_`, ...). For the convolution
shapes it runs 1.5-3x faster on these machines than scipy's LP64 OpenBLAS build, the one scipy.linalg.cython_blas
offers, so the kernels call numpy's through function pointers found here, and fall back to scipy's where numpy
was built against another BLAS. scipy.linalg is imported only then: its import takes 0.3-0.5 s.
"""
import ctypes
import functools

import numpy as np

from .. import common

# (sgemm, dgemm) names of an ILP64 Fortran interface: scipy-openblas64's, then plain OpenBLAS ILP64 builds'.
_GEMM_SYMBOLS = (("scipy_sgemm_64_", "scipy_dgemm_64_"), ("sgemm_64_", "dgemm_64_"))


def scipy_blas():
    """(sgemm address, dgemm address) of scipy.linalg.cython_blas (LP64), from the capsules of its C API."""
    from scipy.linalg import cython_blas
    get_name, get_pointer = ctypes.pythonapi.PyCapsule_GetName, ctypes.pythonapi.PyCapsule_GetPointer
    get_name.argtypes, get_name.restype = [ctypes.py_object], ctypes.c_char_p
    get_pointer.argtypes, get_pointer.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p
    capsules = [cython_blas.__pyx_capi__[name] for name in ("sgemm", "dgemm")]
    return tuple(get_pointer(capsule, get_name(capsule)) for capsule in capsules)


@functools.lru_cache(maxsize=1)
def numpy_blas():
    """(threadpoolctl controller, sgemm address, dgemm address) of numpy's ILP64 BLAS, or None."""
    from threadpoolctl import ThreadpoolController
    for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
        if "numpy" not in lib.filepath:
            continue
        try:
            handle = ctypes.CDLL(lib.filepath)
        except OSError:
            return None
        for sgemm, dgemm in _GEMM_SYMBOLS:
            try:
                addresses = [ctypes.cast(getattr(handle, name), ctypes.c_void_p).value for name in (sgemm, dgemm)]
            except AttributeError:
                continue
            return lib, addresses[0], addresses[1]
    return None


_loaded = {}


def kernel(name):
    """The GEMM-calling kernel module `name` of pycaffe_dist._kernels (conv_im2col, gemm), imported on first use and
    pointed at numpy's BLAS where that is found, else at scipy's. Every BLAS is set to one thread then: our OpenMP
    threads split the work (csrc/gemm.pyx)."""
    module = _loaded.get(name)
    if module is None:
        import importlib
        module = importlib.import_module("pycaffe_dist._kernels." + name)
        found = numpy_blas()
        if found:
            module.use_blas(found[1], found[2], True)
        else:
            module.use_blas(*scipy_blas(), False)
        common.single_threaded_blas()
        _loaded[name] = module
    return module


def gemm(trans_a, trans_b, alpha, a, b, beta, c):
    """c = alpha op(a) op(b) + beta c (row-major 2-D arrays of one dtype, c C-contiguous), split across our
    threads; op(x) = x.T where trans_* is set. Non-contiguous a, b are copied first."""
    dtype = c.dtype
    kernel("gemm").gemm(bool(trans_a), bool(trans_b), alpha, np.ascontiguousarray(a, dtype=dtype),
                        np.ascontiguousarray(b, dtype=dtype), beta, c, common.num_threads())
