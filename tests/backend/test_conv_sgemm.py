"""float32 2-D convolutions through csrc/conv_fused.pyx and sgemm.h (the GEMMs read images and output diffs in place)
against the float64 BLAS path with unrolled columns (csrc/conv_im2col.pyx): forward with bias, weight gradient
(accumulated), input gradient; over groups, stride, pad, dilation, rectangular kernels, maps whose size is no multiple
of the 16-column tiles, several chunks and one chunk split over threads, the input diff by col2im or (same-size maps)
by correlation, the weight gradient by the GEMM or (few weight columns: conv_direct.h) by direct sums, whole vectors
and masked row tails; on every vector path the build holds (sgemm.h: AVX2, and AVX-512 where the build machine has
it), which must give the same results, bit for bit."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist._kernels import conv_fused as _fused
from pycaffe_dist.backend import conv, simd

pytestmark = pytest.mark.skipif(not conv.sgemm_enabled(), reason="this build has no AVX2/FMA GEMM (sgemm.h)")
PATHS = _fused.simd_paths() if conv.sgemm_enabled() else ("avx2",)

# (channels, height, width), kernel, pad, stride, dilation, group, out_channels
GEOMETRIES = [
    ((20, 12, 12), (5, 5), (0, 0), (1, 1), (1, 1), 1, 50),       # LeNet conv2: 8x8 maps, runs of 8
    ((3, 13, 11), (3, 2), (1, 2), (2, 1), (1, 1), 1, 7),         # strided, padded, odd maps: gathered columns
    ((4, 9, 10), (3, 3), (2, 1), (1, 1), (2, 2), 2, 6),          # groups and dilation
    ((1, 28, 28), (5, 5), (0, 0), (1, 1), (1, 1), 1, 20),        # LeNet conv1: 24-wide rows
    ((32, 8, 8), (1, 1), (0, 0), (1, 1), (1, 1), 4, 16),         # 1x1, 4 groups (input diff: direct, no pad)
    # "same" convolutions: the input diff correlates the padded output diff with the flipped kernel
    ((32, 16, 16), (5, 5), (2, 2), (1, 1), (1, 1), 1, 32),       # CIFAR-10 quick conv2
    ((24, 10, 9), (5, 3), (2, 1), (1, 1), (1, 1), 2, 6),         # rectangular, odd widths, groups
    ((2, 5, 4), (3, 3), (0, 0), (1, 1), (1, 1), 1, 3),           # rows of 4: shorter than one vector
    # 16-column halves of C (AVX-512) that hold two runs: 784 positions, rows of 28; a 7 x 7 map's three runs
    ((16, 28, 28), (3, 3), (1, 1), (1, 1), (1, 1), 1, 20),
    ((6, 14, 14), (3, 3), (1, 1), (2, 2), (1, 1), 1, 10),
    # direct sums (conv_direct.h) on rows of 16 or more (AVX-512: spans of 16 across row ends): CIFAR-10 quick's
    # conv1, and odd rows of 19 with 9 outputs (an 8-output block and one more)
    ((3, 32, 32), (5, 5), (2, 2), (1, 1), (1, 1), 1, 32),
    ((2, 19, 21), (3, 3), (1, 0), (1, 1), (1, 1), 1, 9),
]


@pytest.fixture(autouse=True, params=PATHS)
def path(request):
    """Every test on each vector path this build holds."""
    if not conv.sgemm_enabled():
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


def _reference(engine, w, x, y, b):
    """The BLAS path in float64 (conv.use_sgemm off)."""
    conv.use_sgemm = False
    try:
        out = np.empty(y.shape)
        engine.image_to_output(w.astype(np.float64), x.astype(np.float64), out=out, bias=b.astype(np.float64))
        dw = np.ones(w.shape)
        dx = np.empty(x.shape)
        engine.output_to_image(w.astype(np.float64), y.astype(np.float64), ims_out=dx, dw=dw,
                               ims_in=x.astype(np.float64))
    finally:
        conv.use_sgemm = True
    return out, dw, dx


@pytest.mark.parametrize("num", [1, 2, 37])
@pytest.mark.parametrize("im_shape, kernel, pad, stride, dilation, group, out_channels", GEOMETRIES)
def test_matches_the_blas_path(threads, num, im_shape, kernel, pad, stride, dilation, group, out_channels):
    engine = conv.ConvEngine(im_shape, kernel, pad, stride, dilation, group, out_channels)
    rng = np.random.default_rng(num + out_channels)
    x = rng.standard_normal((num,) + im_shape).astype(np.float32)
    w = rng.standard_normal((out_channels, im_shape[0] // group) + kernel).astype(np.float32)
    b = rng.standard_normal(out_channels).astype(np.float32)
    y = rng.standard_normal((num, out_channels) + engine.out_spatial).astype(np.float32)
    want_out, want_dw, want_dx = _reference(engine, w, x, y, b)
    for count in (1, 2):      # 1: chunks in turn; 2: chunks in parallel, or one chunk's columns split
        threads(count)
        out = np.empty(y.shape, np.float32)
        engine.image_to_output(w, x, out=out, bias=b)
        dw = np.ones(w.shape, np.float32)                    # the weight gradient accumulates
        dx = np.full(x.shape, np.nan, np.float32)            # the input gradient is overwritten
        engine.output_to_image(w, y, ims_out=dx, dw=dw, ims_in=x)
        for got, want in ((out, want_out), (dw, want_dw), (dx, want_dx)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * (np.abs(want).max() + 1))


# Row counts of the GEMMs' A (output channels: forward and weight gradient; input channels: the input diff by
# correlation) that cut into tiles differently (sgemm_blocked.h's sliver plans): for AVX2's 6-row tiles 6s only, a
# remainder of 1 to 5 rows (4- and 5-row tiles borrowing from full ones, or too few rows to borrow), and more rows
# than one MC block (144); for AVX-512's 14-row tiles every height from 1 to 14, evenly cut slivers (15, 27, 29,
# 50) and more rows than one MC block (168).
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 19, 27, 28, 29, 50, 146,
                                  151, 170])
def test_every_row_count_tiles_correctly(threads, rows):
    threads(1)
    im_shape, kernel, pad = (rows, 4, 9), (3, 3), (1, 1)   # "same": the input diff's GEMM has `rows` rows too
    engine = conv.ConvEngine(im_shape, kernel, pad, (1, 1), (1, 1), 1, rows)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((2,) + im_shape).astype(np.float32)
    w = rng.standard_normal((rows, rows) + kernel).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    y = rng.standard_normal((2, rows) + engine.out_spatial).astype(np.float32)
    want_out, want_dw, want_dx = _reference(engine, w, x, y, b)
    out = np.empty(y.shape, np.float32)
    engine.image_to_output(w, x, out=out, bias=b)
    dw = np.ones(w.shape, np.float32)
    dx = np.full(x.shape, np.nan, np.float32)
    engine.output_to_image(w, y, ims_out=dx, dw=dw, ims_in=x)
    for got, want in ((out, want_out), (dw, want_dw), (dx, want_dx)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * (np.abs(want).max() + 1))


@pytest.mark.parametrize("im_shape, kernel, pad, stride, dilation, group, out_channels", GEOMETRIES)
def test_input_diff_writes_nothing_past_the_images(threads, im_shape, kernel, pad, stride, dilation, group,
                                                   out_channels):
    # fold8.h stores whole vectors that spill past a row onto the next; not past the last image
    engine = conv.ConvEngine(im_shape, kernel, pad, stride, dilation, group, out_channels)
    rng = np.random.default_rng(3)
    num = 3
    w = rng.standard_normal((out_channels, im_shape[0] // group) + kernel).astype(np.float32)
    y = rng.standard_normal((num, out_channels) + engine.out_spatial).astype(np.float32)
    count = num * int(np.prod(im_shape))
    for threads_at_work in (1, 2):
        threads(threads_at_work)
        buffer = np.full(count + 64, 7.0, np.float32)
        engine.output_to_image(w, y, ims_out=buffer[:count].reshape((num,) + im_shape))
        assert (buffer[count:] == 7.0).all()


@pytest.mark.parametrize("im_shape, kernel, pad, stride, dilation, group, out_channels", GEOMETRIES)
def test_every_path_gives_the_same_bits(path, threads, im_shape, kernel, pad, stride, dilation, group,
                                       out_channels):
    # the AVX-512 kernels sum each element in the AVX2 kernels' order (sgemm_avx512.h, conv_direct_avx512.h): a
    # build's paths agree where they take the same kernels, but for the direct weight gradient, whose lanes are
    # summed 16 rather than 8 at a time
    if path != PATHS[-1] or len(PATHS) < 2:
        pytest.skip("one comparison per geometry, where the build holds two paths")
    threads(1)   # (threads take chunks as they come, and their dW partials add up in that order)
    engine = conv.ConvEngine(im_shape, kernel, pad, stride, dilation, group, out_channels)
    rng = np.random.default_rng(7)
    num = 5
    x = rng.standard_normal((num,) + im_shape).astype(np.float32)
    w = rng.standard_normal((out_channels, im_shape[0] // group) + kernel).astype(np.float32)
    b = rng.standard_normal(out_channels).astype(np.float32)
    y = rng.standard_normal((num, out_channels) + engine.out_spatial).astype(np.float32)
    results, plans = [], []
    for name in PATHS:
        simd.use(name)
        plans.append(_fused.plan(im_shape, kernel, pad, stride, dilation, group, out_channels))
        out = np.empty(y.shape, np.float32)
        engine.image_to_output(w, x, out=out, bias=b)
        dw = np.ones(w.shape, np.float32)
        dx = np.empty(x.shape, np.float32)
        engine.output_to_image(w, y, ims_out=dx, dw=dw, ims_in=x)
        results.append((out, dw, dx))
    # a pass that takes other kernels on the two paths (the direct sums on rows of fewer than 16 outputs: AVX2
    # only), or the direct weight gradient, agrees to rounding
    for name, got, want in zip(("forward", "dW", "dX"), results[0], results[1]):
        if plans[0][name] != plans[1][name] or plans[0][name] == "direct" and name == "dW":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * (np.abs(want).max() + 1))
        else:
            np.testing.assert_array_equal(got, want)


def test_set_simd_refuses_a_path_not_built():
    with pytest.raises(ValueError, match="not built here"):
        _fused.set_simd("sse2")


def test_the_engines_check_their_arguments():
    # conv_im2col.run and conv_fused.run share conv_pass.pxi's checks, which name the engine; the fused one takes
    # 2-D images only (backend/conv.py sends it no others)
    from pycaffe_dist._kernels import conv_fused
    from pycaffe_dist.backend import blas
    empty = (np.empty(0, np.float32),) * 8
    geometry = ((2, 5, 5), (3, 3), (0, 0), (1, 1), (1, 1))
    with pytest.raises(ValueError, match="conv_fused.run: scratch, chunk or weights"):
        conv_fused.run(*empty, 1, *geometry, 1, 4, 1, 1)
    with pytest.raises(ValueError, match="conv_im2col.run: scratch, chunk or weights"):
        blas.kernel("conv_im2col").run(*empty, 1, *geometry, False, 1, 4, 1, 1)
    with pytest.raises(ValueError, match="2-D images only"):
        conv_fused.run(*empty, 1, (2, 5, 5, 5), (3, 3, 3), (0, 0, 0), (1, 1, 1), (1, 1, 1), 1, 4, 1, 1)
