"""The GPU device a process computes on: its memory, kernel launches and BLAS, behind one interface.

Two devices implement it: `cuda.CudaDevice` (pycuda, cuBLAS, the nvcc-built kernels) and
`emulated.EmulatedDevice` (host memory, the same kernel sources compiled for the host, numpy's BLAS), on which
the tests run the GPU code path where no GPU is. Layers and solvers see only this interface, and get the
process's device from backend/select.py:

    dev = select.current()
    dev.launch("relu_forward", n, x.ptr... )   # a kernel of csrc/cuda by name; its first argument is n
    dev.gemm(False, True, m, n, k, 1.0, a, b, 0.0, c)      # row-major, as Caffe's caffe_gpu_gemm

Memory comes as `DeviceArray`s (a typed range of device memory; `at(offset, size)` is a sub-range), from a
caching allocator: a freed block goes back to its size bin, so training allocates nothing per iteration.
GEMM and the vector BLAS follow Caffe's math_functions.hpp (row-major, transposes as flags).
"""
import numpy as np

from ..errors import DeviceError

CUDA_NUM_THREADS = 512          # Caffe's CAFFE_CUDA_NUM_THREADS
MAX_BLOCKS = 65535 * 32         # grid-x limit we use; CUDA_KERNEL_LOOP's stride covers any n beyond it


def blocks_for(n):
    """Caffe's CAFFE_GET_BLOCKS: enough blocks of CUDA_NUM_THREADS for n threads (at least one)."""
    return max(1, min(MAX_BLOCKS, (int(n) + CUDA_NUM_THREADS - 1) // CUDA_NUM_THREADS))


class DeviceArray:
    """`size` elements of `dtype` at device address `ptr`; `owner` keeps the allocation alive."""
    __slots__ = ("ptr", "size", "dtype", "owner")

    def __init__(self, ptr, size, dtype, owner):
        self.ptr, self.size, self.dtype, self.owner = int(ptr), int(size), np.dtype(dtype), owner

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def at(self, offset, size=None):
        offset = int(offset)
        size = self.size - offset if size is None else int(size)
        if offset < 0 or size < 0 or offset + size > self.size:
            raise DeviceError("device range [%d, %d) outside an array of %d elements" % (offset, offset + size,
                                                                                        self.size))
        return DeviceArray(self.ptr + offset * self.dtype.itemsize, size, self.dtype, self.owner)

    def __repr__(self):
        return "DeviceArray(0x%x, %d x %s)" % (self.ptr, self.size, self.dtype)


class CachingAllocator:
    """Freed blocks wait in bins of their (rounded) size for the next request of that size. `device_alloc(nbytes)`
    returns (ptr, handle); `device_free(handle)` is called only by `release_cached`."""

    def __init__(self, device_alloc, device_free):
        self._alloc, self._free = device_alloc, device_free
        self._bins = {}
        self.device_allocations = 0     # calls that reached the device (tests check none happen per iteration)
        self.bytes_in_use = 0

    @staticmethod
    def rounded(nbytes):
        # 512-byte granules up to 1 MiB, then 1/8 of the next power of two: bounded waste, few distinct bins.
        nbytes = max(512, int(nbytes))
        if nbytes <= 1 << 20:
            return (nbytes + 511) & ~511
        step = 1 << (nbytes.bit_length() - 3)
        return (nbytes + step - 1) // step * step

    def allocate(self, nbytes):
        size = self.rounded(nbytes)
        free = self._bins.get(size)
        if free:
            ptr, handle = free.pop()
        else:
            ptr, handle = self._alloc(size)
            self.device_allocations += 1
        self.bytes_in_use += size
        return _Block(self, ptr, size, handle)

    def _give_back(self, block):
        self.bytes_in_use -= block.size
        self._bins.setdefault(block.size, []).append((block.ptr, block.handle))

    def release_cached(self):
        for blocks in self._bins.values():
            for _, handle in blocks:
                self._free(handle)
        self._bins.clear()


class _Block:
    """One allocation in use. Arrays hold it as their owner; when the last one goes, its memory returns to its bin."""
    __slots__ = ("allocator", "ptr", "size", "handle")

    def __init__(self, allocator, ptr, size, handle):
        self.allocator, self.ptr, self.size, self.handle = allocator, ptr, size, handle

    def __del__(self):
        self.allocator._give_back(self)


class Device:
    """What both devices share: arrays from the caching allocator, launches by kernel name, fills."""
    name = "device"

    def __init__(self, signatures):
        # signatures: {source: {kernel: codes}} (backend/kernel_source.py)
        self.signatures = {k: codes for table in signatures.values() for k, codes in table.items()}
        self.allocator = None   # set by the subclass

    # --- memory ---------------------------------------------------------------------------------------------
    def empty(self, size, dtype=np.float32):
        dtype = np.dtype(dtype)
        block = self.allocator.allocate(max(1, int(size)) * dtype.itemsize)
        return DeviceArray(block.ptr, size, dtype, block)

    def zeros(self, size, dtype=np.float32):
        out = self.empty(size, dtype)
        self.memset(out, 0)
        return out

    def to_device(self, host):
        host = np.ascontiguousarray(host)
        out = self.empty(host.size, host.dtype)
        self.upload(out, host)
        return out

    def to_host(self, array):
        host = np.empty(array.size, array.dtype)
        self.download(array, host)
        return host

    def download_all(self, pairs):
        """download() each (device array, host array) pair of `pairs`; a device that can queues them all and
        waits once (a net's parameters: hundreds of arrays)."""
        for src, host in pairs:
            self.download(src, host)

    def fill(self, array, value):
        if array.size:
            self.launch("gpu_set", array.size, float(value), array)

    # --- kernels -----------------------------------------------------------------------------------------------
    def codes(self, kernel):
        try:
            return self.signatures[kernel]
        except KeyError:
            raise DeviceError("no CUDA kernel named %r in csrc/cuda" % kernel) from None

    def launch(self, kernel, n, *args):
        """Run kernel(n, *args) over n threads. DeviceArrays pass their address; numbers their value."""
        if n <= 0:
            return
        codes = self.codes(kernel)
        if len(codes) != len(args) + 1:
            raise DeviceError("kernel %s takes %d arguments after n, got %d" % (kernel, len(codes) - 1, len(args)))
        values = [int(n)]
        for code, arg in zip(codes[1:], args):
            if code == "P":
                if not isinstance(arg, DeviceArray):
                    raise DeviceError("kernel %s: a pointer argument needs a DeviceArray, got %r" % (kernel, arg))
                values.append(arg.ptr)
            elif code == "i":
                values.append(int(arg))
            else:
                values.append(float(arg))
        self._check_launch(kernel, codes, int(n), args)
        self._launch(kernel, codes, int(n), values)

    def _check_launch(self, kernel, codes, n, args):
        """Where a device refuses what the driver would (the emulated device: backend/strict.py); a real one's
        driver does it itself."""
