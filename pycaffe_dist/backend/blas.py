"""numpy's BLAS, for the Cython kernels that call GEMM without the GIL.

numpy's wheels carry an ILP64 OpenBLAS (scipy-openblas64: symbols `scipy_sgemm_64_`, ...). For the convolution
shapes it runs 1.5-3x faster on these machines than scipy's LP64 OpenBLAS build, the one scipy.linalg.cython_blas
offers, so the kernels call numpy's through function pointers found here, and fall back to scipy's where numpy
was built against another BLAS.
"""
import ctypes
import functools

# (sgemm, dgemm) names of an ILP64 Fortran interface: scipy-openblas64's, then plain OpenBLAS ILP64 builds'.
_GEMM_SYMBOLS = (("scipy_sgemm_64_", "scipy_dgemm_64_"), ("sgemm_64_", "dgemm_64_"))


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


class single_threaded:
    """Keep numpy's BLAS at one thread inside the block when our own threads already split the work."""

    def __init__(self, active):
        found = numpy_blas() if active else None
        self.lib = found[0] if found else None

    def __enter__(self):
        if self.lib is not None:
            self.threads = self.lib.num_threads
            if self.threads != 1:
                self.lib.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        if self.lib is not None and self.threads != 1:
            self.lib.set_num_threads(self.threads)
