"""Shapes and checks of Pooling and SPP (pycaffe_dist/layers/pool.py)."""
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.layers import create_layer
from pycaffe_dist.layers.pool import pooled_dim, pooled_shape
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.golden_shapes import cases_of, check_case_shapes


@pytest.mark.parametrize("name", cases_of("Pooling", "SPP"))
def test_golden_shapes(name):
    check_case_shapes(name)


def setup(type_, text, bottom_shape, ntop=1):
    lp = parse_text('name: "l" type: "%s" %s' % (type_, text), caffe_pb2.LayerParameter())
    layer = create_layer(lp)
    bottom, top = [Blob(bottom_shape)], [Blob() for _ in range(ntop)]
    layer.setup(bottom, top)
    return layer, bottom, top


def pool(text, bottom_shape, ntop=1):
    return setup("Pooling", "pooling_param { %s }" % text, bottom_shape, ntop)


@pytest.mark.parametrize("text, bottom, out", [
    # CEIL (default): ceil((8 - 3) / 2) + 1 = 4; FLOOR: 3
    ("kernel_size: 3 stride: 2", (2, 3, 8, 8), (2, 3, 4, 4)),
    ("kernel_size: 3 stride: 2 round_mode: FLOOR", (2, 3, 8, 8), (2, 3, 3, 3)),
    # pad clipping: ceil((5 + 2 - 2) / 2) + 1 = 4, but window 4 would start at 6 >= 5 + 1: dropped -> 3
    ("kernel_size: 2 stride: 2 pad: 1", (1, 1, 5, 5), (1, 1, 3, 3)),
    ("kernel_size: 2 stride: 2 pad: 1 round_mode: FLOOR", (1, 1, 5, 5), (1, 1, 3, 3)),
    # no clipping when the last window starts inside: ceil((6 + 2 - 3) / 2) + 1 = 4, 3 * 2 = 6 < 6 + 1
    ("kernel_size: 3 stride: 2 pad: 1", (1, 1, 6, 6), (1, 1, 4, 4)),
    # AlexNet / CaffeNet pool1: 55 -> 27
    ("kernel_size: 3 stride: 2", (1, 96, 55, 55), (1, 96, 27, 27)),
    # GoogLeNet pool1/3x3_s2: 112 -> 56 (ceil)
    ("kernel_size: 3 stride: 2", (1, 64, 112, 112), (1, 64, 56, 56)),
    ("kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0", (1, 1, 7, 6), (1, 1, 4, 5)),
    ("global_pooling: true", (2, 3, 5, 7), (2, 3, 1, 1)),
    ("pool: AVE global_pooling: true", (2, 3, 1, 9), (2, 3, 1, 1)),
    ("pool: STOCHASTIC kernel_size: 3 stride: 2", (2, 3, 7, 7), (2, 3, 3, 3)),  # accepted at setup, as Caffe
])
def test_pool_output_shape(text, bottom, out):
    _, _, top = pool(text, bottom)
    assert top[0].shape == out


def test_pooled_dim_rule():
    assert pooled_dim(5, 2, 2, 1) == 3 and pooled_dim(5, 2, 2, 0) == 3 and pooled_dim(5, 2, 2, 0, False) == 2
    assert pooled_dim(7, 3, 3, 2) == 3      # ceil(8 / 3) + 1 = 4, (4 - 1) * 3 = 9 >= 7 + 2: clipped
    # `if (pad_h_ || pad_w_)`: padding on either axis clips both (ceil(7 / 2) + 1 = 5 rows, the last at 8 >= 8)
    assert pooled_shape((8, 8), (1, 2), (2, 2), (0, 1)) == (4, 5)
    assert pooled_shape((4, 4), (3, 2), (4, 3), (0, 1)) == (1, 2)
    assert pooled_shape((8, 8), (1, 2), (2, 2), (0, 0)) == (5, 4)   # no padding: no clipping


def test_max_mask_top_and_top_counts():
    _, _, top = pool("kernel_size: 2 stride: 2", (2, 3, 6, 6), ntop=2)
    assert [t.shape for t in top] == [(2, 3, 3, 3)] * 2
    with pytest.raises(NetError, match="takes at most 1 top"):
        pool("pool: AVE kernel_size: 2", (2, 3, 6, 6), ntop=2)
    with pytest.raises(NetError, match="takes at most 2 top"):
        pool("kernel_size: 2", (2, 3, 6, 6), ntop=3)


def test_global_pooling_follows_reshape():
    layer, bottom, top = pool("global_pooling: true", (2, 3, 5, 7))
    bottom[0].reshape((4, 3, 9, 2))
    layer.reshape(bottom, top)
    assert top[0].shape == (4, 3, 1, 1) and layer.kernel == (9, 2)


@pytest.mark.parametrize("text, bottom, message", [
    ("stride: 2", (1, 1, 5, 5), "kernel_size must be specified"),
    ("kernel_h: 2", (1, 1, 5, 5), "For non-square filters both kernel_h and kernel_w are required"),
    ("kernel_size: 2 kernel_h: 2 kernel_w: 2", (1, 1, 5, 5), "Filter size is kernel_size OR kernel_h and kernel_w"),
    ("kernel_size: 0", (1, 1, 5, 5), "Filter dimensions cannot be zero"),
    ("global_pooling: true kernel_size: 2", (1, 1, 5, 5), "With Global_pooling: true Filter size cannot specified"),
    ("global_pooling: true stride: 2", (1, 1, 5, 5), "only pad = 0 and stride = 1"),
    ("global_pooling: true pad: 1", (1, 1, 5, 5), "only pad = 0 and stride = 1"),
    ("kernel_size: 2 pad: 1 pad_h: 1 pad_w: 1", (1, 1, 5, 5), "pad is pad OR pad_h and pad_w are required"),
    ("kernel_size: 2 pad_h: 1", (1, 1, 5, 5), "pad is pad OR pad_h and pad_w are required"),
    ("kernel_size: 2 stride_w: 1", (1, 1, 5, 5), "Stride is stride OR stride_h and stride_w are required"),
    ("kernel_size: 2 pad: 2", (1, 1, 5, 5), "must be smaller than the kernel"),
    ("pool: STOCHASTIC kernel_size: 3 pad: 1", (1, 1, 5, 5), "Padding implemented only for average and max"),
    ("kernel_size: 2", (1, 5, 5), "Input must have 4 axes"),
    ("kernel_size: 2", (1, 1, 1, 5, 5), "Input must have 4 axes"),
])
def test_pool_errors(text, bottom, message):
    with pytest.raises(NetError, match=message):
        pool(text, bottom)


def test_pool_flops():
    layer, bottom, top = pool("kernel_size: 3 stride: 2", (2, 3, 8, 8))
    assert layer.flops(bottom, top) == 2 * 3 * 16 * 9
    layer, bottom, top = pool("pool: AVE kernel_size: 3 stride: 2", (2, 3, 8, 8))
    assert layer.flops(bottom, top) == 2 * 3 * 16 * 10


def spp(text, bottom):
    return setup("SPP", "spp_param { %s }" % text, bottom)


@pytest.mark.parametrize("text, bottom, out", [
    ("pyramid_height: 1", (2, 3, 7, 9), (2, 3, 1, 1)),           # a single Pooling straight into the top
    ("pyramid_height: 2 pool: AVE", (2, 3, 7, 9), (2, 3 * (1 + 4))),
    ("pyramid_height: 3", (2, 3, 7, 9), (2, 3 * (1 + 4 + 16))),
    ("pyramid_height: 4", (1, 2, 16, 16), (1, 2 * (1 + 4 + 16 + 64))),
])
def test_spp_shape(text, bottom, out):
    _, _, top = spp(text, bottom)
    assert top[0].shape == out


def test_spp_follows_reshape():
    layer, bottom, top = spp("pyramid_height: 2", (2, 3, 7, 9))
    bottom[0].reshape((5, 4, 8, 8))
    layer.reshape(bottom, top)
    assert top[0].shape == (5, 4 * 5)


@pytest.mark.parametrize("text, bottom, message", [
    ("pyramid_height: 0", (1, 1, 5, 5), "pyramid_height must be at least 1"),
    # 5 rows into 4 bins: kernel 2, pad (8 - 5 + 1) / 2 = 2, not smaller than the kernel (Caffe's Pooling CHECK)
    ("pyramid_height: 3", (1, 1, 5, 5), "must be smaller than the kernel"),
    ("pyramid_height: 2 pool: STOCHASTIC", (1, 1, 5, 5), "Padding implemented only for average and max"),
    ("pyramid_height: 2", (1, 5, 5), "Input must have 4 axes"),
])
def test_spp_errors(text, bottom, message):
    with pytest.raises(NetError, match=message):
        spp(text, bottom)
