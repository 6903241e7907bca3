"""What cuBLAS and the CUDA driver refuse, the emulated device refuses too (backend/strict.py); the edge calls they
accept (empty sizes, k = 0) give Caffe's result on both devices.

cuBLAS's argument refusals are checked on both devices: the real cuBLAS says CUBLAS_STATUS_INVALID_VALUE before it
touches memory. Bad pointers are checked on the emulated device only: a real GPU faults there, or writes into
another allocation, which no test may do.
"""
import numpy as np
import pytest

from pycaffe_dist.backend.device import DeviceArray
from pycaffe_dist.backend.blas_ops import NO_TRANS, TRANS
from pycaffe_dist.errors import DeviceError

N, T = NO_TRANS, TRANS
INVALID = "failed: CUBLAS_STATUS_INVALID_VALUE"


@pytest.fixture
def emulated():
    from pycaffe_dist.backend.emulated import EmulatedDevice
    return EmulatedDevice()


def arange(dev, n, start=1):
    return dev.to_device(np.arange(start, start + n, dtype=np.float32))


def refuses(dev, call, detail, fn, *args):
    """fn(*args) fails as cuBLAS fails; the emulated device also says which argument."""
    with pytest.raises(DeviceError, match=call + " " + INVALID) as info:
        fn(*args)
    if dev.name.startswith("emulated"):
        assert str(info.value) == "%s %s (%s)" % (call, INVALID, detail)
        assert "\n" not in str(info.value)


# --- cuBLAS's argument rules, both devices ---------------------------------------------------------------------
# (opa, opb, m, n, k, lda, ldb, ldc, what the emulated device names)
GEMM_REFUSED = [
    (N, N, -1, 2, 2, 1, 2, 1, "m = -1 < 0"),
    (N, N, 2, -1, 2, 2, 2, 2, "n = -1 < 0"),
    (N, N, 2, 2, -1, 2, 1, 2, "k = -1 < 0"),
    (N, N, 3, 2, 2, 2, 2, 3, "lda = 2 < max(1, m = 3)"),
    (T, N, 2, 2, 3, 2, 3, 2, "lda = 2 < max(1, k = 3)"),
    (N, N, 2, 2, 3, 2, 2, 2, "ldb = 2 < max(1, k = 3)"),
    (N, T, 2, 3, 2, 2, 2, 2, "ldb = 2 < max(1, n = 3)"),
    (N, N, 3, 2, 2, 3, 2, 2, "ldc = 2 < max(1, m = 3)"),
    # Leading dimensions are checked even where a size is 0: Caffe's row-major lda = k with k = 0 (the H200's
    # CUBLAS_STATUS_INVALID_VALUE in the convolution with an empty output), and m = 0 with ldc = 0.
    (N, N, 2, 2, 0, 2, 0, 2, "ldb = 0 < max(1, k = 0)"),
    (T, N, 2, 2, 0, 0, 1, 2, "lda = 0 < max(1, k = 0)"),
    (N, N, 0, 2, 2, 1, 2, 0, "ldc = 0 < max(1, m = 0)"),
    (2 + 5, N, 2, 2, 2, 2, 2, 2, "transa = 7 is not N, T or C"),
]


@pytest.mark.parametrize("opa,opb,m,n,k,lda,ldb,ldc,detail", GEMM_REFUSED)
def test_gemm_refuses_what_cublas_refuses(gpu, opa, opb, m, n, k, lda, ldb, ldc, detail):
    a, b, c = arange(gpu, 16), arange(gpu, 16), arange(gpu, 16)
    refuses(gpu, "cublasSgemm_v2", detail, gpu._sgemm, opa, opb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc)
    refuses(gpu, "cublasSgemmStridedBatched", detail, gpu._sgemm_batched, opa, opb, m, n, k, 1.0, a, lda, 0, b, ldb,
            0, 0.0, c, ldc, 0, 1)
    np.testing.assert_array_equal(gpu.to_host(c), np.arange(1, 17))


def test_gemm_batched_refuses_a_negative_batch_count(gpu):
    a = arange(gpu, 4)
    refuses(gpu, "cublasSgemmStridedBatched", "batchCount = -1 < 0", gpu._sgemm_batched, N, N, 2, 2, 1, 1.0, a, 2,
            0, a, 1, 0, 0.0, a, 2, 0, -1)


@pytest.mark.parametrize("op,m,n,lda,detail", [
    (N, -1, 2, 1, "m = -1 < 0"),
    (T, 2, -1, 2, "n = -1 < 0"),
    (N, 3, 2, 2, "lda = 2 < max(1, m = 3)"),
    (T, 0, 2, 0, "lda = 0 < max(1, m = 0)"),
])
def test_gemv_refuses_what_cublas_refuses(gpu, op, m, n, lda, detail):
    if not gpu.name.startswith("emulated"):
        # cuBLAS's documentation gives these as CUBLAS_STATUS_INVALID_VALUE, but cuBLAS 13.x's gemv returned
        # success for all four on an H200 (CUDA 13, driver 580). The emulated device refuses them anyway: each
        # is a bug in our call.
        pytest.skip("cuBLAS 13's sgemv accepts these calls, against its documentation")
    a, x, y = arange(gpu, 16), arange(gpu, 4), arange(gpu, 4)
    refuses(gpu, "cublasSgemv_v2", detail, gpu._sgemv, op, m, n, 1.0, a, lda, x, 0.0, y)


# --- the edge calls cuBLAS accepts, both devices ---------------------------------------------------------------
def test_empty_and_k0_gemm_calls_succeed_with_blas_results(gpu):
    a, b = arange(gpu, 4), arange(gpu, 4)
    c = arange(gpu, 6)
    gpu._sgemm(N, N, 0, 3, 2, 1.0, a, 1, b, 2, 0.0, c, 1)             # no C: nothing happens
    gpu._sgemm(N, N, 2, 0, 2, 1.0, a, 2, b, 2, 0.0, c, 2)
    gpu._sgemm_batched(N, N, 2, 3, 2, 1.0, a, 2, 0, b, 2, 0, 0.0, c, 2, 0, 0)     # batchCount 0
    np.testing.assert_array_equal(gpu.to_host(c), np.arange(1, 7))
    gpu._sgemm(N, N, 2, 3, 0, 1.0, a, 2, b, 1, 0.5, c, 2)             # k = 0: C = beta C
    np.testing.assert_array_equal(gpu.to_host(c), 0.5 * np.arange(1, 7))
    gpu.upload(c, np.full(6, np.nan, np.float32))
    gpu._sgemm(T, T, 2, 3, 0, 1.0, a, 1, b, 3, 0.0, c, 2)             # beta 0: C is not read
    np.testing.assert_array_equal(gpu.to_host(c), np.zeros(6))
    c = arange(gpu, 12)
    gpu._sgemm_batched(N, N, 2, 3, 0, 1.0, a, 2, 0, b, 1, 0, 2.0, c, 2, 6, 2)
    np.testing.assert_array_equal(gpu.to_host(c), 2 * np.arange(1, 13))


def test_empty_vector_calls_succeed(gpu):
    x, y = arange(gpu, 3), arange(gpu, 3)
    assert gpu.dot(0, x, y) == 0 and gpu.asum(0, x) == 0
    gpu.axpy(0, 2.0, x, y)
    gpu.scal(0, 2.0, x)
    gpu._sgemv(N, 0, 3, 1.0, x, 1, x, 0.0, y)
    np.testing.assert_array_equal(gpu.to_host(y), [1, 2, 3])
    np.testing.assert_array_equal(gpu.to_host(x), [1, 2, 3])


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_row_major_products_over_k0_scale_c(gpu, trans_a, trans_b):
    """Caffe's caffe_gpu_gemm with K = 0 gives C = beta C (its lda = K = 0 is what cuBLAS refuses)."""
    a, b = gpu.empty(0), gpu.empty(0)
    c = arange(gpu, 6)
    gpu.gemm(trans_a, trans_b, 2, 3, 0, 1.0, a, b, 0.5, c)
    np.testing.assert_array_equal(gpu.to_host(c), 0.5 * np.arange(1, 7))
    gpu.upload(c, np.full(6, np.nan, np.float32))
    gpu.gemm(trans_a, trans_b, 2, 3, 0, 1.0, a, b, 0.0, c)
    np.testing.assert_array_equal(gpu.to_host(c), np.zeros(6))
    c = arange(gpu, 14)
    gpu.gemm_batched(trans_a, trans_b, 2, 3, 0, 1.0, a, 0, b, 0, 3.0, c, 8, 2)     # C_1 starts 2 past C_0's end
    want = np.arange(1, 15, dtype=np.float32)
    want[0:6] *= 3
    want[8:14] *= 3
    np.testing.assert_array_equal(gpu.to_host(c), want)
    c = arange(gpu, 12)
    gpu.gemm_batched(trans_a, trans_b, 2, 3, 0, 1.0, a, 0, b, 0, 1.0, c, 6, 2)
    np.testing.assert_array_equal(gpu.to_host(c), np.arange(1, 13))


def test_row_major_empty_products_leave_c(gpu):
    a, b, c = arange(gpu, 6), arange(gpu, 6), arange(gpu, 6)
    gpu.gemm(False, False, 0, 3, 2, 1.0, a, b, 0.0, c)
    gpu.gemm(True, True, 2, 0, 3, 1.0, a, b, 0.0, c)
    gpu.gemm_batched(False, False, 2, 3, 1, 1.0, a, 2, b, 3, 0.0, c, 6, 0)
    gpu.gemv(False, 0, 3, 1.0, a, b, 0.0, c)
    gpu.gemv(True, 3, 0, 1.0, a, b, 0.0, c)
    np.testing.assert_array_equal(gpu.to_host(c), np.arange(1, 7))


@pytest.mark.parametrize("trans_a", [False, True])
def test_row_major_gemv_over_an_empty_inner_dimension_scales_y(gpu, trans_a):
    """y = alpha op(A) x + beta y with nothing to sum is beta y, as Caffe's math says."""
    a, x = gpu.empty(0), gpu.empty(0)
    y = arange(gpu, 3)
    m, n = (0, 3) if trans_a else (3, 0)
    gpu.gemv(trans_a, m, n, 1.0, a, x, 2.0, y)
    np.testing.assert_array_equal(gpu.to_host(y), [2, 4, 6])
    gpu.upload(y, np.full(3, np.nan, np.float32))
    gpu.gemv(trans_a, m, n, 1.0, a, x, 0.0, y)
    np.testing.assert_array_equal(gpu.to_host(y), np.zeros(3))


def test_empty_arrays_and_ranges_are_legal(gpu):
    empty = gpu.empty(0)
    gpu.upload(empty, np.empty(0, np.float32))
    assert gpu.to_host(empty).size == 0
    gpu.memset(empty, 0)
    gpu.copy(empty, gpu.empty(0))
    x = arange(gpu, 128)                               # 512 bytes: the whole of its block
    end = x.at(128, 0)                                 # an empty range at the very end of the block
    gpu.memset(end, 0)
    gpu.copy(end, empty)
    gpu.gemm(False, False, 0, 4, 4, 1.0, x, x, 0.0, end)
    assert gpu.dot(0, end, end) == 0
    gpu.launch("gpu_scale", 4, 2.0, x.at(124), x.at(0, 4))
    np.testing.assert_array_equal(gpu.to_host(x)[:4], [250, 252, 254, 256])


# --- memory the driver would fault on, the emulated device only -------------------------------------------------
def test_a_pointer_outside_every_allocation(emulated):
    x = arange(emulated, 4)
    stray = DeviceArray(64, 4, np.float32, None)
    for call, fn in [("memset", lambda: emulated.memset(stray, 0)),
                     ("upload", lambda: emulated.upload(stray, np.zeros(4, np.float32))),
                     ("download", lambda: emulated.to_host(stray)),
                     ("copy", lambda: emulated.copy(x, stray)),
                     ("kernel gpu_scale", lambda: emulated.launch("gpu_scale", 4, 2.0, x, stray)),
                     ("cublasSaxpy_v2", lambda: emulated.axpy(4, 1.0, stray, x)),
                     ("cublasSgemm_v2", lambda: emulated.gemm(False, False, 2, 2, 2, 1.0, x, stray, 0.0, x))]:
        with pytest.raises(DeviceError, match=r"^%s: \w+( \d)? at 0x40 is outside every device allocation$" % call):
            fn()


def test_a_kernel_that_writes_past_its_block(emulated):
    """The kernels' own extent is their code's: the guards around each block catch a write past it, once."""
    x = emulated.empty(128)                          # 512 bytes, a whole block
    with pytest.raises(DeviceError, match=r"^kernel gpu_set wrote past the end of the block of argument 2 "
                                          r"\(0x[0-9a-f]+, 512 bytes\): 16 of the 64 guard bytes changed$"):
        emulated.launch("gpu_set", 132, 1.0, x)
    emulated.launch("gpu_set", 128, 2.0, x)          # the guards were set again: a kernel within its block passes
    np.testing.assert_array_equal(emulated.to_host(x), 2.0)


def test_a_misaligned_pointer(emulated):
    x = arange(emulated, 8)
    odd = DeviceArray(x.ptr + 2, 4, np.float32, x.owner)
    with pytest.raises(DeviceError, match=r"^kernel gpu_scale: argument 3 at 0x[0-9a-f]+ is not aligned to its "
                                          r"4-byte float32 elements$"):
        emulated.launch("gpu_scale", 4, 2.0, x, odd)
    with pytest.raises(DeviceError, match="cublasSdot_v2: y at 0x[0-9a-f]+ is not aligned"):
        emulated.dot(4, x, odd)


def test_a_freed_block(emulated):
    x = arange(emulated, 8)
    dangling = DeviceArray(x.ptr, 8, np.float32, None)        # a raw address that outlives its array
    del x                                                     # the block goes back to its bin
    with pytest.raises(DeviceError, match=r"^memset: destination at 0x[0-9a-f]+ points into a freed block "
                                          r"\(0x[0-9a-f]+, 512 bytes\)$"):
        emulated.memset(dangling, 0)
    with pytest.raises(DeviceError, match="cublasSscal_v2: x at 0x[0-9a-f]+ points into a freed block"):
        emulated.scal(8, 2.0, dangling)
    emulated.allocator.release_cached()                       # now gone from the device
    with pytest.raises(DeviceError, match="is outside every device allocation"):
        emulated.launch("gpu_set", 8, 1.0, dangling)
    again = emulated.empty(8)                                 # its bin's next block is in use again
    emulated.memset(again, 0)


def test_a_range_past_the_end_of_its_block(emulated):
    x = arange(emulated, 128)                                 # exactly one 512-byte block
    past = DeviceArray(x.ptr + 504, 4, np.float32, x.owner)
    with pytest.raises(DeviceError, match=r"^copy: destination at 0x[0-9a-f]+: 16 bytes run 8 bytes past the end "
                                          r"of its block \(0x[0-9a-f]+, 512 bytes\)$"):
        emulated.copy(past, x.at(0, 4))
    with pytest.raises(DeviceError, match="kernel gpu_scale: argument 2 at 0x[0-9a-f]+: 16 bytes run 8 bytes past"):
        emulated.launch("gpu_scale", 4, 2.0, past, x)


def test_blas_extents_stay_in_the_block_and_the_array(emulated):
    x = arange(emulated, 128)
    tail = x.at(120)                                          # 8 elements before the block's end
    # A 3 x 3 column-major C with ldc 4 spans 2 * 4 + 3 = 11 elements: 3 past the block.
    with pytest.raises(DeviceError, match=r"^cublasSgemm_v2: C at 0x[0-9a-f]+: 44 bytes run 12 bytes past the end"):
        emulated._sgemm(N, N, 3, 3, 1, 1.0, x, 3, x, 1, 0.0, tail, 4)
    # The second of two strided matrices starts past the block.
    with pytest.raises(DeviceError, match=r"^cublasSgemmStridedBatched: A at 0x[0-9a-f]+: 516 bytes run 4 bytes"):
        emulated._sgemm_batched(N, N, 1, 1, 1, 1.0, x, 1, 128, x, 1, 0, 0.0, x, 1, 0, 2)
    # Inside the block, past the array: a neighbour's elements.
    with pytest.raises(DeviceError, match=r"^cublasSgemv_v2: A spans 6 elements from its address, its array holds 4$"):
        emulated._sgemv(N, 2, 3, 1.0, x.at(0, 4), 2, x, 0.0, x)
    with pytest.raises(DeviceError, match=r"^cublasSasum_v2: x spans 5 elements from its address, its array holds 4$"):
        emulated.asum(5, x.at(0, 4))
    with pytest.raises(DeviceError, match=r"^cublasSgemm_v2: B holds float64, the call computes in float32$"):
        emulated._sgemm(N, N, 1, 1, 1, 1.0, x, 1, emulated.zeros(1, np.float64), 1, 0.0, x, 1)


def test_vector_calls_refuse_a_negative_count(emulated):
    """cuBLAS returns at once on n < 0; no caller of ours means one."""
    x = arange(emulated, 4)
    with pytest.raises(DeviceError, match=r"^cublasSaxpy_v2: n = -1 < 0 \(cuBLAS would return at once\)$"):
        emulated.axpy(-1, 1.0, x, x)
    with pytest.raises(DeviceError, match=r"^cublasSdot_v2: n = -2 < 0"):
        emulated.dot(-2, x, x)


def test_copies_between_arrays_of_other_sizes_or_types(emulated):
    x, y = arange(emulated, 4), arange(emulated, 5)
    with pytest.raises(DeviceError, match=r"^copy: destination of 4 x float32, source of 5 x float32$"):
        emulated.copy(x, y)
    with pytest.raises(DeviceError, match=r"^upload: device array of 4 x float32, host array of 1 x float32$"):
        emulated.upload(x, np.ones(1, np.float32))            # numpy would have broadcast it
    with pytest.raises(DeviceError, match=r"^upload: device array of 4 x float32, host array of 4 x float64$"):
        emulated.upload(x, np.ones(4))
    with pytest.raises(DeviceError, match=r"^download: device array of 4 x float32, host array of 3 x float32$"):
        emulated.download(x, np.empty(3, np.float32))


def test_launch_limits(emulated):
    x = arange(emulated, 4)
    with pytest.raises(DeviceError, match=r"^kernel gpu_set: n = 2147483648 does not fit its int$"):
        emulated.launch("gpu_set", 2 ** 31, 1.0, x)
    with pytest.raises(DeviceError, match=r"^kernel softmax_channel_max: argument 1 = 4294967296 does not fit its "
                                          r"int$"):
        emulated.launch("softmax_channel_max", 4, 2 ** 32, 1, x, x)
