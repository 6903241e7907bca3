"""The Cython im2col / col2im kernels (csrc/im2col.pyx via pycaffe_dist/backend/im2col.py)."""
import itertools

import numpy as np
import pytest

from pycaffe_dist.backend.im2col import col2im, col_shape, im2col
from pycaffe_dist._kernels import im2col as _k
from tests.conftest import GOLDEN, load_npz
from tests.layers.golden_shapes import check_case_shapes

LAYERS = GOLDEN / "layers"


def im2col_ref(x, kernel, pad, stride, dilation):
    """Plain numpy: pad, then for each kernel tap take the strided slice (row order c, tap, as Caffe)."""
    c, spatial = x.shape[0], x.shape[1:]
    xp = np.pad(x, [(0, 0)] + [(p, p) for p in pad])
    out = [(s + 2 * p - (d * (k - 1) + 1)) // st + 1 for s, k, p, st, d in zip(spatial, kernel, pad, stride, dilation)]
    rows = []
    for ch in range(c):
        for tap in itertools.product(*(range(k) for k in kernel)):
            index = tuple(slice(t * d, t * d + (o - 1) * st + 1, st)
                          for t, d, o, st in zip(tap, dilation, out, stride))
            rows.append(xp[ch][index])
    return np.stack(rows).reshape((c * int(np.prod(kernel)),) + tuple(out))


SETTINGS = [
    # image shape, kernel, pad, stride, dilation
    ((3, 6, 6), (3, 3), (1, 1), (2, 2), (1, 1)),
    ((2, 7, 5), (3, 2), (0, 1), (1, 2), (1, 1)),
    ((2, 9, 9), (3, 3), (2, 2), (1, 1), (2, 2)),
    ((1, 8, 7), (2, 3), (1, 0), (3, 2), (2, 1)),
    ((4, 5, 5), (1, 1), (0, 0), (1, 1), (1, 1)),
    ((2, 4, 4), (4, 4), (3, 3), (1, 1), (1, 1)),      # pad nearly as large as the kernel
    ((2, 10), (3,), (1,), (2,), (1,)),                # 1 spatial axis (N-d kernel)
    ((2, 5, 6, 6), (3, 3, 3), (1, 1, 1), (2, 2, 2), (1, 1, 1)),
    ((1, 4, 7, 6), (2, 3, 1), (1, 0, 2), (1, 2, 3), (2, 1, 1)),
    ((2, 3, 3, 4, 5), (2, 2, 2, 2), (0, 1, 0, 1), (1, 1, 2, 2), (1, 1, 1, 2)),
]


@pytest.mark.parametrize("shape, kernel, pad, stride, dilation", SETTINGS)
@pytest.mark.parametrize("force_nd", [False, True])
def test_im2col_matches_numpy_reference(shape, kernel, pad, stride, dilation, force_nd):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = im2col(x, kernel, pad, stride, dilation, force_nd=force_nd)
    want = im2col_ref(x, kernel, pad, stride, dilation)
    assert got.shape == want.shape == col_shape(shape, kernel, pad, stride, dilation)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, kernel, pad, stride, dilation", SETTINGS)
@pytest.mark.parametrize("force_nd", [False, True])
def test_col2im_is_the_adjoint_of_im2col(shape, kernel, pad, stride, dilation, force_nd):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.standard_normal(col_shape(shape, kernel, pad, stride, dilation)).astype(np.float32)
    lhs = np.dot(im2col(x, kernel, pad, stride, dilation, force_nd=force_nd).ravel().astype(np.float64),
                 y.ravel().astype(np.float64))
    back = col2im(y, shape, kernel, pad, stride, dilation, force_nd=force_nd)
    assert back.shape == shape
    rhs = np.dot(x.ravel().astype(np.float64), back.ravel().astype(np.float64))
    assert lhs == pytest.approx(rhs, rel=1e-5, abs=1e-5)


def test_col2im_overwrites_out():
    y = np.ones(col_shape((1, 3, 3), 2), np.float32)
    out = np.full((1, 3, 3), 7, np.float32)
    col2im(y, (1, 3, 3), 2, out=out)
    np.testing.assert_array_equal(out[0], [[1, 2, 1], [2, 4, 2], [1, 2, 1]])   # the number of windows per pixel


def test_golden_im2col_layer_exact():
    """Caffe's Im2col layer (kernel 3, stride 2, pad 1): forward = im2col per image, backward = col2im."""
    case = LAYERS / "im2col"
    x, y = load_npz(case / "inputs.npz")["data"], load_npz(case / "outputs.npz")["out"]
    dy, dx = load_npz(case / "top_diff.npz")["out"], load_npz(case / "grads.npz")["data"]
    for force_nd in (False, True):
        got = np.stack([im2col(xi, 3, 1, 2, force_nd=force_nd) for xi in x])
        np.testing.assert_array_equal(got, y)
        back = np.stack([col2im(d, xi.shape, 3, 1, 2, force_nd=force_nd) for d, xi in zip(dy, x)])
        np.testing.assert_array_equal(back, dx)


@pytest.mark.parametrize("name", ["conv_plain", "conv_stride2_pad1", "conv_dilation2", "conv_rect_kernel",
                                  "conv_1x1", "conv_3d"])
def test_im2col_gemm_reproduces_caffe_convolution(name):
    """Caffe's forward_cpu_gemm: top = W (out, C k) x col + b, per image (geometry parsed by the layer)."""
    layer, _, _ = check_case_shapes(name)
    case = LAYERS / name
    x, y = load_npz(case / "inputs.npz")["data"], load_npz(case / "outputs.npz")["out"]
    params = load_npz(case / "params.npz")
    w, b = params["param/layer/0"], params["param/layer/1"]
    for xi, yi in zip(x, y):
        col = im2col(xi, layer.kernel, layer.pad, layer.stride, layer.dilation)
        got = (w.reshape(w.shape[0], -1) @ col.reshape(col.shape[0], -1)).reshape(yi.shape)
        got += b.reshape((-1,) + (1,) * (yi.ndim - 1))
        np.testing.assert_allclose(got, yi, rtol=1e-4, atol=1e-5)


def test_caffe_truncating_output_size():
    # (2 + 0 - 3) / 2 + 1 is 1 in C (and in Caffe), 0 with floor division
    assert col_shape((1, 2, 2), 3, 0, 2) == (9, 1, 1)
    col = im2col(np.ones((1, 2, 2), np.float32), 3, 0, 2)
    np.testing.assert_array_equal(col.reshape(3, 3), [[1, 1, 0], [1, 1, 0], [0, 0, 0]])


def test_errors():
    with pytest.raises(ValueError, match="does not fit"):
        im2col(np.zeros((1, 2, 2), np.float32), 5)
    with pytest.raises(ValueError, match="one value per spatial axis"):
        im2col(np.zeros((1, 4, 4), np.float32), (3, 3, 3))
    with pytest.raises(ValueError, match="column buffer"):
        col2im(np.zeros((5,), np.float32), (1, 4, 4), 3)
    with pytest.raises(ValueError, match="out must be"):
        im2col(np.zeros((1, 4, 4), np.float32), 3, out=np.zeros((9, 2, 3), np.float32))
    with pytest.raises(ValueError, match="bad im2col geometry"):
        im2col(np.zeros((1, 4, 4), np.float32), 3, stride=0)


def test_accepts_non_contiguous_input_and_keeps_float64():
    x = np.random.default_rng(2).standard_normal((3, 8, 8))
    view = x[:, ::2, ::2]
    got = im2col(view, 2)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, im2col_ref(view, (2, 2), (0, 0), (1, 1), (1, 1)))
    np.testing.assert_array_equal(im2col(view.astype(np.float32), 2),
                                  im2col_ref(view.astype(np.float32), (2, 2), (0, 0), (1, 1), (1, 1)))
    assert im2col(view.astype(np.int32), 2).dtype == np.float32


@pytest.mark.parametrize("im_shape,kernel,pad,stride,dilation,force_nd", [
    ((3, 7, 6), (3, 2), (1, 0), (2, 1), (1, 2), False),
    ((2, 5, 6), (2, 2), (0, 1), (1, 2), (1, 1), True),
    ((2, 4, 5, 3), (2, 3, 2), (1, 0, 1), (1, 2, 1), (1, 1, 2), False),
])
def test_batch_layout_is_the_per_image_buffers_side_by_side(im_shape, kernel, pad, stride, dilation, force_nd):
    """num images give (rows, num, *out): row r of image n equals row r of that image's own buffer; col2im of the
    batch buffer gives each image's col2im."""
    num = 3
    rng = np.random.default_rng(5)
    ims = rng.standard_normal((num,) + im_shape)
    shape = col_shape(im_shape, kernel, pad, stride, dilation)
    batch = np.empty((shape[0], num) + shape[1:])
    _k.im2col(ims.reshape(-1), batch.reshape(-1), im_shape, kernel, pad, stride, dilation, force_nd, num)
    for n in range(num):
        np.testing.assert_array_equal(batch[:, n], im2col(ims[n], kernel, pad, stride, dilation, force_nd))
    cols = rng.standard_normal(batch.shape)
    back = np.empty_like(ims)
    _k.col2im(cols.reshape(-1), back.reshape(-1), im_shape, kernel, pad, stride, dilation, force_nd, num)
    for n in range(num):
        np.testing.assert_allclose(back[n], col2im(np.ascontiguousarray(cols[:, n]), im_shape, kernel, pad, stride,
                                                   dilation, force_nd), rtol=1e-12)


@pytest.mark.parametrize("name", ["deconv_stride2", "deconv_stride2_pad1", "deconv_bilinear_group"])
def test_col2im_gemm_reproduces_caffe_deconvolution(name):
    """Caffe's Deconvolution forward: col = W^T x per group, then top = col2im(col) + b."""
    layer, _, top = check_case_shapes(name)
    case = LAYERS / name
    x, y = load_npz(case / "inputs.npz")["data"], load_npz(case / "outputs.npz")["out"]
    params = load_npz(case / "params.npz")
    w, g = params["param/layer/0"], layer.group
    for xi, yi in zip(x, y):
        cols = [wg.reshape(wg.shape[0], -1).T @ xg.reshape(xg.shape[0], -1)
                for wg, xg in zip(np.split(w, g), np.split(xi, g))]
        got = col2im(np.concatenate(cols), yi.shape, layer.kernel, layer.pad, layer.stride, layer.dilation)
        if layer.bias_term:
            got += params["param/layer/1"].reshape(-1, 1, 1)
        np.testing.assert_allclose(got, yi, rtol=1e-4, atol=1e-5)
