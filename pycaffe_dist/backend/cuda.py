"""The CUDA device: pycuda for the context, memory, streams and kernel launches; cuBLAS (ctypes) for BLAS.

- Context: the device's primary context (shared with any other library in the process), pushed on the creating
  thread; `in_thread()` pushes it on another (the prefetch thread).
- Memory: the caching allocator of backend/device.py over cuMemAlloc; nothing is allocated per iteration once the
  blobs have their shapes. Host buffers that take part in copies are page-locked (`pinned_empty`).
- Kernels: csrc/cuda/*.cu, built by nvcc into pycaffe_dist/_kernels/cuda/*.fatbin (setup.py), loaded by name and
  launched as prepared calls on the compute stream, Caffe's grid (512 threads a block).
- cuBLAS: libcublas from the nvidia-cublas wheel or the system, through ctypes, on the compute stream, host
  pointer mode (dot and asum return to the host, which synchronises as Caffe's caffe_gpu_dot does).

Every failure to get there (no pycuda, no driver, no device, no fatbins, no cuBLAS) is a DeviceError that says
which; `dist_caffe device-query` prints it.
"""
import atexit
import contextlib
import ctypes
import ctypes.util
import glob
import os

import numpy as np

from . import cudnn, kernel_source
from .blas_ops import RowMajorBlas
from .device import CUDA_NUM_THREADS, CachingAllocator, Device, blocks_for
from ..errors import DeviceError


def _import_pycuda():
    try:
        import pycuda.driver as driver
    except ImportError as exc:
        raise DeviceError("pycuda cannot be imported (%s): build it from its sdist, see docs/gpu.md"
                          % exc) from None
    try:
        driver.init()
    except Exception as exc:       # pycuda.driver.Error, or a missing libcuda.so.1
        raise DeviceError("the CUDA driver did not start (%s): no NVIDIA driver or GPU on this machine" % exc) \
            from None
    return driver


def device_count():
    return _import_pycuda().Device.count()


class CudaDevice(RowMajorBlas, Device):
    def __init__(self, index=0):
        driver = _import_pycuda()
        self._driver = driver
        count = driver.Device.count()
        if count == 0:
            raise DeviceError("the CUDA driver sees no GPU")
        if not 0 <= index < count:
            raise DeviceError("GPU %d does not exist: this machine has %d (0..%d)" % (index, count, count - 1))
        super().__init__(kernel_source.load_signatures())
        self.index = index
        self.cu_device = driver.Device(index)
        self.name = self.cu_device.name()
        self.context = self.cu_device.retain_primary_context()
        self.context.push()
        # pycuda aborts the process at exit if a context is still pushed (as pycuda.autoinit pops its own).
        atexit.register(self._pop_context)
        self.stream = driver.Stream()
        self.allocator = CachingAllocator(self._device_alloc, lambda allocation: allocation.free())
        self._functions = self._load_kernels()
        self.cublas = Cublas(self.stream.handle)

    def _device_alloc(self, nbytes):
        try:
            allocation = self._driver.mem_alloc(nbytes)
        except self._driver.MemoryError:
            # Cached blocks of other sizes may be what stands in the way: give them back and try once more.
            self.allocator.release_cached()
            try:
                allocation = self._driver.mem_alloc(nbytes)
            except self._driver.MemoryError:
                free, total = self._driver.mem_get_info()
                raise DeviceError("GPU %d is out of memory: %d bytes asked, %d of %d free" % (
                    self.index, nbytes, free, total)) from None
        return int(allocation), allocation

    def _load_kernels(self):
        functions = {}
        for stem, kernels in kernel_source.load_signatures().items():
            path = kernel_source.BUILD_DIR / (stem + ".fatbin")
            if not path.exists():
                raise DeviceError("%s is missing: the package was built without nvcc; rebuild it where nvcc is on "
                                  "the PATH (pip install -e .)" % path)
            source = kernel_source.SOURCE_DIR / (stem + ".cu")
            header = kernel_source.SOURCE_DIR / "common.cuh"
            if source.exists() and max(source.stat().st_mtime, header.stat().st_mtime) > path.stat().st_mtime:
                raise DeviceError("%s is older than %s: rebuild the kernels (python pycaffe_dist/backend/"
                                  "kernel_source.py gpu, or pip install -e .)" % (path, source))
            try:
                module = self._driver.module_from_file(str(path))
            except Exception as exc:
                raise DeviceError("%s does not load on %s (compute capability %d.%d): %s"
                                  % (path.name, self.name, *self.cu_device.compute_capability(), exc)) from None
            for name, codes in kernels.items():
                fn = module.get_function(name)
                fn.prepare(codes)
                functions[name] = fn
        return functions

    def _pop_context(self):
        try:
            self._driver.Context.pop()
        except Exception:           # already popped, or the driver is shutting down: nothing left to release
            pass

    @contextlib.contextmanager
    def in_thread(self):
        self.context.push()
        try:
            yield
        finally:
            self._driver.Context.pop()

    # --- memory ------------------------------------------------------------------------------------------------
    def upload(self, dst, host, stream=None):
        self._driver.memcpy_htod_async(dst.ptr, np.ascontiguousarray(host).reshape(-1), stream or self.stream)

    def download(self, src, host, stream=None):
        stream = stream or self.stream
        self._driver.memcpy_dtoh_async(host.reshape(-1), src.ptr, stream)
        stream.synchronize()

    def download_all(self, pairs):
        """The copies queued on the stream, then one wait: into page-locked arrays (a worker's exchange buffers)
        they run while the host queues the next; a wait per array would cost a round trip each."""
        for src, host in pairs:
            self._driver.memcpy_dtoh_async(host.reshape(-1), src.ptr, self.stream)
        self.stream.synchronize()

    def copy(self, dst, src, stream=None):
        self._driver.memcpy_dtod_async(dst.ptr, src.ptr, min(dst.nbytes, src.nbytes), stream or self.stream)

    def memset(self, array, byte):
        self._driver.memset_d8_async(array.ptr, byte, array.nbytes, self.stream)

    def pinned_empty(self, size, dtype=np.float32):
        return self._driver.pagelocked_empty(int(size), dtype)

    def new_stream(self):
        return self._driver.Stream()

    def record(self, stream):
        event = self._driver.Event()
        event.record(stream)
        return event

    def elapsed_ms(self, start, stop):
        """Milliseconds of GPU time between two recorded events; waits for `stop`."""
        stop.synchronize()
        return stop.time_since(start)

    def wait(self, event):
        """Make the compute stream wait for `event` (recorded on another stream)."""
        if event is not None:
            self.stream.wait_for_event(event)

    def synchronize(self):
        self.stream.synchronize()

    # --- kernels -----------------------------------------------------------------------------------------------
    def _launch(self, kernel, codes, n, values):
        self._functions[kernel].prepared_async_call((blocks_for(n), 1), (CUDA_NUM_THREADS, 1, 1), self.stream,
                                                    *values)

    # --- BLAS ----------------------------------------------------------------------------------------------------
    def _sgemm(self, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        self.cublas.sgemm(opa, opb, m, n, k, alpha, a.ptr, lda, b.ptr, ldb, beta, c.ptr, ldc)

    def _sgemm_batched(self, opa, opb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                       batch):
        self.cublas.call("cublasSgemmStridedBatched", opa, opb, m, n, k, ctypes.byref(ctypes.c_float(alpha)),
                         ctypes.c_void_p(a.ptr), lda, ctypes.c_longlong(stride_a), ctypes.c_void_p(b.ptr), ldb,
                         ctypes.c_longlong(stride_b), ctypes.byref(ctypes.c_float(beta)), ctypes.c_void_p(c.ptr), ldc,
                         ctypes.c_longlong(stride_c), batch)

    def _sgemv(self, op, m, n, alpha, a, lda, x, beta, y):
        self.cublas.sgemv(op, m, n, alpha, a.ptr, lda, x.ptr, beta, y.ptr)

    def axpy(self, n, alpha, x, y):
        self.cublas.call("cublasSaxpy_v2", ctypes.c_int(n), ctypes.byref(ctypes.c_float(alpha)),
                         ctypes.c_void_p(x.ptr), 1, ctypes.c_void_p(y.ptr), 1)

    def scal(self, n, alpha, x):
        self.cublas.call("cublasSscal_v2", ctypes.c_int(n), ctypes.byref(ctypes.c_float(alpha)),
                         ctypes.c_void_p(x.ptr), 1)

    def dot(self, n, x, y):
        out = ctypes.c_float()
        self.cublas.call("cublasSdot_v2", ctypes.c_int(n), ctypes.c_void_p(x.ptr), 1, ctypes.c_void_p(y.ptr), 1,
                         ctypes.byref(out))
        return float(out.value)

    def asum(self, n, x):
        out = ctypes.c_float()
        self.cublas.call("cublasSasum_v2", ctypes.c_int(n), ctypes.c_void_p(x.ptr), 1, ctypes.byref(out))
        return float(out.value)

    def describe(self):
        d = self._driver
        attrs = self.cu_device.get_attributes()
        major, minor = self.cu_device.compute_capability()
        return {"Device": "%d: %s" % (self.index, self.name), "Compute capability": "%d.%d" % (major, minor),
                "Total global memory": "%.1f GiB" % (self.cu_device.total_memory() / 2.0 ** 30),
                "Multiprocessors": attrs.get(d.device_attribute.MULTIPROCESSOR_COUNT),
                "Clock rate": "%d MHz" % (attrs.get(d.device_attribute.CLOCK_RATE, 0) // 1000),
                "Driver version": d.get_driver_version(), "cuBLAS": self.cublas.path,
                "cuDNN": cudnn.describe()}


def _cublas_candidates():
    try:
        import nvidia           # the nvidia-cublas wheels: nvidia/cublas/lib (CUDA 12), nvidia/cu13/lib (CUDA 13)
        for root in nvidia.__path__:
            for lib in ("cublas", "cu13", "cu12"):
                yield from sorted(glob.glob(os.path.join(root, lib, "lib", "libcublas.so*")))
    except ImportError:
        pass
    found = ctypes.util.find_library("cublas")
    if found:
        yield found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            yield from sorted(glob.glob(os.path.join(home, "lib64", "libcublas.so*")))


class Cublas:
    """The few cuBLAS v2 calls we use, through ctypes, bound to one stream."""
    STATUS = {1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH",
              11: "MAPPING_ERROR", 13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED"}

    def __init__(self, stream_handle):
        errors = []
        for path in _cublas_candidates():
            try:
                self.lib = ctypes.CDLL(path)
                self.path = path
                break
            except OSError as exc:
                errors.append(str(exc))
        else:
            raise DeviceError("libcublas was not found (pip install nvidia-cublas, or a CUDA toolkit under "
                              "/usr/local/cuda)%s" % ("; " + "; ".join(errors) if errors else ""))
        self.handle = ctypes.c_void_p()
        self.call("cublasCreate_v2", ctypes.byref(self.handle), with_handle=False)
        self.call("cublasSetStream_v2", ctypes.c_void_p(stream_handle))

    def call(self, name, *args, with_handle=True):
        status = getattr(self.lib, name)(*(((self.handle,) if with_handle else ()) + args))
        if status:
            raise DeviceError("%s failed: CUBLAS_STATUS_%s" % (name, self.STATUS.get(status, status)))

    def sgemm(self, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        self.call("cublasSgemm_v2", opa, opb, m, n, k, ctypes.byref(ctypes.c_float(alpha)), ctypes.c_void_p(a), lda,
                  ctypes.c_void_p(b), ldb, ctypes.byref(ctypes.c_float(beta)), ctypes.c_void_p(c), ldc)

    def sgemv(self, op, m, n, alpha, a, lda, x, beta, y):
        self.call("cublasSgemv_v2", op, m, n, ctypes.byref(ctypes.c_float(alpha)), ctypes.c_void_p(a), lda,
                  ctypes.c_void_p(x), 1, ctypes.byref(ctypes.c_float(beta)), ctypes.c_void_p(y), 1)
