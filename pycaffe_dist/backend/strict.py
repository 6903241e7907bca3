"""What a real GPU refuses, refused by the emulated device too, so that CPU-only CI finds the calls that fail (or
corrupt memory) on a GPU.

Two kinds of refusal:
- cuBLAS v2 checks its arguments and returns CUBLAS_STATUS_INVALID_VALUE (the "Return Value" table of each routine
  in the cuBLAS guide): negative m, n, k or batch count; a leading dimension below max(1, rows of the stored
  matrix), checked even when a size is 0 (lda = 0 with k = 0 is refused); an operation other than N, T, C. The
  messages start as cuda.Cublas.call's do ("cublasSgemm_v2 failed: CUBLAS_STATUS_INVALID_VALUE"), so one test
  matches both devices.
- The driver and the kernels read and write device memory: a pointer must lie, with the whole extent the call
  touches, inside an allocation in use, aligned to its element. A real GPU faults there (or, worse, writes into
  a neighbour); the emulated device would read freed host memory. The allocations are the caching allocator's
  blocks, which `TrackedAllocator` records; a block back in its bin is freed for this purpose, though the driver
  still holds it, because using it is a use-after-free that the next allocation of its size will expose.

A kernel's own extent is its code's, which no argument says. So every block the emulated device allocates has
GUARD_BYTES of a known pattern on each side, and after each launch the guards of the blocks its pointers point
into are looked at: a kernel that wrote past its array's block (into a neighbour, on a GPU) is refused by name
instead of corrupting the host's heap for a later, unrelated crash.

Each refusal is a DeviceError of one line that names the call and the argument.
"""
import bisect
import threading

import numpy as np

from .device import CUDA_NUM_THREADS, CachingAllocator, blocks_for
from ..errors import DeviceError

INT_MAX = 2 ** 31 - 1               # cuBLAS v2 and our kernels take int sizes
MAX_GRID_X = 2 ** 31 - 1            # cudaDeviceProp.maxGridSize[0] since compute capability 3.0
MAX_THREADS_PER_BLOCK = 1024
OPERATIONS = {0: "N", 1: "T", 2: "C"}     # cublasOperation_t
FLOAT32 = np.dtype(np.float32)
GUARD_BYTES = 64                    # around every emulated block: more than any kernel's stride past an end
GUARD_VALUE = 0xA5


# --- device memory -------------------------------------------------------------------------------------------------
class TrackedAllocator(CachingAllocator):
    """The caching allocator that also knows, by address, which blocks are in use and which wait in a bin."""

    def __init__(self, device_alloc, device_free, guards=None):
        super().__init__(device_alloc, device_free)
        # guards(ptr, size): the bytes of the GUARD_BYTES before and after a block, as writable uint8 views (the
        # emulated device's blocks have them); None: no guards
        self._guards = guards
        self._starts = []           # sorted block addresses, in use or binned
        self._blocks = {}           # address -> [end, in use]
        # The prefetch thread allocates while the training thread checks. Reentrant: a block's __del__ (which only
        # flips its flag) may run inside a check.
        self._lock = threading.RLock()

    def allocate(self, nbytes):
        with self._lock:
            block = super().allocate(nbytes)
            if block.ptr not in self._blocks:
                bisect.insort(self._starts, block.ptr)
            self._blocks[block.ptr] = [block.ptr + block.size, True]
            return block

    def _give_back(self, block):
        super()._give_back(block)
        self._blocks[block.ptr][1] = False

    def release_cached(self):
        with self._lock:
            for binned in self._bins.values():
                for ptr, _ in binned:
                    del self._blocks[ptr]
                    del self._starts[bisect.bisect_left(self._starts, ptr)]
            super().release_cached()

    def check_guards(self, call, what, ptr):
        """Refuse `call` (which ran) if the guards of the block that address `ptr` lies in are no longer the
        pattern: it wrote past the block's start or end. The guards are set again, so that one overrun is reported
        once."""
        if self._guards is None:
            return
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i < 0:
                return
            start = self._starts[i]
            end = self._blocks[start][0]
        for side, guard in zip(("before the start", "past the end"), self._guards(start, end - start)):
            written = np.flatnonzero(guard != GUARD_VALUE)
            if written.size:
                guard[...] = GUARD_VALUE
                raise DeviceError("%s wrote %s of the block of %s (0x%x, %d bytes): %d of the %d guard bytes "
                                  "changed" % (call, side, what, start, end - start, written.size, guard.size))

    def check(self, call, what, array, nbytes=None):
        """Refuse `array` (a DeviceArray) as argument `what` of `call` unless the `nbytes` from its address (its own
        bytes by default) lie in a block in use and the address is aligned to its element."""
        ptr = array.ptr
        nbytes = array.nbytes if nbytes is None else int(nbytes)
        if ptr % array.dtype.itemsize:
            raise DeviceError("%s: %s at 0x%x is not aligned to its %d-byte %s elements"
                              % (call, what, ptr, array.dtype.itemsize, array.dtype))
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            start = self._starts[i] if i >= 0 else None
            end, in_use = self._blocks[start] if i >= 0 else (None, False)
        # An empty range may sit at the very end of its block (DeviceArray.at(size, 0)).
        if start is None or ptr > end or (ptr == end and nbytes):
            raise DeviceError("%s: %s at 0x%x is outside every device allocation" % (call, what, ptr))
        if not in_use:
            raise DeviceError("%s: %s at 0x%x points into a freed block (0x%x, %d bytes)"
                              % (call, what, ptr, start, end - start))
        if ptr + nbytes > end:
            raise DeviceError("%s: %s at 0x%x: %d bytes run %d bytes past the end of its block (0x%x, %d bytes)"
                              % (call, what, ptr, nbytes, ptr + nbytes - end, start, end - start))


def check_same_layout(call, dst, src):
    """A copy between arrays of other sizes or element types copies a part, or runs past one: a bug here."""
    if dst.dtype != src.dtype or dst.size != src.size:
        raise DeviceError("%s: destination of %d x %s, source of %d x %s" % (call, dst.size, dst.dtype, src.size,
                                                                             src.dtype))


def check_host(call, device_array, host):
    host = np.asarray(host)
    if host.dtype != device_array.dtype or host.size != device_array.size:
        raise DeviceError("%s: device array of %d x %s, host array of %d x %s" % (
            call, device_array.size, device_array.dtype, host.size, host.dtype))


# --- kernel launches -----------------------------------------------------------------------------------------------
def check_launch(memory, kernel, codes, n, args):
    """Launch(kernel, n, *args) as backend/device.py makes it: the grid within the device's limits, every int fits
    the kernel's int, every pointer in an allocation in use (its extent is the kernel's business: we check the
    DeviceArray's own)."""
    if n > INT_MAX:
        raise DeviceError("kernel %s: n = %d does not fit its int" % (kernel, n))
    blocks = blocks_for(n)     # capped by MAX_BLOCKS today; this guards a change of that cap or of the block size
    if not 1 <= blocks <= MAX_GRID_X or not 1 <= CUDA_NUM_THREADS <= MAX_THREADS_PER_BLOCK:
        raise DeviceError("kernel %s: a grid of %d blocks of %d threads is beyond the device's limits"
                          % (kernel, blocks, CUDA_NUM_THREADS))
    for i, (code, arg) in enumerate(zip(codes[1:], args), start=1):
        if code == "P":
            memory.check("kernel " + kernel, "argument %d" % i, arg)
        elif code == "i" and not -INT_MAX - 1 <= int(arg) <= INT_MAX:
            raise DeviceError("kernel %s: argument %d = %d does not fit its int" % (kernel, i, int(arg)))


# --- cuBLAS --------------------------------------------------------------------------------------------------------
def _invalid(call, why):
    return DeviceError("%s failed: CUBLAS_STATUS_INVALID_VALUE (%s)" % (call, why))


def _check_sizes(call, **sizes):
    for name, value in sizes.items():
        if value < 0:
            raise _invalid(call, "%s = %d < 0" % (name, value))
        if value > INT_MAX:
            raise DeviceError("%s: %s = %d does not fit cuBLAS's int" % (call, name, value))


def _check_ld(call, name, ld, rows, rows_name):
    if ld < max(1, rows):
        raise _invalid(call, "%s = %d < max(1, %s = %d)" % (name, ld, rows_name, rows))


def _check_operation(call, name, op):
    if op not in OPERATIONS:
        raise _invalid(call, "%s = %r is not N, T or C" % (name, op))


def _extent(rows, cols, ld):
    """Elements a column-major rows x cols matrix of leading dimension ld spans."""
    return (cols - 1) * ld + rows if rows and cols else 0


def _check_matrix(memory, call, name, array, rows, cols, ld, stride=0, batch=1):
    if array.dtype != FLOAT32:
        raise DeviceError("%s: %s holds %s, the call computes in float32" % (call, name, array.dtype))
    extent = _extent(rows, cols, ld)
    if not extent or not batch:
        memory.check(call, name, array, 0)
        return
    last = (batch - 1) * stride
    low, high = min(0, last), max(0, last) + extent
    if low < 0:
        raise DeviceError("%s: %s's stride %d puts matrices before its address" % (call, name, stride))
    memory.check(call, name, array, high * FLOAT32.itemsize)
    # Inside its block but past its array: no GPU notices, and the call reads or writes a neighbour's elements.
    if high > array.size:
        raise DeviceError("%s: %s spans %d elements from its address, its array holds %d" % (call, name, high,
                                                                                            array.size))


def check_gemm(memory, call, opa, opb, m, n, k, a, lda, b, ldb, c, ldc, strides=(0, 0, 0), batch=1):
    """cublasSgemm_v2 (batch 1) or cublasSgemmStridedBatched, column-major, as cuBLAS receives them."""
    _check_operation(call, "transa", opa)
    _check_operation(call, "transb", opb)
    _check_sizes(call, m=m, n=n, k=k, batchCount=batch)
    a_rows, a_cols = (m, k) if opa == 0 else (k, m)
    b_rows, b_cols = (k, n) if opb == 0 else (n, k)
    _check_ld(call, "lda", lda, a_rows, "m" if opa == 0 else "k")
    _check_ld(call, "ldb", ldb, b_rows, "k" if opb == 0 else "n")
    _check_ld(call, "ldc", ldc, m, "m")
    # Nothing is read or written when C is empty; with k = 0, C = beta C is.
    empty = not (m and n and batch)
    _check_matrix(memory, call, "A", a, 0 if empty else a_rows, a_cols, lda, strides[0], batch)
    _check_matrix(memory, call, "B", b, 0 if empty else b_rows, b_cols, ldb, strides[1], batch)
    _check_matrix(memory, call, "C", c, m, n, ldc, strides[2], batch)


def check_gemv(memory, call, op, m, n, a, lda, x, y):
    """cublasSgemv_v2 (incx = incy = 1): A is m x n whatever op is; x has n elements (m if op is T), y the other.
    cuBLAS 13.x's gemv was seen returning success on negative sizes and lda < max(1, m) on an H200, against its
    documentation; we refuse them as the documentation says (each is a bug in our call)."""
    _check_operation(call, "trans", op)
    _check_sizes(call, m=m, n=n)
    _check_ld(call, "lda", lda, m, "m")
    x_size, y_size = (n, m) if op == 0 else (m, n)
    empty = not (m and n)
    _check_matrix(memory, call, "A", a, 0 if empty else m, n, lda)
    _check_matrix(memory, call, "x", x, 0 if empty else x_size, 1, 1)
    _check_matrix(memory, call, "y", y, 0 if empty else y_size, 1, 1)


def check_vector(memory, call, n, *vectors):
    """axpy, scal, dot, asum (increments 1). cuBLAS, as reference BLAS, returns at once on n <= 0 (dot and asum
    give 0); we refuse a negative n all the same: no caller of ours means one."""
    if n < 0:
        raise DeviceError("%s: n = %d < 0 (cuBLAS would return at once)" % (call, n))
    if n > INT_MAX:
        raise DeviceError("%s: n = %d does not fit cuBLAS's int" % (call, n))
    for name, vector in vectors:
        _check_matrix(memory, call, name, vector, n, 1, 1)
