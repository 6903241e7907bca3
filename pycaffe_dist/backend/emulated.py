"""A device in host memory that runs the CUDA kernels compiled for the host (backend/kernel_source.py).

It exists so that the whole GPU code path (layers' forward_gpu/backward_gpu, the solver's device updates, blob
synchronisation, device prefetch) is exercised and compared with the CPU path on machines without a GPU: `PCD_DEVICE=
emulated` or `select.use(EmulatedDevice())`. Its "device memory" is host memory that nothing but this interface
touches, its BLAS is numpy's (column-major calls mapped back onto row-major views), its streams run in order.
It refuses every call a real GPU would refuse, and every pointer outside the memory in use (backend/strict.py),
so that such a call fails here rather than first on a GPU.
"""
import ctypes
import time

import numpy as np

from . import kernel_source, strict
from .blas_ops import RowMajorBlas
from .device import Device

_CTYPES = {"i": ctypes.c_int, "f": ctypes.c_float, "P": ctypes.c_void_p}


def _view(ptr, size, dtype=np.float32):
    dtype = np.dtype(dtype)
    if size == 0:
        return np.empty(0, dtype)
    return np.ctypeslib.as_array((ctypes.c_char * (size * dtype.itemsize)).from_address(ptr)).view(dtype)


def _matrix(ptr, rows, cols, ld):
    """The column-major rows x cols float32 matrix at ptr with leading dimension ld, as a numpy view (its transpose's
    layout). The call's arguments say what it spans, as they do to cuBLAS; backend/strict.py checked that span."""
    need = (cols - 1) * ld + rows if rows and cols else 0
    return np.lib.stride_tricks.as_strided(_view(ptr, need), shape=(rows, cols), strides=(4, ld * 4))


class _Stream:
    def synchronize(self):
        pass


class EmulatedDevice(RowMajorBlas, Device):
    name = "emulated GPU (CUDA kernels run on the host)"

    def __init__(self, index=0):
        super().__init__(kernel_source.load_signatures())
        self.index = index
        self._lib = ctypes.CDLL(str(kernel_source.ensure_host_library()))
        self._functions = {}
        self.allocator = strict.TrackedAllocator(self._device_alloc, lambda handle: None, guards=self._guards)
        self.stream = _Stream()

    @staticmethod
    def _device_alloc(nbytes):
        # the block between two guards of a known pattern (strict.TrackedAllocator.check_guards)
        memory = np.empty(nbytes + 2 * strict.GUARD_BYTES, np.uint8)
        memory[:strict.GUARD_BYTES] = memory[-strict.GUARD_BYTES:] = strict.GUARD_VALUE
        return memory.ctypes.data + strict.GUARD_BYTES, memory

    @staticmethod
    def _guards(ptr, size):
        """The guard bytes before and after the block at ptr of `size` bytes."""
        return (_view(ptr - strict.GUARD_BYTES, strict.GUARD_BYTES, np.uint8),
                _view(ptr + size, strict.GUARD_BYTES, np.uint8))

    # --- memory ------------------------------------------------------------------------------------------------
    def upload(self, dst, host, stream=None):
        strict.check_host("upload", dst, host)
        self.allocator.check("upload", "destination", dst)
        np.copyto(_view(dst.ptr, dst.size, dst.dtype), np.asarray(host).reshape(-1), casting="no")

    def download(self, src, host, stream=None):
        strict.check_host("download", src, host)
        self.allocator.check("download", "source", src)
        np.copyto(host.reshape(-1), _view(src.ptr, src.size, src.dtype), casting="no")

    def copy(self, dst, src, stream=None):
        strict.check_same_layout("copy", dst, src)
        self.allocator.check("copy", "destination", dst)
        self.allocator.check("copy", "source", src)
        _view(dst.ptr, dst.size, dst.dtype)[...] = _view(src.ptr, src.size, src.dtype)

    def memset(self, array, byte):
        self.allocator.check("memset", "destination", array)
        ctypes.memset(array.ptr, byte, array.nbytes)

    def pinned_empty(self, size, dtype=np.float32):
        return np.empty(size, dtype)

    def new_stream(self):
        return _Stream()

    def record(self, stream):
        # Its work is done when the call returns: an event is the time it was recorded.
        return time.perf_counter()

    def elapsed_ms(self, start, stop):
        return 1000.0 * (stop - start)

    def wait(self, event):
        pass

    def synchronize(self):
        pass

    def in_thread(self):
        import contextlib
        return contextlib.nullcontext()

    # --- kernels -----------------------------------------------------------------------------------------------
    def _check_launch(self, kernel, codes, n, args):
        strict.check_launch(self.allocator, kernel, codes, n, args)

    def _launch(self, kernel, codes, n, values):
        fn = self._functions.get(kernel)
        if fn is None:
            fn = getattr(self._lib, kernel)
            fn.argtypes = [_CTYPES[c] for c in codes]
            fn.restype = None
            self._functions[kernel] = fn
        fn(*values)
        for i, (code, value) in enumerate(zip(codes[1:], values[1:]), start=1):
            if code == "P":
                self.allocator.check_guards("kernel " + kernel, "argument %d" % i, value)

    # --- BLAS (cuBLAS's column-major calls) --------------------------------------------------------------------
    def _sgemm(self, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        strict.check_gemm(self.allocator, "cublasSgemm_v2", opa, opb, m, n, k, a, lda, b, ldb, c, ldc)
        self._gemm(opa, opb, m, n, k, alpha, a.ptr, lda, b.ptr, ldb, beta, c.ptr, ldc)

    @staticmethod
    def _gemm(opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """The column-major product over addresses (checked by the caller)."""
        if not (m and n):
            return
        am = _matrix(a, k, m, lda).T if opa else _matrix(a, m, k, lda)
        bm = _matrix(b, n, k, ldb).T if opb else _matrix(b, k, n, ldb)
        cm = _matrix(c, m, n, ldc)
        product = np.float32(alpha) * (am @ bm)
        if beta == 0:
            cm[...] = product
        else:
            cm *= np.float32(beta)
            cm += product

    def _sgemm_batched(self, opa, opb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                       batch):
        strict.check_gemm(self.allocator, "cublasSgemmStridedBatched", opa, opb, m, n, k, a, lda, b, ldb, c, ldc,
                          (stride_a, stride_b, stride_c), batch)
        for i in range(batch):
            self._gemm(opa, opb, m, n, k, alpha, a.ptr + 4 * i * stride_a, lda, b.ptr + 4 * i * stride_b, ldb, beta,
                       c.ptr + 4 * i * stride_c, ldc)

    def _sgemv(self, op, m, n, alpha, a, lda, x, beta, y):
        strict.check_gemv(self.allocator, "cublasSgemv_v2", op, m, n, a, lda, x, y)
        if not (m and n):
            return
        am = _matrix(a.ptr, m, n, lda)
        xs, ys = (m, n) if op else (n, m)
        xv, yv = _view(x.ptr, xs), _view(y.ptr, ys)
        product = np.float32(alpha) * ((am.T if op else am) @ xv)
        if beta == 0:
            yv[...] = product
        else:
            yv *= np.float32(beta)
            yv += product

    def axpy(self, n, alpha, x, y):
        strict.check_vector(self.allocator, "cublasSaxpy_v2", n, ("x", x), ("y", y))
        yv = _view(y.ptr, n)
        yv += np.float32(alpha) * _view(x.ptr, n)

    def scal(self, n, alpha, x):
        strict.check_vector(self.allocator, "cublasSscal_v2", n, ("x", x))
        _view(x.ptr, n)[...] *= np.float32(alpha)

    def dot(self, n, x, y):
        strict.check_vector(self.allocator, "cublasSdot_v2", n, ("x", x), ("y", y))
        return float(np.dot(_view(x.ptr, n), _view(y.ptr, n)))

    def asum(self, n, x):
        strict.check_vector(self.allocator, "cublasSasum_v2", n, ("x", x))
        return float(np.abs(_view(x.ptr, n)).sum(dtype=np.float32))

    def describe(self):
        return {"Device": self.name, "Index": self.index}
