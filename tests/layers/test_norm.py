"""Forward and backward of LRN, MVN and BatchNorm (pycaffe_dist/layers/norm.py, csrc/lrn.pyx).

Gradient settings after Caffe's test_lrn_layer.cpp, test_mvn_layer.cpp and test_batch_norm_layer.cpp, on smaller
blobs. MVN and BatchNorm TRAIN outputs have a constant sum of squares per group, so the half-sum-of-squares
objective would see a zero gradient: they are checked exhaustively (one objective per top element).
"""
import numpy as np
import pytest

from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.gradient_checker import GradientChecker, check_layer, layer_param


def gaussian(shape, seed=1701, scale=1.0, shift=0.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale + shift


def run(text, x, phase=caffe_pb2.TRAIN, in_place=False, top_diff=None):
    """Set up the layer on blobs of x's dtype, forward, and backward when top_diff is given."""
    bottom = [Blob(x.shape, dtype=x.dtype)]
    bottom[0].data[...] = x
    top = bottom if in_place else [Blob(dtype=x.dtype)]
    layer = create_layer(layer_param(text), phase)
    layer.setup(bottom, top)
    for blob in layer.blobs:
        blob.astype(x.dtype)
    layer.forward(bottom, top)
    if top_diff is not None:
        top[0].diff[...] = top_diff
        layer.backward(top, [True], bottom)
    return layer, bottom, top


# --- LRN ------------------------------------------------------------------------------------------------

def f32(value):
    """A parameter as the float32 field of caffe.proto holds it."""
    return float(np.float32(value))


def lrn_reference(x, size, alpha, beta, k, across):
    """Caffe's ReferenceLRNForward (test_lrn_layer.cpp), with k for ACROSS_CHANNELS (WITHIN_CHANNEL uses 1)."""
    n, c, h, w = x.shape
    alpha, beta, k = f32(alpha), f32(beta), f32(k)
    pad = (size - 1) // 2
    sq = np.pad(x.astype(np.float64) ** 2, [(0, 0), (pad, pad), (0, 0), (0, 0)] if across else
                [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    if across:
        scale = k + alpha / size * sum(sq[:, i:i + c] for i in range(size))
    else:
        scale = 1 + alpha / size ** 2 * sum(sq[:, :, i:i + h, j:j + w] for i in range(size) for j in range(size))
    return x / scale ** beta


LRN_SETTINGS = [
    # (local_size, alpha, beta, k, region): Caffe's defaults and large region, AlexNet's, and others
    (5, 1.0, 0.75, 1.0, "ACROSS_CHANNELS"),
    (15, 1.0, 0.75, 1.0, "ACROSS_CHANNELS"),
    (5, 1e-4, 0.75, 1.0, "ACROSS_CHANNELS"),
    (3, 0.5, 0.5, 2.0, "ACROSS_CHANNELS"),
    (1, 2.0, 1.5, 1.0, "ACROSS_CHANNELS"),
    (3, 1.0, 0.75, 1.0, "WITHIN_CHANNEL"),
    (5, 2.0, 1.5, 3.0, "WITHIN_CHANNEL"),
    (1, 0.5, 0.25, 1.0, "WITHIN_CHANNEL"),
]


def lrn_text(size, alpha, beta, k, region):
    return ('type: "LRN" lrn_param { local_size: %d alpha: %g beta: %g k: %g norm_region: %s }'
            % (size, alpha, beta, k, region))


@pytest.mark.parametrize("setting", LRN_SETTINGS)
def test_lrn_forward_matches_reference(setting):
    size, alpha, beta, k, region = setting
    x = gaussian((2, 7, 3, 4), scale=30.0 if alpha < 1e-3 else 1.0)
    want = lrn_reference(x, size, alpha, beta, k, region == "ACROSS_CHANNELS")
    _, _, top = run(lrn_text(*setting), x)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-12, atol=1e-12)
    _, _, top = run(lrn_text(*setting), x.astype(np.float32))
    assert top[0].data.dtype == np.float32
    # Caffe's running window sum (add the head, subtract the tail) loses a few float32 ulps
    np.testing.assert_allclose(top[0].data, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn_large_blob_uses_threads_and_matches(region):
    # Big enough for the kernels' parallel path (more than their 32768-element grain).
    x = gaussian((4, 8, 32, 40))
    text = lrn_text(5, 0.7, 0.75, 1.5, region)
    dy = gaussian(x.shape, seed=7)
    _, bottom, top = run(text, x, top_diff=dy)
    np.testing.assert_allclose(top[0].data, lrn_reference(x, 5, 0.7, 0.75, 1.5, region == "ACROSS_CHANNELS"),
                               rtol=1e-12, atol=1e-12)
    _, bottom32, top32 = run(text, x.astype(np.float32), top_diff=dy.astype(np.float32))
    np.testing.assert_allclose(top32[0].data, top[0].data, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bottom32[0].diff, bottom[0].diff, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("setting", LRN_SETTINGS)
def test_lrn_gradient(setting):
    x = gaussian((2, 7, 3, 3), scale=30.0 if setting[1] < 1e-3 else 1.0)
    check_layer(lrn_text(*setting), [x])


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn_gradient_exhaustive(region):
    # Caffe's TestGradientAcrossChannels / TestGradientWithinChannel (threshold 1e-2 there), on a smaller blob.
    size = 5 if region == "ACROSS_CHANNELS" else 3
    check_layer(lrn_text(size, 1.0, 0.75, 1.0, region), [gaussian((1, 6, 2, 3))], mode="exhaustive")


# --- MVN ------------------------------------------------------------------------------------------------

MVN_MODES = ["", "mvn_param { normalize_variance: false }", "mvn_param { across_channels: true }"]


@pytest.mark.parametrize("params", MVN_MODES)
def test_mvn_gradient(params):
    check_layer('type: "MVN" %s' % params, [gaussian((2, 3, 2, 2), scale=2.0, shift=1.0)], mode="exhaustive")


def test_mvn_adds_eps_to_the_std():
    # A large eps shows where it goes: Caffe divides by sqrt(var) + eps, not sqrt(var + eps).
    x = gaussian((2, 3, 4, 5), scale=2.0, shift=1.0)
    _, _, top = run('type: "MVN" mvn_param { eps: 0.5 }', x)
    g = x.reshape(6, -1)
    want = (g - g.mean(1, keepdims=True)) / (g.std(1, keepdims=True) + 0.5)   # 0.5 is exact in float32
    np.testing.assert_allclose(top[0].data.reshape(6, -1), want, rtol=1e-12)


def test_mvn_two_axis_bottom_across_channels():
    # A (N, C) bottom gives a (N, C, 1, 1) top, each image normalized over its C values.
    x = gaussian((4, 6), shift=3.0)
    dy = gaussian((4, 6, 1, 1), seed=3)
    _, bottom, top = run('type: "MVN" mvn_param { across_channels: true }', x, top_diff=dy)
    want = (x - x.mean(1, keepdims=True)) / (x.std(1, keepdims=True) + f32(1e-9))
    np.testing.assert_allclose(top[0].data.reshape(4, 6), want, rtol=1e-12)
    assert top[0].shape == (4, 6, 1, 1) and bottom[0].diff.shape == (4, 6)
    # per channel, each group has one value: the output is 0 and so is the gradient
    _, bottom, top = run('type: "MVN"', x, top_diff=dy)
    assert not top[0].data.any() and not bottom[0].diff.any()


# --- BatchNorm ------------------------------------------------------------------------------------------

def with_stats(text_params="", mean=(0.5, -1.0), variance=(2.0, 0.25), factor=2.5):
    """A BatchNorm LayerParameter holding stored statistics (sums scaled by `factor`, as Caffe keeps them)."""
    lp = layer_param('type: "BatchNorm" %s' % text_params)
    for values in (np.multiply(mean, factor), np.multiply(variance, factor), [factor]):
        blob = Blob((len(values),))
        blob.data[...] = values
        blob.to_proto(proto=lp.blobs.add())
    return lp


@pytest.mark.parametrize("shape", [(3, 2, 2, 2), (6, 3)])
def test_batchnorm_train_gradient(shape):
    # Caffe's TestGradient: checker(1e-2, 1e-4), exhaustive; the statistics blobs get (and need) no gradient.
    check_layer('type: "BatchNorm"', [gaussian(shape, scale=1.5, shift=0.3)], mode="exhaustive", threshold=1e-4)


def test_batchnorm_global_stats_gradient():
    gc = GradientChecker(threshold=1e-4)
    layer, bottom, top = gc.make(with_stats("batch_norm_param { use_global_stats: true }"),
                                 [gaussian((3, 2, 2, 3))])
    # The output depends on the statistics, but they are not learned: check the bottom only.
    gc.check_single(layer, bottom, top, check_bottom=0, check_params=False)


def test_batchnorm_train_forward_and_moving_averages():
    x = gaussian((4, 3, 2, 5), scale=1.5, shift=0.3)
    layer, _, top = run('type: "BatchNorm" batch_norm_param { moving_average_fraction: 0.9 eps: 0.01 }', x)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    want = (x - mean[:, None, None]) / np.sqrt(var + f32(0.01))[:, None, None]
    np.testing.assert_allclose(top[0].data, want, rtol=1e-12, atol=1e-12)
    m = x.size / 3
    np.testing.assert_allclose(layer.blobs[0].data, mean)
    np.testing.assert_allclose(layer.blobs[1].data, var * m / (m - 1))
    assert layer.blobs[2].data[0] == 1
    x2 = gaussian(x.shape, seed=5)
    bottom2 = [Blob(x2.shape, dtype=np.float64)]
    bottom2[0].data[...] = x2
    layer.forward(bottom2, top)
    maf = f32(0.9)
    np.testing.assert_allclose(layer.blobs[0].data, maf * mean + x2.mean(axis=(0, 2, 3)))
    np.testing.assert_allclose(layer.blobs[1].data, (maf * var + x2.var(axis=(0, 2, 3))) * m / (m - 1))
    np.testing.assert_allclose(layer.blobs[2].data, [maf + 1])


@pytest.mark.parametrize("phase, params", [(caffe_pb2.TEST, ""),
                                           (caffe_pb2.TRAIN, "batch_norm_param { use_global_stats: true }")])
def test_batchnorm_uses_stored_statistics(phase, params):
    x = gaussian((2, 2, 3))
    bottom, top = [Blob(x.shape, dtype=np.float64)], [Blob(dtype=np.float64)]
    bottom[0].data[...] = x
    layer = create_layer(with_stats(params), phase)
    layer.setup(bottom, top)
    for blob in layer.blobs:
        blob.astype(np.float64)
    stored = [b.data.copy() for b in layer.blobs]
    layer.forward(bottom, top)
    std = np.sqrt(np.array([2.0, 0.25]) + f32(1e-5))[:, None]
    np.testing.assert_allclose(top[0].data, (x - np.array([0.5, -1.0])[:, None]) / std, rtol=1e-12)
    assert all((b.data == s).all() for b, s in zip(layer.blobs, stored))   # statistics left alone
    top[0].diff[...] = 1
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, np.broadcast_to(1 / std, x.shape), rtol=1e-12)


def test_batchnorm_zero_factor_gives_zero_statistics():
    x = gaussian((2, 3, 4))
    _, _, top = run('type: "BatchNorm" batch_norm_param { use_global_stats: true eps: 0.04 }', x)
    np.testing.assert_allclose(top[0].data, x / np.sqrt(f32(0.04)), rtol=1e-12)


@pytest.mark.parametrize("params", ["", "batch_norm_param { use_global_stats: true }"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batchnorm_in_place_matches_out_of_place(params, dtype):
    x = gaussian((3, 4, 2, 3), scale=1.5, shift=0.3).astype(dtype)
    dy = gaussian(x.shape, seed=11).astype(dtype)
    text = 'type: "BatchNorm" ' + params
    layer, bottom, top = run(text, x, top_diff=dy)
    layer_ip, blob_ip, _ = run(text, x, in_place=True, top_diff=dy)
    assert blob_ip[0].data.dtype == dtype
    np.testing.assert_array_equal(blob_ip[0].data, top[0].data)
    np.testing.assert_array_equal(blob_ip[0].diff, bottom[0].diff)
    for a, b in zip(layer_ip.blobs, layer.blobs):
        np.testing.assert_array_equal(a.data, b.data)


# --- shared ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [lrn_text(5, 1.0, 0.75, 1.0, "ACROSS_CHANNELS"),
                                  lrn_text(3, 1.0, 0.75, 1.0, "WITHIN_CHANNEL"),
                                  'type: "MVN"', 'type: "BatchNorm"'])
def test_backward_respects_propagate_down(text):
    x = gaussian((2, 3, 2, 2))
    layer, bottom, top = run(text, x)
    bottom[0].diff[...] = 7
    top[0].diff[...] = 1
    layer.backward(top, [False], bottom)
    assert (bottom[0].diff == 7).all()
    layer.backward(top, [True], bottom)
    assert not (bottom[0].diff == 7).any()
