"""Convolution, Deconvolution, Im2col, InnerProduct and Embed on the GPU code path against their CPU code.

Each case builds the layer twice from the same prototxt and seed (float32), runs the CPU forward/backward on one
and forward_gpu/backward_gpu on the other with the same inputs, top diffs and starting parameter diffs (Caffe
adds to parameter diffs), and compares every output. Bottom diffs start as garbage: they must be overwritten.
"""
import tempfile

import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.errors import NetError
from pycaffe_dist.layers import conv as conv_layers
from pycaffe_dist.blob import synced_memory
from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.pycaffe import Net
from tests.layers.gradient_checker import GradientChecker, layer_param

RNG = np.random.default_rng(23)
# GEMM results: float32 sums of up to a few hundred products, taken in another order by cuBLAS (or numpy's matmul
# on the emulated device) than by the CPU kernel's BLAS calls.
GEMM_TOL = dict(rtol=1e-4, atol=1e-5)


def assert_same(got, want, what, exact=False, tol=GEMM_TOL):
    assert got.shape == want.shape, "%s: shape %s, CPU %s" % (what, got.shape, want.shape)
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, err_msg=what, **tol)


def run_on_both(text, bottoms, phase=caffe_pb2.TRAIN, num_tops=1, propagate_down=None, param_down=None, seed=5,
                exact=False, tol=GEMM_TOL):
    """Run the layer of `text` on the CPU and on the GPU path; compare tops, bottom diffs and param diffs.
    Returns the GPU layer, its bottoms and tops."""
    param = layer_param(text)
    runs = []
    for _ in range(2):
        layer, bottom, top = GradientChecker.make(param, bottoms, phase, num_tops, seed, dtype=np.float32)
        if runs:
            for mine, cpu in zip(layer.blobs, runs[0][0].blobs):
                mine.data[...] = cpu.data
        if param_down is not None:
            layer.param_propagate_down = list(param_down)
        runs.append((layer, bottom, top))
    draws = {}
    for gpu, (layer, bottom, top) in zip((False, True), runs):
        common.set_random_seed(seed)    # layers that draw (stochastic pooling) draw the same numbers
        layer.reshape(bottom, top)
        (layer.forward_gpu if gpu else layer.forward)(bottom, top)
        if gpu:
            assert top[0].data_memory.head == synced_memory.DEVICE, "the GPU forward did not run on the device"
    (cpu_layer, cpu_bottom, cpu_top), (gpu_layer, gpu_bottom, gpu_top) = runs
    for i, (c, g) in enumerate(zip(cpu_top, gpu_top)):
        assert_same(g.data, c.data, "top %d" % i, exact, tol)
    down = [True] * len(bottoms) if propagate_down is None else list(propagate_down)
    for i, t in enumerate(cpu_top):
        draws["top%d" % i] = RNG.standard_normal(t.shape).astype(np.float32)
    for i, p in enumerate(cpu_layer.blobs):
        draws["param%d" % i] = RNG.standard_normal(p.shape).astype(np.float32)
    for gpu, (layer, bottom, top) in zip((False, True), runs):
        for i, t in enumerate(top):
            t.diff[...] = draws["top%d" % i]
        for i, p in enumerate(layer.blobs):
            p.diff[...] = draws["param%d" % i]
        for b in bottom:
            b.diff[...] = 7.0
        (layer.backward_gpu if gpu else layer.backward)(top, down, bottom)
    for i, (c, g) in enumerate(zip(cpu_bottom, gpu_bottom)):
        if down[i]:
            assert g.diff_memory.head == synced_memory.DEVICE, "the GPU backward did not run on the device"
        assert_same(g.diff, c.diff, "bottom %d diff" % i, exact, tol)
    for i, (c, g) in enumerate(zip(cpu_layer.blobs, gpu_layer.blobs)):
        assert_same(g.diff, c.diff, "param %d diff" % i, exact, tol)
    return runs[1]


def conv_text(kind="Convolution", extra="", num_output=4):
    return ('type: "%s" convolution_param { num_output: %d %s weight_filler { type: "gaussian" std: 0.5 } '
            'bias_filler { type: "gaussian" std: 0.5 } }' % (kind, num_output, extra))


def data(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


CONV_CASES = [
    ("kernel_size: 3 stride: 2", (2, 3, 6, 5)),
    ("kernel_size: 3 stride: 2 pad: 1 group: 2", (2, 4, 5, 5)),
    ("kernel_size: 3 dilation: 2", (2, 3, 7, 6)),
    ("kernel_size: 3 dilation: 0", (2, 3, 5, 4)),                    # Caffe takes it: every tap reads one pixel
    ("kernel_size: 1", (3, 3, 4, 3)),                                # 1x1: no column buffer
    ("kernel_size: 1 stride: 2", (2, 3, 5, 4)),                      # kernel 1, but not Caffe's is_1x1
    ("kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0 bias_term: false", (1, 2, 5, 6)),
    ("kernel_size: 2 stride: 1 pad: 1", (2, 2, 3, 4, 3)),            # 3-D: the N-d kernels
    ("kernel_size: 3 stride: 2 pad: 1 dilation: 2 group: 2", (1, 2, 3, 9, 6, 7)),   # 4-D
    ("kernel_size: 2 stride: 2 force_nd_im2col: true", (2, 2, 4, 5)),
    ("kernel_size: 3 stride: 2 pad: 1 dilation: 2 group: 2 force_nd_im2col: true", (2, 4, 9, 8)),
    ("kernel_size: 2 axis: 2", (2, 1, 2, 4, 4)),                     # leading axes are batch axes
    ("kernel_size: 3 group: 4", (2, 4, 6, 6)),                       # depthwise
]


@pytest.mark.parametrize("extra,shape", CONV_CASES)
def test_convolution(gpu, extra, shape):
    num_output = 8 if "group: 4" in extra else 4
    run_on_both(conv_text(extra=extra, num_output=num_output), [data(*shape)])


DECONV_CASES = [
    ("kernel_size: 3 stride: 2", (2, 3, 3, 3)),
    ("kernel_size: 4 stride: 2 pad: 1 group: 2", (2, 4, 3, 2)),
    ("kernel_size: 2 dilation: 2", (1, 2, 3, 3)),
    ("kernel_size: 1 bias_term: false", (2, 3, 2, 3)),
    ("kernel_size: 2 stride: 1 pad: 1", (1, 2, 3, 2, 3)),
    ("kernel_size: 3 stride: 2 force_nd_im2col: true", (2, 2, 3, 4)),
]


@pytest.mark.parametrize("extra,shape", DECONV_CASES)
def test_deconvolution(gpu, extra, shape):
    run_on_both(conv_text("Deconvolution", extra), [data(*shape)])


def test_two_bottoms_share_the_weights(gpu):
    run_on_both(conv_text(extra="kernel_size: 2 stride: 1 pad: 1"), [data(2, 2, 4, 4), data(2, 2, 4, 4)],
                num_tops=2)


@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("propagate_down,param_down", [([False], [True, True]), ([True], [False, True]),
                                                       ([True], [True, False]), ([False], [False, False])])
def test_propagate_down_choices(gpu, kind, propagate_down, param_down):
    run_on_both(conv_text(kind, "kernel_size: 3 stride: 2 pad: 1 group: 2"), [data(2, 4, 5, 5)],
                propagate_down=propagate_down, param_down=param_down)


@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("extra,buffer_bytes", [
    ("kernel_size: 3 pad: 1 group: 3", 1),               # chunks of one image; dW by GEMMs with beta = 1
    ("kernel_size: 3 pad: 1 group: 3", 6480),            # chunks of two: more groups than images
    ("kernel_size: 3 pad: 1", 6480),                     # dW through the scratch, then a last chunk of one
    ("kernel_size: 3 pad: 1 group: 3", 1 << 20),         # one chunk
    ("kernel_size: 1 group: 3", 48),                     # 1x1: one chunk; dW scratch of two images, then one
])
def test_chunked_batches(gpu, monkeypatch, kind, extra, buffer_bytes):
    """However the batch is cut (column buffer and weight-diff scratch bounded by GPU_BUFFER_BYTES), and
    whichever way the groups are batched: the same numbers."""
    monkeypatch.setattr(conv_layers, "GPU_BUFFER_BYTES", buffer_bytes)
    layer, _, _ = run_on_both(conv_text(kind, extra, num_output=6),
                              [data(5, 3, 5, 6) if kind == "Convolution" else data(5, 6, 5, 6)])
    engine = layer.gpu_engine()
    assert engine.chunk_limit == max(1, buffer_bytes // (4 * engine.unroll.col_count))
    assert engine.dw_chunk_limit == max(1, buffer_bytes // (4 * engine.weight_count))


def test_a_kernel_larger_than_the_image(gpu):
    """No output position: an empty top, a zero bottom diff, unchanged parameter diffs (the CPU kernel refuses
    this backward, so the GPU is checked alone)."""
    layer, bottom, top = GradientChecker.make(layer_param(conv_text(extra="kernel_size: 5")), [data(2, 3, 4, 4)],
                                              dtype=np.float32)
    layer.forward_gpu(bottom, top)
    assert top[0].shape == (2, 4, 0, 0)
    start = [p.data.copy() for p in layer.blobs]
    for p, s in zip(layer.blobs, start):
        p.diff[...] = s
    bottom[0].diff[...] = 7
    layer.backward_gpu(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0)
    for p, s in zip(layer.blobs, start):
        np.testing.assert_array_equal(p.diff, s)


def test_an_empty_batch(gpu):
    layer, bottom, top = run_on_both(conv_text(extra="kernel_size: 3"), [np.zeros((0, 2, 5, 5), np.float32)])
    assert top[0].shape == (0, 4, 3, 3)


@pytest.mark.parametrize("kind,extra,shape,top_shape", [
    ("Convolution", "kernel_size: 5 group: 2", (2, 4, 4, 4), (2, 4, 0, 0)),
    ("Convolution", "kernel_size: 5 bias_term: false", (2, 3, 4, 4), (2, 4, 0, 0)),
    ("Deconvolution", "kernel_size: 2 pad: 1", (2, 3, 1, 1), (2, 4, 0, 0)),
    ("Deconvolution", "kernel_size: 3", (2, 3, 0, 3), (2, 4, 2, 5)),
    ("Deconvolution", "kernel_size: 3", (0, 3, 3, 3), (0, 4, 5, 5)),
])
def test_empty_products(gpu, kind, extra, shape, top_shape):
    """Shapes whose GEMMs have an empty side or sum over nothing (k = 0: C = beta C), which cuBLAS refuses with
    Caffe's leading dimensions (backend/blas_ops.py handles them)."""
    layer, bottom, top = run_on_both(conv_text(kind, extra), [data(*shape)])
    assert top[0].shape == top_shape


@pytest.mark.parametrize("extra,shape", [
    ("kernel_size: 3 stride: 2", (2, 3, 6, 5)),
    ("kernel_h: 2 kernel_w: 3 pad_h: 1 pad_w: 0 stride_h: 1 stride_w: 2 dilation: 2", (1, 2, 5, 7)),
    ("kernel_size: 3 pad: 2 stride: 1 dilation: 0", (2, 2, 4, 4)),
    ("kernel_size: 2 pad: 1", (1, 2, 3, 4, 3)),
    ("kernel_size: 3 pad: 1 stride: 2 force_nd_im2col: true", (2, 3, 5, 6)),
    ("kernel_size: 2 axis: 2", (2, 2, 3, 5, 4)),
])
def test_im2col_layer(gpu, extra, shape):
    """Copies and sums taken in the CPU's order: the same bits."""
    run_on_both('type: "Im2col" convolution_param { %s }' % extra, [data(*shape)], exact=True)


IP_FILLERS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'


@pytest.mark.parametrize("extra,shape", [
    ("", (3, 2, 3, 2)),
    ("axis: 2", (2, 3, 4, 2)),
    ("bias_term: false", (4, 5)),
    ("transpose: true", (3, 2, 2, 2)),
    ("", (1, 6)),                       # one row: a GEMV
    ("transpose: true", (1, 6)),
    ("transpose: true bias_term: false axis: 0", (2, 3)),
    ("", (0, 3)),                       # an empty batch: the weight gradient sums over no rows (k = 0)
    ("transpose: true", (0, 2, 2)),
])
def test_inner_product(gpu, extra, shape):
    run_on_both('type: "InnerProduct" inner_product_param { num_output: 5 %s %s }' % (extra, IP_FILLERS),
                [data(*shape)])


def test_embed(gpu):
    idx = np.array([[0, 3, 2], [3, 3, 1]], np.float32)     # repeated indices add up
    run_on_both('type: "Embed" embed_param { num_output: 3 input_dim: 5 %s }' % IP_FILLERS, [idx],
                propagate_down=[False])
    run_on_both('type: "Embed" embed_param { num_output: 2 input_dim: 4 bias_term: false %s }' % IP_FILLERS,
                [np.array([1, 1, 0, 1], np.float32)], propagate_down=[False])


def test_embed_refuses_a_bad_index_on_the_gpu_too(gpu):
    layer, bottom, top = GradientChecker.make(layer_param('type: "Embed" embed_param { num_output: 2 input_dim: 4 }'),
                                              [np.array([1, 4], np.float32)], dtype=np.float32)
    with pytest.raises(NetError, match="input 1 is 4.0"):
        layer.forward_gpu(bottom, top)


def test_a_net_trains_its_convolutions_on_the_device(gpu):
    """Conv -> Pooling -> InnerProduct through a Net in GPU mode: no host copy of the activations is taken."""
    text = '''
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
    layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
            convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
    layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
            pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
    layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
            inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
    force_backward: true
    '''
    with tempfile.NamedTemporaryFile("w", suffix=".prototxt") as f:
        f.write(text)
        f.flush()
        common.set_random_seed(3)
        net = Net(f.name, phase=caffe_pb2.TRAIN)
    x = data(2, 3, 8, 8)
    net.blobs["data"].data[...] = x
    net.forward()
    for name in ("conv", "pool"):         # (forward() hands the output "ip" back on the host)
        assert net.blobs[name].data_memory.head == synced_memory.DEVICE, name
    net.blobs["ip"].diff[...] = 1
    net.backward()
    assert net.blobs["conv"].diff_memory.head == synced_memory.DEVICE
    got_ip, got_dx = net.blobs["ip"].data.copy(), net.blobs["data"].diff.copy()
    got_dw = net.params["conv"][0].diff.copy()
    common.set_mode_cpu()
    net.clear_param_diffs()
    net.blobs["data"].data[...] = x
    net.forward()
    net.blobs["ip"].diff[...] = 1
    net.backward()
    assert_same(got_ip, net.blobs["ip"].data, "ip")
    assert_same(got_dx, net.blobs["data"].diff, "data diff")
    assert_same(got_dw, net.params["conv"][0].diff, "conv weight diff")
