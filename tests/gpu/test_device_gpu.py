"""The device layer: arrays, the caching allocator, launches, BLAS, and host/device synchronisation of blobs."""
import numpy as np
import pytest

from pycaffe_dist.backend import kernel_source
from pycaffe_dist.backend.device import CachingAllocator
from pycaffe_dist.errors import DeviceError
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.blob import synced_memory as sm


def test_caching_allocator_reuses_freed_blocks_of_a_size():
    calls = []
    allocator = CachingAllocator(lambda n: (len(calls) * 4096, calls.append(n)), lambda handle: None)
    a = allocator.allocate(1000)
    ptr = a.ptr
    del a
    b = allocator.allocate(900)          # same 512-byte bin (1024)
    assert b.ptr == ptr and calls == [1024] and allocator.device_allocations == 1
    c = allocator.allocate(5000)
    assert calls == [1024, 5120] and allocator.bytes_in_use == 1024 + 5120
    del b, c
    assert allocator.bytes_in_use == 0
    assert CachingAllocator.rounded(3 << 20) == 3 << 20 and CachingAllocator.rounded((3 << 20) + 1) == 3.5 * (1 << 20)


def test_arrays_ranges_and_launch_errors(gpu):
    x = gpu.to_device(np.arange(10, dtype=np.float32))
    np.testing.assert_array_equal(gpu.to_host(x.at(2, 3)), [2, 3, 4])
    with pytest.raises(DeviceError, match=r"device range \[8, 12\) outside an array of 10 elements"):
        x.at(8, 4)
    with pytest.raises(DeviceError, match="no CUDA kernel named 'no_such_kernel'"):
        gpu.launch("no_such_kernel", 10, x)
    with pytest.raises(DeviceError, match="kernel gpu_scale takes 3 arguments after n, got 2"):
        gpu.launch("gpu_scale", 10, 2.0, x)
    with pytest.raises(DeviceError, match="a pointer argument needs a DeviceArray"):
        gpu.launch("gpu_scale", 10, 2.0, np.zeros(10, np.float32), x)
    y = gpu.empty(10)
    gpu.launch("gpu_scale", 10, 2.0, x, y)
    np.testing.assert_array_equal(gpu.to_host(y), 2 * np.arange(10))


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_and_gemm_batched_are_row_major(gpu, trans_a, trans_b):
    rng = np.random.default_rng(0)
    m, n, k = 3, 5, 4
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((2, n, k) if trans_b else (2, k, n)).astype(np.float32)
    c = rng.standard_normal((2, m, n)).astype(np.float32)
    da, db, dc = gpu.to_device(a), gpu.to_device(b), gpu.to_device(c)
    gpu.gemm(trans_a, trans_b, m, n, k, 2.0, da, db, 0.5, dc)
    op_a = a.T if trans_a else a
    op_b = [bi.T if trans_b else bi for bi in b]
    want0 = 2 * op_a @ op_b[0] + 0.5 * c[0]
    np.testing.assert_allclose(gpu.to_host(dc)[:m * n].reshape(m, n), want0, rtol=1e-5)
    gpu.gemm_batched(trans_a, trans_b, m, n, k, 1.0, da, 0, db, n * k, 0.0, dc, m * n, 2)
    got = gpu.to_host(dc).reshape(2, m, n)
    for i in range(2):
        np.testing.assert_allclose(got[i], op_a @ op_b[i], rtol=1e-5)


def test_vector_blas(gpu):
    x = np.array([1, -2, 3], np.float32)
    y = np.array([4, 5, -6], np.float32)
    dx, dy = gpu.to_device(x), gpu.to_device(y)
    assert gpu.dot(3, dx, dy) == pytest.approx(-24) and gpu.asum(3, dx) == pytest.approx(6)
    gpu.axpby(3, 2.0, dx, 0.5, dy)
    np.testing.assert_allclose(gpu.to_host(dy), 2 * x + 0.5 * y)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = gpu.zeros(2)
    gpu.gemv(False, 2, 3, 1.0, gpu.to_device(a), dx, 0.0, out)
    np.testing.assert_allclose(gpu.to_host(out), a @ x)
    out = gpu.zeros(3)
    gpu.gemv(True, 2, 3, 1.0, gpu.to_device(a), gpu.to_device(np.array([1, 2], np.float32)), 0.0, out)
    np.testing.assert_allclose(gpu.to_host(out), a.T @ [1, 2])


def test_blob_copies_move_only_on_transitions(gpu):
    blob = Blob((2, 3))
    assert blob.data_memory is None                      # nothing allocated before the first access
    gpu_zero = gpu.to_host(blob.gpu_data)          # fresh memory is zero on the device too
    assert (gpu_zero == 0).all() and blob.data_memory.head == sm.DEVICE
    blob.data[...] = np.arange(6).reshape(2, 3)    # host write: the device copy is stale
    assert blob.data_memory.head == sm.HOST
    device_copy = blob.gpu_data                    # read: uploaded once, both current
    assert blob.data_memory.head == sm.SYNCED
    np.testing.assert_array_equal(gpu.to_host(device_copy), np.arange(6))
    gpu.launch("gpu_scale", 6, 10.0, blob.gpu_data, blob.mutable_gpu_data)
    assert blob.data_memory.head == sm.DEVICE
    np.testing.assert_array_equal(blob.cpu_data, 10 * np.arange(6).reshape(2, 3))
    assert blob.data_memory.head == sm.SYNCED            # a read-only host access keeps the device copy current
    blob.reshape(3, 2)                             # same count: the memory (and its state) stays
    assert blob.data_memory.head == sm.SYNCED
    blob.reshape(4, 2)
    assert blob.data_memory is None


def test_shared_and_float64_blobs(gpu):
    a = Blob((4,))
    a.data[...] = [1, 2, 3, 4]
    b = Blob((2, 2))
    b.share_reshaped(a)
    gpu.launch("gpu_scale", 4, 2.0, a.gpu_data, a.mutable_gpu_data)
    np.testing.assert_array_equal(b.data, [[2, 4], [6, 8]])     # one memory, whichever blob reads it
    c = Blob((2,), dtype=np.float64)
    with pytest.raises(DeviceError, match="computes in float32; this blob holds float64"):
        c.gpu_data


def test_every_kernel_is_parsed_and_exported_by_the_host_build():
    import ctypes
    table = kernel_source.source_signatures()
    assert {"math", "solvers"} <= set(table)
    library = ctypes.CDLL(str(kernel_source.ensure_host_library()))
    for kernels in table.values():
        for name, codes in kernels.items():
            assert codes[0] == "i" and set(codes) <= set("ifP")
            getattr(library, name)


def test_signature_errors_name_the_kernel():
    with pytest.raises(kernel_source.KernelSourceError, match="x.cu: kernel k: parameter 'double d' is not an int"):
        kernel_source.parse_signatures("PCD_KERNEL void k(const int n, double d) {}", "x.cu")
    with pytest.raises(kernel_source.KernelSourceError, match="kernel k must take its thread count"):
        kernel_source.parse_signatures("PCD_KERNEL void k(float* y, const int n) {}", "x.cu")
    assert kernel_source.parse_signatures("PCD_KERNEL void k(const int n,\n unsigned* m, const float a) {}") == \
        {"k": "iPf"}
