"""A device in host memory that runs the CUDA kernels compiled for the host (backend/kernel_source.py).

It exists so that the whole GPU code path (layers' forward_gpu/backward_gpu, the solver's device updates, blob
synchronisation, device prefetch) is exercised and compared with the CPU path on machines without a GPU: `PCD_DEVICE=
emulated` or `select.use(EmulatedDevice())`. Its "device memory" is host memory that nothing but this interface
touches, its BLAS is numpy's (column-major calls mapped back onto row-major views), its streams run in order.
"""
import ctypes

import numpy as np

from . import kernel_source
from .blas_ops import RowMajorBlas
from .device import CachingAllocator, Device

_CTYPES = {"i": ctypes.c_int, "f": ctypes.c_float, "P": ctypes.c_void_p}


def _view(ptr, size, dtype=np.float32):
    dtype = np.dtype(dtype)
    if size == 0:
        return np.empty(0, dtype)
    return np.ctypeslib.as_array((ctypes.c_char * (size * dtype.itemsize)).from_address(ptr)).view(dtype)


def _matrix(array, rows, cols, ld):
    """A column-major rows x cols matrix with leading dimension ld, as a numpy view (its transpose's layout)."""
    flat = _view(array.ptr, array.size, array.dtype)
    need = (cols - 1) * ld + rows if rows and cols else 0
    return np.lib.stride_tricks.as_strided(flat[:max(need, 0)], shape=(rows, cols),
                                           strides=(flat.itemsize, ld * flat.itemsize))


def _offset(array, offset):
    """array.at(offset), except that a stride-0 operand may be shorter than the batch's extent."""
    return array.at(offset) if offset else array


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
        self.allocator = CachingAllocator(self._device_alloc, lambda handle: None)
        self.stream = _Stream()

    @staticmethod
    def _device_alloc(nbytes):
        memory = np.empty(nbytes, np.uint8)
        return memory.ctypes.data, memory

    # --- memory ------------------------------------------------------------------------------------------------
    def host_view(self, array):
        """The emulated device memory of `array` as a numpy array (tests only)."""
        return _view(array.ptr, array.size, array.dtype)

    def upload(self, dst, host, stream=None):
        np.copyto(_view(dst.ptr, dst.size, dst.dtype), np.asarray(host).reshape(-1), casting="no")

    def download(self, src, host, stream=None):
        np.copyto(host.reshape(-1), _view(src.ptr, src.size, src.dtype), casting="no")

    def copy(self, dst, src, stream=None):
        _view(dst.ptr, dst.size, dst.dtype)[...] = _view(src.ptr, src.size, src.dtype)

    def memset(self, array, byte):
        ctypes.memset(array.ptr, byte, array.nbytes)

    def pinned_empty(self, size, dtype=np.float32):
        return np.empty(size, dtype)

    def new_stream(self):
        return _Stream()

    def record(self, stream):
        return None

    def wait(self, event):
        pass

    def synchronize(self):
        pass

    def in_thread(self):
        import contextlib
        return contextlib.nullcontext()

    # --- kernels -----------------------------------------------------------------------------------------------
    def _launch(self, kernel, codes, n, values):
        fn = self._functions.get(kernel)
        if fn is None:
            fn = getattr(self._lib, kernel)
            fn.argtypes = [_CTYPES[c] for c in codes]
            fn.restype = None
            self._functions[kernel] = fn
        fn(*values)

    # --- BLAS (cuBLAS's column-major calls) --------------------------------------------------------------------
    def _sgemm(self, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
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
        for i in range(batch):
            self._sgemm(opa, opb, m, n, k, alpha, _offset(a, i * stride_a), lda, _offset(b, i * stride_b), ldb, beta,
                        _offset(c, i * stride_c), ldc)

    def _sgemv(self, op, m, n, alpha, a, lda, x, beta, y):
        am = _matrix(a, m, n, lda)
        xs, ys = (m, n) if op else (n, m)
        xv, yv = _view(x.ptr, xs), _view(y.ptr, ys)
        product = np.float32(alpha) * ((am.T if op else am) @ xv)
        if beta == 0:
            yv[...] = product
        else:
            yv *= np.float32(beta)
            yv += product

    def axpy(self, n, alpha, x, y):
        yv = _view(y.ptr, n)
        yv += np.float32(alpha) * _view(x.ptr, n)

    def scal(self, n, alpha, x):
        _view(x.ptr, n)[...] *= np.float32(alpha)

    def dot(self, n, x, y):
        return float(np.dot(_view(x.ptr, n), _view(y.ptr, n)))

    def asum(self, n, x):
        return float(np.abs(_view(x.ptr, n)).sum(dtype=np.float32))

    def describe(self):
        return {"Device": self.name, "Index": self.index}
