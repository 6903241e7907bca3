"""Pooling and SPP (pycaffe_dist/layers/pool.py) and their kernels (csrc/pooling.pyx via
pycaffe_dist/backend/pooling.py): forward values and window positions against a per-window numpy reference in
both dtypes (blocks of 8 planes and partial blocks, padding, rectangles, ties), Caffe's own forward cases of
test_pooling_layer.cpp, the mask top, STOCHASTIC (sampling and its TEST output), SPP against the reference
levels, errors, and the gradient checks of Caffe's test_pooling_layer.cpp / test_stochastic_pooling.cpp."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist._kernels import pooling as kernels
from pycaffe_dist.backend import pooling
from pycaffe_dist.layers import create_layer
from pycaffe_dist.layers.pool import spp_level_geometry
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.gradient_checker import check_layer, layer_param

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST
FLT_MAX = float(np.finfo(np.float32).max)


def run(text, x, dy=None, phase=TRAIN, ntop=1, seed=None, type_="Pooling"):
    """Forward (and backward with top diff dy) on one bottom of x's dtype; returns (layer, tops' data, bottom diff).
    `text` is the pooling_param (spp_param for SPP) body."""
    param = "pooling_param" if type_ == "Pooling" else "spp_param"
    bottom = Blob(x.shape, dtype=x.dtype)
    bottom.data[...] = x
    top = [Blob(dtype=x.dtype) for _ in range(ntop)]
    layer = create_layer(layer_param('type: "%s" %s { %s }' % (type_, param, text)), phase)
    layer.setup([bottom], top)
    if seed is not None:
        common.set_random_seed(seed)
    layer.forward([bottom], top)
    ys = [t.data.copy() for t in top]
    if dy is None:
        return layer, ys, None
    bottom.diff[...] = np.nan   # backward must overwrite it
    top[0].diff[...] = dy
    layer.backward(top, [True], [bottom])
    return layer, ys, bottom.diff.copy()


def reference(x, kernel, stride, pad, pooled, method):
    """Caffe's loops, window by window in numpy: (top, positions) for MAX, (top, None) for AVE."""
    (kh, kw), (sh, sw), (ph_, pw_) = kernel, stride, pad
    n, c, height, width = x.shape
    y = np.full((n, c) + pooled, -FLT_MAX if method == "MAX" else 0, x.dtype)
    mask = np.full((n, c) + pooled, -1, np.int64)   # Caffe's start: a window off the image keeps these
    for i in range(pooled[0]):
        for j in range(pooled[1]):
            hs, ws = i * sh - ph_, j * sw - pw_
            he, we = min(hs + kh, height + ph_), min(ws + kw, width + pw_)
            size = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, height), min(we, width)
            window = x[:, :, hs:he, ws:we].reshape(n, c, -1)
            if method == "MAX" and window.size:
                first = window.argmax(-1)   # numpy's argmax: the first maximum in row-major order, as Caffe's '>'
                y[:, :, i, j] = np.take_along_axis(window, first[..., None], -1)[..., 0]
                mask[:, :, i, j] = (hs + first // (we - ws)) * width + ws + first % (we - ws)
            elif method == "AVE":
                y[:, :, i, j] = window.astype(np.float64).sum(-1) / size
    return y, (mask if method == "MAX" else None)


def text_of(method, kernel, stride, pad):
    return "pool: %s kernel_h: %d kernel_w: %d stride_h: %d stride_w: %d pad_h: %d pad_w: %d" % (
        (method,) + tuple(kernel) + tuple(stride) + tuple(pad))


GEOMETRIES = [   # kernel, stride, pad, input (num, channels, height, width)
    ((3, 3), (2, 2), (0, 0), (2, 7, 9, 9)),     # ceil: the last window is clipped; 14 planes: a block and a part
    ((2, 2), (2, 2), (1, 1), (3, 8, 5, 5)),     # padding, last window dropped (Caffe's clipping rule)
    ((3, 2), (2, 1), (1, 0), (1, 19, 7, 6)),    # rectangular kernel / stride / pad
    ((3, 3), (1, 1), (2, 2), (1, 3, 4, 5)),     # overlapping windows wholly in the padding on one side
    ((4, 3), (3, 2), (0, 1), (2, 5, 11, 8)),
    ((1, 1), (3, 3), (0, 0), (2, 2, 5, 5)),     # stride past the kernel: the last window starts off the image
    ((2, 2), (2, 2), (0, 0), (2, 3, 8, 20)),    # whole 2x2 windows (float32's own kernel): 8 outputs and a tail
    ((2, 2), (2, 2), (0, 0), (1, 4, 24, 24)),   # LeNet's pool1
    ((1, 2), (2, 2), (0, 1), (1, 2, 8, 8)),     # padded width: Caffe clips the unpadded height too (4 x 5)
    ((3, 2), (4, 3), (0, 1), (2, 3, 4, 4)),     # the same with ceil windows past the edge (1 x 2)
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("kernel, stride, pad, shape", GEOMETRIES)
def test_forward_backward_against_reference(kernel, stride, pad, shape, method, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(dtype)
    layer, (y,), _ = run(text_of(method, kernel, stride, pad), x)
    want, positions = reference(x, kernel, stride, pad, layer.pooled, method)
    if method == "MAX":
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(layer.index, positions)
    else:
        np.testing.assert_allclose(y, want, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-7)
    # backward: every input gets the top diffs of the windows that chose it (MAX) or cover it (AVE)
    dy = rng.standard_normal(y.shape).astype(dtype)
    _, _, dx = run(text_of(method, kernel, stride, pad), x, dy)
    want_dx = np.zeros(x.shape)
    (kh, kw), (sh, sw), (p_h, p_w) = kernel, stride, pad
    n, c, height, width = x.shape
    for i in range(y.shape[2]):
        for j in range(y.shape[3]):
            hs, ws = i * sh - p_h, j * sw - p_w
            he, we = min(hs + kh, height + p_h), min(ws + kw, width + p_w)
            size = (he - hs) * (we - ws)
            if method == "MAX":
                for a in range(n):
                    for b in range(c):
                        if positions[a, b, i, j] >= 0:
                            h, w = divmod(positions[a, b, i, j], width)
                            want_dx[a, b, h, w] += dy[a, b, i, j]
            else:
                want_dx[:, :, max(hs, 0):min(he, height), max(ws, 0):min(we, width)] += \
                    dy[:, :, i, j, None, None].astype(np.float64) / size
    np.testing.assert_allclose(dx, want_dx, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-6)


def test_max_ties_take_the_first_in_row_major_order():
    # Caffe keeps the first strict maximum scanning rows then columns: a tie on an earlier row wins over an
    # earlier column; ReLU-like zeros tie everywhere.
    x = np.zeros((1, 9, 3, 3), np.float32)
    x[0, 0] = [[0, 0, 5], [5, 0, 0], [0, 0, 0]]   # (0, 2) and (1, 0) tie: row 0 first
    x[0, 1] = [[1, 2, 2], [2, 2, 1], [0, 0, 0]]
    x[0, 2, 2, 2] = 1                            # a single maximum at the end
    x[0, 3] = -1                                 # all equal negatives: the first
    x[0, 4] = [[-0.0, 0.0, 0], [0, 0, 0], [0, 0, 0]]   # -0 == +0: the first one, and its sign
    for dtype in (np.float32, np.float64):
        layer, (y, mask), _ = run("kernel_size: 3", x.astype(dtype), ntop=2)
        assert mask.reshape(-1).tolist() == [2, 1, 8, 0, 0, 0, 0, 0, 0]
        assert y.reshape(-1).tolist() == [5, 2, 1, -1, 0, 0, 0, 0, 0] and np.signbit(y[0, 4, 0, 0])


def test_max_nan_and_lowest_values_choose_nothing():
    # Caffe starts at -FLT_MAX with '>': NaN and -FLT_MAX (or -inf) never win; a window of only those keeps
    # -FLT_MAX with no position, and backward sends its diff nowhere (Caffe would write at index -1).
    x = np.array([np.nan, -np.inf, -FLT_MAX, np.nan, 2.0, np.nan]).reshape(1, 1, 2, 3)
    for dtype in (np.float32, np.float64):
        layer, (y,), dx = run("kernel_h: 2 kernel_w: 1", x.astype(dtype), dy=np.ones((1, 1, 1, 3)))
        assert y.reshape(-1).tolist() == [-FLT_MAX, 2.0, -FLT_MAX]
        assert layer.index.reshape(-1).tolist() == [-1, 4, -1]
        assert dx.reshape(-1).tolist() == [0, 0, 0, 0, 1, 0]


@pytest.mark.parametrize("accumulate", [False, True])
def test_whole_2x2_windows_match_the_general_loops(accumulate):
    # float32 2x2 stride-2 windows that tile the plane have their own kernels; ties (ReLU zeros), NaN, -inf and
    # -FLT_MAX must choose what Caffe's loop chooses, and the backward must equal the scatter it replaces.
    rng = np.random.default_rng(5)
    x = rng.integers(-2, 3, (3, 5, 6, 26)).astype(np.float32)       # many ties
    x.reshape(-1)[rng.choice(x.size, 60, replace=False)] = np.nan
    x.reshape(-1)[rng.choice(x.size, 60, replace=False)] = -np.inf
    x.reshape(-1)[rng.choice(x.size, 60, replace=False)] = -FLT_MAX
    x[0, 0, :2, :2] = np.nan                                         # a window that chooses nothing
    kernel, stride, pad = (2, 2), (2, 2), (0, 0)
    y = np.empty((3, 5, 3, 13), np.float32)
    mask = np.empty(y.shape, np.int32)
    pooling.max_forward(x, y, mask, kernel, stride, pad)
    want, positions = np.empty(y.shape, np.float64), np.empty(y.shape, np.int32)
    pooling.max_forward(x.astype(np.float64), want, positions, kernel, stride, pad)   # float64: the general loop
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(mask, positions)
    assert mask[0, 0, 0, 0] == -1
    dy = rng.standard_normal(y.shape).astype(np.float32)
    start = rng.standard_normal(x.shape).astype(np.float32)
    fast, general = start.copy(), start.copy()
    pooling.mask_backward(dy, mask, fast, accumulate, kernel, stride, pad)
    pooling.mask_backward(dy, mask, general, accumulate)               # no geometry: the scatter loop
    np.testing.assert_array_equal(fast, general)


@pytest.mark.parametrize("height, width", [(32, 32), (13, 35), (7, 16), (9, 17), (2, 2), (3, 40), (16, 33)])
def test_3x3_stride_2_windows_match_the_general_loop(height, width):
    # float32 3x3 stride-2 MAX windows without padding (CIFAR-10, CaffeNet, GoogLeNet) have their own kernel;
    # Caffe's ceil rounding clips the last row and column of windows (even sizes), and ties, NaN, -inf and
    # -FLT_MAX must choose what Caffe's loop chooses.
    rng = np.random.default_rng(height * 100 + width)
    x = rng.integers(-2, 3, (2, 3, height, width)).astype(np.float32)
    for value in (np.nan, -np.inf, -FLT_MAX, -0.0):
        x.reshape(-1)[rng.choice(x.size, x.size // 20, replace=False)] = value
    x[0, 0, :3, :3] = np.nan                                          # a window that chooses nothing
    x[1, 2] = np.where(x[1, 2] == 0, -0.0, -1)                        # maxima that are -0.0
    kernel, stride, pad = (3, 3), (2, 2), (0, 0)
    pooled = tuple(-(-(d - 3) // 2) + 1 for d in (height, width))
    y = np.empty((2, 3) + pooled, np.float32)
    mask = np.empty(y.shape, np.int32)
    pooling.max_forward(x, y, mask, kernel, stride, pad)
    want, positions = np.empty(y.shape, np.float64), np.empty(y.shape, np.int32)
    pooling.max_forward(x.astype(np.float64), want, positions, kernel, stride, pad)   # float64: the general loop
    np.testing.assert_array_equal(y, want)
    assert np.array_equal(np.signbit(y), np.signbit(want))
    np.testing.assert_array_equal(mask, positions)
    if height >= 3 and width >= 3:
        assert mask[0, 0, 0, 0] == -1
    # the backward gathers what the scatter loop adds, in its order (ties of dy sums would show another order)
    dy = rng.integers(-3, 4, y.shape).astype(np.float32) / np.float32(3)
    for accumulate in (False, True):
        start = rng.standard_normal(x.shape).astype(np.float32)
        start.reshape(-1)[::7] = -0.0
        fast, general = start.copy(), start.copy()
        pooling.mask_backward(dy, mask, fast, accumulate, kernel, stride, pad)
        pooling.mask_backward(dy, mask, general, accumulate)               # no geometry: the scatter loop
        np.testing.assert_array_equal(fast, general)
        assert np.array_equal(np.signbit(fast), np.signbit(general))


def caffe_ave_3x3_stride_2(x, dy=None, start=None):
    """Caffe's AVE loops in float32 for 3x3 windows at stride 2 without padding: the forward, or (dy given) the
    backward added to `start`."""
    height, width = x.shape[2:]
    pooled = tuple(-(-(d - 3) // 2) + 1 for d in (height, width))
    y = np.zeros(x.shape[:2] + pooled, np.float32)
    dx = None if dy is None else start.copy()
    for ph in range(pooled[0]):
        for pw in range(pooled[1]):
            rows, cols = range(2 * ph, min(2 * ph + 3, height)), range(2 * pw, min(2 * pw + 3, width))
            size = np.float32(len(rows) * len(cols))
            share = None if dy is None else dy[:, :, ph, pw] / size
            for h in rows:
                for w in cols:
                    if dy is None:
                        y[:, :, ph, pw] = y[:, :, ph, pw] + x[:, :, h, w]
                    else:
                        dx[:, :, h, w] = dx[:, :, h, w] + share
            y[:, :, ph, pw] /= size
    return y if dy is None else dx


@pytest.mark.parametrize("height, width", [(16, 16), (8, 8), (13, 35), (9, 17), (2, 2), (3, 40), (16, 33)])
def test_3x3_stride_2_average_matches_caffe_in_float32(height, width):
    rng = np.random.default_rng(height * 100 + width)
    x = rng.standard_normal((2, 3, height, width)).astype(np.float32)
    x.reshape(-1)[::11] = -0.0
    kernel, stride, pad = (3, 3), (2, 2), (0, 0)
    want = caffe_ave_3x3_stride_2(x)
    y = np.empty(want.shape, np.float32)
    pooling.ave_forward(x, y, kernel, stride, pad)
    np.testing.assert_array_equal(y, want)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    for accumulate in (False, True):
        start = rng.standard_normal(x.shape).astype(np.float32) if accumulate else np.zeros(x.shape, np.float32)
        start.reshape(-1)[::5] = -0.0
        dx = start.copy()
        pooling.ave_backward(dy, dx, kernel, stride, pad, accumulate)
        want_dx = caffe_ave_3x3_stride_2(x, dy, start if accumulate else np.zeros(x.shape, np.float32))
        np.testing.assert_array_equal(dx, want_dx)
        assert np.array_equal(np.signbit(dx), np.signbit(want_dx))


def test_caffe_forward_square_with_mask_top():
    # TestForwardSquare (2 x 2 kernel, stride 1) with the mask as a second top.
    plane = np.array([[1, 2, 5, 2, 3], [9, 4, 1, 4, 8], [1, 2, 5, 2, 3]], np.float32)
    x = np.tile(plane, (2, 2, 1, 1))
    _, (y, mask), _ = run("kernel_size: 2", x, ntop=2)
    np.testing.assert_array_equal(y, np.tile([[9, 5, 5, 8], [9, 5, 5, 8]], (2, 2, 1, 1)))
    np.testing.assert_array_equal(mask, np.tile([[5, 2, 2, 9], [5, 12, 12, 9]], (2, 2, 1, 1)))
    assert mask.dtype == np.float32


def test_caffe_forward_rect_high_and_wide():
    magic = np.array([[35, 1, 6, 26, 19, 24], [3, 32, 7, 21, 23, 25], [31, 9, 2, 22, 27, 20],
                      [8, 28, 33, 17, 10, 15], [30, 5, 34, 12, 14, 16], [4, 36, 29, 13, 18, 11]], np.float32)
    x = np.tile(magic, (2, 2, 1, 1))
    _, (y, mask), _ = run("kernel_h: 3 kernel_w: 2", x, ntop=2)
    np.testing.assert_array_equal(y[0, 0], [[35, 32, 26, 27, 27], [32, 33, 33, 27, 27], [31, 34, 34, 27, 27],
                                            [36, 36, 34, 18, 18]])
    np.testing.assert_array_equal(mask[1, 1], [[0, 7, 3, 16, 16], [7, 20, 20, 16, 16], [12, 26, 26, 16, 16],
                                               [31, 31, 26, 34, 34]])
    _, (y, mask), _ = run("kernel_h: 2 kernel_w: 3", x, ntop=2)
    np.testing.assert_array_equal(y[1, 0], [[35, 32, 26, 26], [32, 32, 27, 27], [33, 33, 33, 27],
                                            [34, 34, 34, 17], [36, 36, 34, 18]])
    np.testing.assert_array_equal(mask[0, 1], [[0, 7, 3, 3], [7, 7, 16, 16], [20, 20, 20, 16],
                                               [26, 26, 26, 21], [31, 31, 26, 34]])


def test_caffe_forward_max_padded_and_ave():
    # TestForwardMaxPadded and TestForwardAve of test_pooling_layer.cpp.
    x = np.array([[1, 2, 4], [2, 3, 2], [4, 2, 1]], np.float32).reshape(1, 1, 3, 3)
    _, (y,), _ = run("kernel_size: 3 stride: 2 pad: 2", x)
    np.testing.assert_array_equal(y[0, 0], [[1, 4, 4], [4, 4, 4], [4, 4, 1]])
    _, (y,), _ = run("pool: AVE kernel_size: 3 stride: 1 pad: 1", np.full((1, 1, 3, 3), 2, np.float32))
    np.testing.assert_allclose(y[0, 0], [[8 / 9, 4 / 3, 8 / 9], [4 / 3, 2, 4 / 3], [8 / 9, 4 / 3, 8 / 9]], rtol=1e-6)


def test_mask_top_is_what_backward_reads():
    # With a mask top, Caffe's backward reads the positions from it (as ints), not from its own copy.
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    bottom, top = Blob(x.shape), [Blob(), Blob()]
    bottom.data[...] = x
    layer = create_layer(layer_param('type: "Pooling" pooling_param { kernel_size: 2 stride: 2 }'))
    layer.setup([bottom], top)
    layer.forward([bottom], top)
    np.testing.assert_array_equal(top[1].data[0, 0], [[5, 7], [13, 15]])
    top[1].data[...] = [[0, 1], [2, 3.9]]   # 3.9 reads as 3, as static_cast<int>
    top[0].diff[...] = [[1, 2], [3, 4]]
    layer.backward(top, [True], [bottom])
    np.testing.assert_array_equal(bottom.diff.reshape(-1), [1, 2, 3, 4] + [0] * 12)


def test_global_pooling_values():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 5, 4, 7))
    _, (y,), _ = run("pool: MAX global_pooling: true", x)
    np.testing.assert_array_equal(y[..., 0, 0], x.max(axis=(2, 3)))
    _, (y,), _ = run("pool: AVE global_pooling: true", x)
    np.testing.assert_allclose(y[..., 0, 0], x.mean(axis=(2, 3)), rtol=1e-13)


def test_float32_matches_float64_and_threads_do_not_matter():
    # float32 MAX runs on generic vectors, float64 on the scalar lanes; OpenMP splits blocks of planes.
    rng = np.random.default_rng(11)
    x = rng.integers(-3, 4, (5, 7, 12, 13)).astype(np.float32)   # many ties
    text = "kernel_size: 3 stride: 2 pad: 1"
    runs, before = [], common.num_threads()
    try:
        for threads in (1, 2):
            common.set_num_threads(threads)
            for dtype in (np.float32, np.float64):
                layer, (y,), _ = run(text, x.astype(dtype))
                runs.append((y.astype(np.float64), layer.index.copy()))
    finally:
        common.set_num_threads(before)
    for y, index in runs[1:]:
        np.testing.assert_array_equal(y, runs[0][0])
        np.testing.assert_array_equal(index, runs[0][1])


def test_ave_sums_in_caffe_order():
    # Caffe sums a window row by row from 0, then divides: float32 results equal that sequential sum exactly.
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((1, 9, 6, 6)) * 10 ** rng.uniform(-3, 3, (1, 9, 6, 6))).astype(np.float32)
    _, (y,), _ = run("pool: AVE kernel_size: 3 stride: 3", x)
    for c in range(9):
        for i in range(2):
            for j in range(2):
                total = np.float32(0)
                for v in x[0, c, 3 * i:3 * i + 3, 3 * j:3 * j + 3].reshape(-1):
                    total = np.float32(total + v)
                assert y[0, c, i, j] == np.float32(total / np.float32(9))


# --- STOCHASTIC ---------------------------------------------------------------------------------------------

def test_stochastic_train_samples_in_proportion():
    # Each window outputs one of its inputs, drawn with probability proportional to it (Caffe's GPU rule).
    x = np.tile(np.array([[1, 0], [3, 0]], np.float32), (4000, 1, 1, 1))
    layer, (y,), _ = run("pool: STOCHASTIC kernel_size: 2 stride: 2", x, seed=7)
    index = layer.index.reshape(-1)
    assert set(index.tolist()) == {0, 2}
    assert abs(np.mean(index == 2) - 0.75) < 0.03
    np.testing.assert_array_equal(y.reshape(-1), np.where(index == 2, 3, 1))
    # reproducible under the seed; an all-zero window picks its first input
    _, (again,), _ = run("pool: STOCHASTIC kernel_size: 2 stride: 2", x, seed=7)
    np.testing.assert_array_equal(again, y)
    layer, (y,), _ = run("pool: STOCHASTIC kernel_size: 2", np.zeros((1, 1, 2, 2), np.float32))
    assert y[0, 0, 0, 0] == 0 and layer.index[0, 0, 0, 0] == 0


def test_stochastic_train_values_come_from_the_window():
    # Caffe's TestStochastic: every output is one of its window's inputs, and backward routes the diff there.
    rng = np.random.default_rng(4)
    x = rng.uniform(0.1, 1, (2, 3, 6, 5))
    layer, (y,), dx = run("pool: STOCHASTIC kernel_size: 3 stride: 2", x, dy=np.ones((2, 3, 3, 2)), seed=3)
    for i in range(3):
        for j in range(2):
            window = x[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
            assert np.all((window == y[:, :, i, j, None, None]).any(axis=(2, 3)))
    h, w = np.divmod(layer.index, 5)
    np.testing.assert_array_equal(np.take_along_axis(x.reshape(2, 3, -1), layer.index.reshape(2, 3, -1), -1),
                                  y.reshape(2, 3, -1))
    assert np.all((h >= 0) & (w >= 0)) and dx.sum() == y.size   # each output's diff lands on its input


def test_stochastic_test_phase_weights_by_value():
    # TEST: sum(x^2) / sum(x) per window (Caffe's StoPoolForwardTest), 0 for an all-zero window.
    rng = np.random.default_rng(6)
    x = rng.uniform(0, 1, (2, 3, 6, 5))
    x[0, 0, :3, :3] = 0
    _, (y,), _ = run("pool: STOCHASTIC kernel_size: 3 stride: 2", x, phase=TEST)
    for i in range(3):
        for j in range(2):
            window = x[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
            total = window.sum(axis=(2, 3))
            want = np.divide((window ** 2).sum(axis=(2, 3)), total, out=np.zeros_like(total), where=total > 0)
            np.testing.assert_allclose(y[:, :, i, j], want, rtol=1e-12)
    assert y[0, 0, 0, 0] == 0
    assert np.all(y <= np.max(x))   # Caffe's TestStochasticTestPhase: never above the window's maximum


# --- SPP --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, height", [("MAX", 1), ("MAX", 3), ("AVE", 2), ("AVE", 3)])
def test_spp_concatenates_the_levels(method, height):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 9, 7)).astype(np.float32)
    layer, (y,), _ = run("pyramid_height: %d pool: %s" % (height, method), x, type_="SPP")
    levels = []
    for level in range(height):
        kernel, stride, pad = spp_level_geometry(9, 7, level)
        pooled = layer.levels[level][3]
        levels.append(reference(x, kernel, stride, pad, pooled, method)[0])
    want = levels[0] if height == 1 else np.concatenate([v.reshape(2, -1) for v in levels], axis=1)
    assert y.shape == want.shape
    if method == "MAX":
        np.testing.assert_array_equal(y, want)
    else:
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)
    # backward: the levels' input diffs add up
    dy = rng.standard_normal(y.shape).astype(np.float32)
    _, _, dx = run("pyramid_height: %d pool: %s" % (height, method), x, dy=dy, type_="SPP")
    offset, want_dx = 0, np.zeros(x.shape)
    for level, v in enumerate(levels):
        kernel, stride, pad = spp_level_geometry(9, 7, level)
        part = (dy if height == 1 else dy[:, offset:offset + v[0].size]).reshape(v.shape)
        offset += v[0].size
        _, _, d = run(text_of(method, kernel, stride, pad), x, dy=part)
        want_dx += d
    np.testing.assert_allclose(dx, want_dx, rtol=1e-6, atol=1e-7)


def test_spp_stochastic_samples_in_every_phase():
    # Caffe's SPP builds its Pooling layers from a fresh LayerParameter, whose phase is TRAIN.
    x = np.random.default_rng(1).uniform(0.1, 1, (1, 2, 4, 4))
    _, (train,), _ = run("pyramid_height: 2 pool: STOCHASTIC", x, type_="SPP", seed=5)
    _, (test,), _ = run("pyramid_height: 2 pool: STOCHASTIC", x, type_="SPP", seed=5, phase=TEST)
    np.testing.assert_array_equal(train, test)
    assert set(np.round(test.reshape(-1), 12)) <= set(np.round(x.reshape(-1), 12))


# --- kernel errors ------------------------------------------------------------------------------------------

def test_kernel_argument_errors():
    x = np.zeros((1, 2, 4, 4), np.float32)
    y, mask = np.zeros((1, 2, 2, 2), np.float32), np.zeros((1, 2, 2, 2), np.int32)
    with pytest.raises(ValueError, match="C-contiguous"):
        pooling.max_forward(x[:, :, ::2], y, mask, (2, 2), (2, 2), (0, 0))
    with pytest.raises(ValueError, match="do not match the geometry"):
        kernels.ave_forward(x.reshape(2, 16), y.reshape(2, 4), (4, 4, 3, 3, 2, 2, 2, 2, 0, 0))
    with pytest.raises(ValueError, match="mask must be shaped like the output"):
        pooling.max_forward(x, y, np.zeros((1, 2, 2, 1), np.int32), (2, 2), (2, 2), (0, 0))
    with pytest.raises(ValueError, match="bad pooling geometry"):
        pooling.ave_forward(x, y, (0, 2), (2, 2), (0, 0))
    with pytest.raises(ValueError, match="Buffer dtype mismatch|No matching signature"):
        pooling.ave_forward(x, y.astype(np.float64), (2, 2), (2, 2), (0, 0))


# --- gradient checks ------------------------------------------------------------------------------------------

def gaussian(shape=(2, 3, 6, 5), seed=1701):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("kernel_h, kernel_w", [(3, 3), (3, 4), (4, 3), (4, 4)])
def test_gradient_max(kernel_h, kernel_w):
    # TestGradientMax: stride 2, pad 1, GradientChecker(1e-4, 1e-2); Caffe checks every top element separately,
    # we do that for one setting (test_gradient_max_exhaustive) and the summed objective for all.
    check_layer('type: "Pooling" pooling_param { kernel_h: %d kernel_w: %d stride: 2 pad: 1 pool: MAX }'
                % (kernel_h, kernel_w), [gaussian()], stepsize=1e-4, threshold=1e-2)


def test_gradient_max_exhaustive():
    check_layer('type: "Pooling" pooling_param { kernel_h: 3 kernel_w: 4 stride: 2 pad: 1 pool: MAX }',
                [gaussian((1, 2, 5, 5))], mode="exhaustive", stepsize=1e-4, threshold=1e-2)


@pytest.mark.parametrize("kernel_h, kernel_w", [(3, 3), (4, 3)])
def test_gradient_max_top_mask(kernel_h, kernel_w):
    check_layer('type: "Pooling" pooling_param { kernel_h: %d kernel_w: %d stride: 2 pool: MAX }'
                % (kernel_h, kernel_w), [gaussian()], num_tops=2, stepsize=1e-4, threshold=1e-2)


@pytest.mark.parametrize("kernel_h, kernel_w, pad", [(3, 3, 0), (3, 4, 0), (4, 4, 0), (3, 3, 2), (4, 3, 2)])
def test_gradient_ave(kernel_h, kernel_w, pad):
    # TestGradientAve / TestGradientAvePadded: stride 2, GradientChecker(1e-2, 1e-2).
    check_layer('type: "Pooling" pooling_param { kernel_h: %d kernel_w: %d stride: 2 pad: %d pool: AVE }'
                % (kernel_h, kernel_w, pad), [gaussian()], stepsize=1e-2, threshold=1e-2)


def test_gradient_ave_exhaustive_rectangular():
    check_layer('type: "Pooling" pooling_param { kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 '
                'pad_w: 0 pool: AVE }', [gaussian((1, 2, 5, 4))], mode="exhaustive", stepsize=1e-2, threshold=1e-2)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_gradient_global(method):
    check_layer('type: "Pooling" pooling_param { global_pooling: true pool: %s }' % method, [gaussian()],
                stepsize=1e-4 if method == "MAX" else 1e-2, threshold=1e-2)


def test_gradient_stochastic_train():
    # test_stochastic_pooling.cpp TestGradient: inputs uniform in [0.1, 1], kernel 3 stride 2, GradientChecker(1e-4,
    # 1e-2), the checker reseeding before every forward so that each one draws the same numbers.
    x = np.random.default_rng(1701).uniform(0.1, 1, (2, 3, 6, 5))
    check_layer('type: "Pooling" pooling_param { kernel_size: 3 stride: 2 pool: STOCHASTIC }', [x],
                stepsize=1e-4, threshold=1e-2)


def test_gradient_stochastic_test():
    # Our TEST-phase backward is the exact gradient of sum(x^2) / sum(x) (Caffe's has none that is meaningful).
    x = np.random.default_rng(1701).uniform(0.1, 1, (2, 3, 6, 5))
    check_layer('type: "Pooling" pooling_param { kernel_size: 3 stride: 2 pool: STOCHASTIC }', [x], phase=TEST)


@pytest.mark.parametrize("method, height", [("MAX", 3), ("AVE", 2), ("AVE", 1)])
def test_gradient_spp(method, height):
    # test_spp_layer.cpp TestGradient: GradientChecker(1e-4, 1e-2) on a 2 x 3 x 9 x 8 bottom; smaller here.
    check_layer('type: "SPP" spp_param { pyramid_height: %d pool: %s }' % (height, method),
                [gaussian((1, 2, 7, 6))], stepsize=1e-4, threshold=1e-2)
