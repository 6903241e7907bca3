"""Convolution, Deconvolution and Im2col: gradients (Caffe's checker), a direct reference, chunking, errors."""
import itertools

import numpy as np
import pytest

from pycaffe_dist.backend import conv as conv_backend
from tests.layers.gradient_checker import GradientChecker, check_layer, layer_param

RNG = np.random.default_rng(11)


def conv_text(kind="Convolution", extra="", num_output=4, filler="gaussian std: 0.5"):
    return ('type: "%s" convolution_param { num_output: %d %s weight_filler { type: "gaussian" std: 0.5 } '
            'bias_filler { type: "gaussian" std: 0.5 } }' % (kind, num_output, extra))


@pytest.mark.parametrize("extra,shape", [
    ("kernel_size: 3 stride: 2", (2, 3, 6, 5)),                    # Caffe's TestGradient
    ("kernel_size: 3 stride: 2 pad: 1 group: 2", (2, 4, 5, 5)),     # TestGradientGroup (with padding)
    ("kernel_size: 3 dilation: 2", (2, 3, 7, 6)),                   # TestDilatedGradient
    ("kernel_size: 1", (2, 3, 4, 3)),                               # the 1x1 path (no im2col)
    ("kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0 bias_term: false", (1, 2, 5, 6)),
    ("kernel_size: 2 stride: 1 pad: 1", (1, 2, 3, 4, 3)),          # TestGradient3D
    ("kernel_size: 2 stride: 2 force_nd_im2col: true", (2, 2, 4, 5)),
    ("kernel_size: 2 axis: 2", (2, 1, 2, 4, 4)),                     # leading axes are batch axes
])
def test_convolution_gradient(extra, shape):
    check_layer(conv_text(extra=extra), [RNG.standard_normal(shape)])


def test_convolution_two_bottoms_share_weights():
    check_layer(conv_text(extra="kernel_size: 2 stride: 1"),
                [RNG.standard_normal((1, 2, 4, 4)), RNG.standard_normal((1, 2, 4, 4))], num_tops=2)


@pytest.mark.parametrize("extra,shape", [
    ("kernel_size: 3 stride: 2", (2, 3, 3, 3)),                     # Caffe's TestGradient (deconv)
    ("kernel_size: 4 stride: 2 pad: 1 group: 2", (1, 4, 3, 2)),
    ("kernel_size: 2 dilation: 2", (1, 2, 3, 3)),
    ("kernel_size: 1 bias_term: false", (2, 3, 2, 3)),
    ("kernel_size: 2 stride: 1 pad: 1", (1, 2, 3, 2, 3)),          # TestGradient3D (deconv)
])
def test_deconvolution_gradient(extra, shape):
    check_layer(conv_text("Deconvolution", extra), [RNG.standard_normal(shape)])


@pytest.mark.parametrize("extra,shape", [
    ("kernel_size: 3 stride: 2", (2, 3, 6, 5)),
    ("kernel_h: 2 kernel_w: 3 pad_h: 1 pad_w: 0 stride_h: 1 stride_w: 2 dilation: 2", (1, 2, 5, 7)),
    ("kernel_size: 2 pad: 1", (1, 2, 3, 4, 3)),
])
def test_im2col_layer_gradient(extra, shape):
    check_layer('type: "Im2col" convolution_param { %s }' % extra, [RNG.standard_normal(shape)])


def direct_convolution(x, w, b, stride, pad, dilation, group):
    """Textbook 2-D convolution (cross-correlation) in float64, one output element at a time."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    xp[:, :, pad:pad + h, pad:pad + wd] = x
    oh = (h + 2 * pad - (dilation * (kh - 1) + 1)) // stride + 1
    ow = (wd + 2 * pad - (dilation * (kw - 1) + 1)) // stride + 1
    out = np.zeros((n, m, oh, ow))
    mg = m // group
    for img, o, i, j in itertools.product(range(n), range(m), range(oh), range(ow)):
        g = o // mg
        patch = xp[img, g * cg:(g + 1) * cg, i * stride:i * stride + dilation * (kh - 1) + 1:dilation,
                   j * stride:j * stride + dilation * (kw - 1) + 1:dilation]
        out[img, o, i, j] = (patch * w[o]).sum() + b[o]
    return out


@pytest.mark.parametrize("chunk_bytes", [conv_backend.COL_CHUNK_BYTES, 1])
def test_forward_equals_direct_convolution_in_every_chunking(monkeypatch, chunk_bytes):
    """Batches are cut into chunks by the column buffer's size: one image per chunk gives the same numbers."""
    monkeypatch.setattr(conv_backend, "COL_CHUNK_BYTES", chunk_bytes)
    x = RNG.standard_normal((3, 4, 7, 6))
    gc = GradientChecker()
    layer, bottom, top = gc.make(layer_param(conv_text(extra="kernel_size: 3 stride: 2 pad: 1 dilation: 2 group: 2",
                                                       num_output=6)), [x])
    layer.forward(bottom, top)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    np.testing.assert_allclose(top[0].data, direct_convolution(x, w, b, 2, 1, 2, 2), rtol=1e-12, atol=1e-12)
    gc.check(layer, bottom, top)


def test_deconvolution_is_the_adjoint_of_convolution():
    """<conv(x), y> == <x, deconv(y)> for shared weights without bias: the two layers are transposes."""
    text = "kernel_size: 3 stride: 2 pad: 1 group: 2 bias_term: false"
    x, y = RNG.standard_normal((2, 4, 7, 7)), RNG.standard_normal((2, 6, 4, 4))
    gc = GradientChecker()
    conv, cb, ct = gc.make(layer_param(conv_text("Convolution", text, num_output=6)), [x])
    deconv, db, dt = gc.make(layer_param(conv_text("Deconvolution", text, num_output=4)), [y])
    deconv.blobs[0].data[...] = conv.blobs[0].data      # (6, 2, 3, 3) both: out 6 <- in 4 / group
    conv.forward(cb, ct)
    deconv.forward(db, dt)
    assert dt[0].shape == x.shape
    np.testing.assert_allclose((ct[0].data * y).sum(), (x * dt[0].data).sum(), rtol=1e-12)


def test_param_diffs_accumulate_and_bottom_diffs_are_overwritten():
    x = RNG.standard_normal((2, 3, 5, 5))
    gc = GradientChecker()
    layer, bottom, top = gc.make(layer_param(conv_text(extra="kernel_size: 3")), [x])
    layer.forward(bottom, top)
    top[0].diff[...] = RNG.standard_normal(top[0].shape)
    layer.backward(top, [True], bottom)
    once_w, once_x = layer.blobs[0].diff.copy(), bottom[0].diff.copy()
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * once_w)
    np.testing.assert_allclose(bottom[0].diff, once_x)


def test_float32_and_float64_give_the_same_numbers():
    x = RNG.standard_normal((2, 3, 6, 6))
    text = conv_text(extra="kernel_size: 3 stride: 2 pad: 1")
    gc = GradientChecker()
    l64, b64, t64 = gc.make(layer_param(text), [x])
    l64.forward(b64, t64)
    from pycaffe_dist.layers import create_layer
    from pycaffe_dist.blob.blob import Blob
    b32, t32 = [Blob(x.shape)], [Blob()]
    b32[0].data[...] = x
    l32 = create_layer(layer_param(text))
    l32.setup(b32, t32)
    for p32, p64 in zip(l32.blobs, l64.blobs):
        p32.data[...] = p64.data
    l32.forward(b32, t32)
    assert t32[0].data.dtype == np.float32
    np.testing.assert_allclose(t32[0].data, t64[0].data, rtol=1e-4, atol=1e-5)


def truncated_convolution(x, w, b, stride, pad, dilation):
    """Caffe's 2-D convolution where the output size truncates towards zero: a window may run past the padded
    input (one output from a kernel wider than it), and im2col reads zeros there."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    ext = [dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1]
    oh, ow = (int((d + 2 * p - e) / s) + 1 for d, p, e, s in zip((h, wd), pad, ext, stride))
    xp = np.zeros((n, c, max(h + 2 * pad[0], (oh - 1) * stride[0] + ext[0]),
                   max(wd + 2 * pad[1], (ow - 1) * stride[1] + ext[1])))
    xp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd] = x
    out = np.zeros((n, m, oh, ow))
    for i, j in itertools.product(range(oh), range(ow)):
        rows = slice(i * stride[0], i * stride[0] + ext[0], dilation[0])
        cols = slice(j * stride[1], j * stride[1] + ext[1], dilation[1])
        patch = xp[:, :, rows, cols]
        out[:, :, i, j] = np.einsum("nckl,mckl->nm", patch, w) + b
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("extra,shape,stride,pad,dilation", [
    ("kernel_size: 3 stride: 2", (2, 3, 2, 2), (2, 2), (0, 0), (1, 1)),       # (2 - 3) / 2 + 1 = 1 in C
    ("kernel_size: 2 stride: 2", (1, 2, 1, 3), (2, 2), (0, 0), (1, 1)),
    ("kernel_h: 4 kernel_w: 1 stride: 3 pad_h: 1 pad_w: 0", (2, 2, 1, 4), (3, 3), (1, 0), (1, 1)),
    ("kernel_size: 2 dilation: 2 stride: 3", (1, 2, 2, 5), (3, 3), (0, 0), (2, 2)),
])
def test_a_window_past_the_padded_input_reads_zeros(extra, shape, stride, pad, dilation, dtype):
    """Caffe's truncating output size lets a kernel wider than the padded input give one output; im2col gives
    0 for its taps outside the image (the 2-D paths read a padded copy that these taps would overrun)."""
    x = RNG.standard_normal(shape)
    layer, bottom, top = GradientChecker.make(layer_param(conv_text(extra=extra)), [x], dtype=dtype)
    layer.forward(bottom, top)
    w, b = (blob.data.astype(np.float64) for blob in layer.blobs)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(top[0].data, truncated_convolution(bottom[0].data.astype(np.float64), w, b, stride,
                                                                  pad, dilation), rtol=tol, atol=tol)
    if dtype == np.float64:
        check_layer(conv_text(extra=extra), [x])


def test_a_bottom_without_spatial_axes_is_a_grouped_inner_product():
    """Caffe accepts an (N, C) bottom: no spatial axis, a 1x1 "kernel", a per-group W x + b."""
    x = RNG.standard_normal((3, 4))
    text = conv_text(extra="group: 2", num_output=6)
    layer, bottom, top = GradientChecker.make(layer_param(text), [x])
    layer.forward(bottom, top)
    w, b = layer.blobs[0].data, layer.blobs[1].data         # (6, 2): out channels over in channels / group
    assert top[0].shape == (3, 6) and w.shape == (6, 2)
    expected = np.concatenate([x[:, :2] @ w[:3].T, x[:, 2:] @ w[3:].T], axis=1) + b
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)
    check_layer(text, [x])
    check_layer(conv_text("Deconvolution", "group: 2", num_output=6), [x])


@pytest.mark.parametrize("kind,extra,shape,top_shape", [
    ("Convolution", "kernel_size: 3 stride: 2", (2, 3, 1, 5), (2, 4, 0, 2)),     # (1 - 3) / 2 + 1 = 0 in C
    ("Deconvolution", "kernel_size: 2 pad: 1", (2, 3, 1, 4), (2, 4, 0, 3)),       # (1 - 1) + 2 - 2 = 0
])
def test_an_empty_output_map_runs_forward_and_backward(kind, extra, shape, top_shape):
    layer, bottom, top = GradientChecker.make(layer_param(conv_text(kind, extra)), [RNG.standard_normal(shape)])
    layer.forward(bottom, top)
    assert top[0].shape == top_shape
    bottom[0].diff[...] = 1
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0)       # empty sums, as Caffe's GEMMs over 0 columns
    np.testing.assert_array_equal(layer.blobs[0].diff, 0)


def test_an_empty_batch_runs_forward_and_backward():
    gc = GradientChecker()
    layer, bottom, top = gc.make(layer_param(conv_text(extra="kernel_size: 3")), [np.zeros((0, 2, 5, 5))])
    layer.forward(bottom, top)
    assert top[0].shape == (0, 4, 3, 3)
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(layer.blobs[0].diff, 0)
