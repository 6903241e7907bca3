"""The GEMM that our threads split (csrc/gemm.pyx through backend/blas.gemm): every transpose, split by rows
and by columns, accumulation, float32 and float64, against numpy; reruns give the same bits. float32 with alpha 1
(and beta 0 or 1) takes sgemm.h's GEMM where the build has it, on each vector path it holds (backend/simd.py)."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.backend import blas, simd

PATHS = simd.paths() or (None,)


@pytest.fixture(params=PATHS)
def path(request):
    """Each vector path of sgemm.h this build holds."""
    if request.param is None:
        yield None
        return
    before = simd.use(request.param)
    yield request.param
    simd.use(before)


@pytest.fixture
def threads():
    before = common.num_threads()
    yield common.set_num_threads
    common.set_num_threads(before)


def _operands(rng, m, n, k, trans_a, trans_b, dtype):
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    return a, b, (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)


# (m, n, k): tall C (split by rows, ragged last block), wide C (split by columns), tiny (one block), k = 1
@pytest.mark.parametrize("m, n, k", [(517, 40, 300), (30, 801, 64), (3, 5, 7), (200, 150, 1)])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_numpy(path, threads, m, n, k, trans_a, trans_b, dtype):
    rng = np.random.default_rng(m * n + k)
    a, b, product = _operands(rng, m, n, k, trans_a, trans_b, dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    scale = np.abs(product).max() + 1
    for count in (1, 2, 3):
        threads(count)
        c = c0.copy()
        blas.gemm(trans_a, trans_b, 0.5, a, b, 0.0, c)            # beta 0 ignores what c held
        np.testing.assert_allclose(c, 0.5 * product, rtol=rtol, atol=rtol * scale)
        c = c0.copy()
        blas.gemm(trans_a, trans_b, 1.0, a, b, 1.0, c)            # beta 1 accumulates (weight gradients)
        np.testing.assert_allclose(c, c0 + product, rtol=rtol, atol=rtol * scale)


def test_same_threads_same_bits(threads):
    # The split depends only on the shapes and the thread count: a rerun gives the same bits (other counts may
    # differ in rounding, as BLAS's own threading does: its kernels treat edge blocks differently).
    rng = np.random.default_rng(5)
    a, b, product = _operands(rng, 640, 500, 800, False, True, np.float32)
    for count in (1, 2, 4):
        threads(count)
        runs = [np.empty((640, 500), np.float32) for _ in range(2)]
        for c in runs:
            blas.gemm(False, True, 1.0, a, b, 0.0, c)
        np.testing.assert_array_equal(runs[0], runs[1])
        np.testing.assert_allclose(runs[0], product, rtol=1e-4, atol=1e-4 * np.abs(product).max())


@pytest.mark.skipif(PATHS[0] is None, reason="this build has no sgemm.h")
def test_sgemm_same_bits_on_any_threads_and_path(threads):
    # sgemm.h sums each element of C in one order (KC blocks of k, in turn), whichever thread, tile or vector
    # path computes it: InnerProduct's results do not depend on the thread count or the machine's vector width
    rng = np.random.default_rng(9)
    for trans_a, trans_b in ((False, True), (True, False), (False, False)):
        a, b, product = _operands(rng, 70, 530, 300, trans_a, trans_b, np.float32)
        c0 = rng.standard_normal((70, 530)).astype(np.float32)
        runs = []
        for name in simd.paths():
            before = simd.use(name)
            for count in (1, 2, 3):
                threads(count)
                c = c0.copy()
                blas.gemm(trans_a, trans_b, 1.0, a, b, 1.0, c)
                runs.append(c)
            simd.use(before)
        for c in runs[1:]:
            np.testing.assert_array_equal(c, runs[0])
        np.testing.assert_allclose(runs[0], c0 + product, rtol=1e-5, atol=1e-5 * (np.abs(product).max() + 1))


def test_empty_sum_and_bad_shapes():
    c = np.full((3, 4), 2.0, np.float32)
    blas.gemm(False, False, 1.0, np.empty((3, 0), np.float32), np.empty((0, 4), np.float32), 1.0, c)
    np.testing.assert_array_equal(c, 2.0)                        # k = 0: C = beta C
    blas.gemm(False, False, 1.0, np.empty((3, 0), np.float32), np.empty((0, 4), np.float32), 0.0, c)
    np.testing.assert_array_equal(c, 0.0)
    with pytest.raises(ValueError, match=r"gemm: op\(a\) \(3, 5\), op\(b\) \(4, 4\) and c \(3, 4\) do not fit"):
        blas.gemm(False, False, 1.0, np.zeros((3, 5), np.float32), np.zeros((4, 4), np.float32), 0.0, c)


@pytest.fixture
def scipy_blas_in_use():
    """The GEMM kernel switched to scipy's LP64 BLAS (the fallback where numpy's ILP64 one is not found)."""
    module = blas.kernel("gemm")
    before = blas.numpy_blas()
    module.use_blas(*blas.scipy_blas(), False)
    yield module
    if before:
        module.use_blas(before[1], before[2], True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scipy_fallback_matches_numpy(threads, scipy_blas_in_use, dtype):
    assert scipy_blas_in_use.blas_in_use() == "lp64"
    rng = np.random.default_rng(11)
    a, b, product = _operands(rng, 70, 33, 45, True, False, dtype)
    threads(2)
    c = np.empty((70, 33), dtype)
    blas.gemm(True, False, 0.5, a, b, 0.0, c)    # (alpha 1 in float32 would take sgemm.h, not BLAS)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(c, 0.5 * product, rtol=rtol, atol=rtol * np.abs(product).max())


def test_loading_a_kernel_leaves_scipy_alone():
    # scipy.linalg's import takes 0.3-0.5 s of a process's start: only the fallback may pay it
    import subprocess
    import sys
    code = ("import sys; from pycaffe_dist.backend import blas; blas.kernel('gemm'); blas.kernel('conv_im2col');"
            "print(blas.kernel('gemm').blas_in_use(), 'scipy.linalg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    if out[0] == "ilp64":
        assert out[1] == "False"
    with pytest.raises(ValueError, match="both GEMMs"):
        blas.kernel("gemm").use_blas(0, 0, True)
