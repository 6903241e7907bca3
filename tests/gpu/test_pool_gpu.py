"""Pooling and SPP on the GPU code path against their CPU code (csrc/pooling.pyx, Caffe's rules).

Our GPU kernels take every window's inputs, and every input diff its terms, in the CPU kernels' order, so the
results are the same bits; only STOCHASTIC's TEST backward differs in the last bits (the CPU kernel computes one
term in double, and on a real GPU nvcc contracts a * b + c into one FMA, as it does for Caffe's kernels). On a real
GPU with cuDNN, AVE pooling runs cuDNN's (engine DEFAULT, as Caffe's factory chooses), which sums and divides in
its own order: within CUDNN_AVE_TOL, not the same bits (seen: 1.2e-7 absolute, 6.4e-7 relative on an H200 with
cuDNN 9.19).
"""
import numpy as np
import pytest

from pycaffe_dist.backend import cudnn
from pycaffe_dist.errors import DeviceError
from pycaffe_dist.layers import cudnn_engine
from pycaffe_dist.proto import caffe_pb2
from tests.gpu.test_conv_gpu import run_on_both

CUDNN_AVE_TOL = dict(rtol=2e-6, atol=2e-7)


def exactness(dev, extra):
    """How closely the GPU path must match the CPU's for the pooling of `extra` on `dev`."""
    if "AVE" in extra and cudnn_engine.is_cuda_device(dev):
        try:
            cudnn.load()
            return dict(exact=False, tol=CUDNN_AVE_TOL)
        except DeviceError:
            pass
    return dict(exact=True)

RNG = np.random.default_rng(31)
TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def pool_text(extra):
    return 'type: "Pooling" pooling_param { %s }' % extra


def data(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def positive(*shape):
    return RNG.uniform(0.05, 1.0, shape).astype(np.float32)


CASES = [
    ("pool: MAX kernel_size: 3 stride: 2", (2, 3, 7, 6)),               # ceil: the last windows are clipped
    ("pool: MAX kernel_size: 2 stride: 2", (2, 2, 6, 6)),
    ("pool: MAX kernel_size: 3 stride: 2 pad: 1", (2, 3, 6, 7)),
    ("pool: MAX kernel_size: 3 stride: 2 pad: 2", (1, 2, 4, 5)),        # pad clipping of the last window
    ("pool: MAX kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 1", (2, 2, 5, 6)),
    ("pool: MAX kernel_size: 3 stride: 1 round_mode: FLOOR", (1, 2, 5, 5)),
    ("pool: MAX kernel_size: 3 stride: 2 round_mode: FLOOR", (1, 2, 6, 6)),
    ("pool: MAX kernel_size: 1 stride: 3", (1, 2, 5, 5)),               # ceil: empty last windows
    ("pool: MAX global_pooling: true", (2, 3, 4, 5)),
    ("pool: AVE kernel_size: 3 stride: 2", (2, 3, 7, 6)),
    ("pool: AVE kernel_size: 3 stride: 2 pad: 1", (2, 3, 6, 7)),
    ("pool: AVE kernel_size: 3 stride: 2 pad: 2", (1, 2, 4, 5)),
    ("pool: AVE kernel_h: 2 kernel_w: 4 stride_h: 1 stride_w: 3 pad_h: 1 pad_w: 2", (2, 2, 5, 7)),
    ("pool: AVE kernel_size: 2 stride: 2 round_mode: FLOOR", (1, 2, 5, 5)),
    ("pool: AVE kernel_size: 1 stride: 3", (1, 2, 5, 5)),
    ("pool: AVE global_pooling: true", (2, 3, 4, 5)),
]


@pytest.mark.parametrize("phase", [TRAIN, TEST])
@pytest.mark.parametrize("extra,shape", CASES)
def test_max_and_ave(gpu, extra, shape, phase):
    run_on_both(pool_text(extra), [data(*shape)], phase=phase, **exactness(gpu, extra))


def test_max_ties_take_the_first_position(gpu):
    x = RNG.integers(0, 3, (2, 3, 6, 6)).astype(np.float32)
    run_on_both(pool_text("pool: MAX kernel_size: 3 stride: 1 pad: 1"), [x], exact=True)


@pytest.mark.parametrize("extra,shape", [("kernel_size: 3 stride: 2", (2, 3, 7, 6)),
                                         ("kernel_size: 2 stride: 2 pad: 1", (1, 2, 5, 4)),
                                         ("global_pooling: true", (2, 2, 3, 3))])
def test_max_with_the_mask_top(gpu, extra, shape):
    """Caffe's second top: the positions as floats; the backward reads them back from it."""
    layer, _, top = run_on_both(pool_text("pool: MAX " + extra), [data(*shape)], num_tops=2, exact=True)
    assert top[1].shape == top[0].shape


@pytest.mark.parametrize("extra,shape", [("kernel_size: 3 stride: 2", (2, 3, 7, 6)),
                                         ("kernel_size: 2 stride: 2", (2, 2, 4, 6)),
                                         ("kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 2", (1, 3, 5, 5)),
                                         ("global_pooling: true", (2, 2, 3, 4))])
def test_stochastic(gpu, extra, shape):
    # TRAIN draws on the host with the CPU's generator: the same inputs are chosen.
    run_on_both(pool_text("pool: STOCHASTIC " + extra), [positive(*shape)], phase=TRAIN, exact=True)
    # TEST's backward: the CPU kernel (Cython) takes 2 * x - out in double; the GPU kernel stays in float.
    run_on_both(pool_text("pool: STOCHASTIC " + extra), [positive(*shape)], phase=TEST,
                tol=dict(rtol=1e-5, atol=1e-6))


def test_stochastic_train_with_negative_inputs_chooses_nothing_somewhere(gpu):
    """A window whose running sum never reaches its threshold outputs 0 and takes no gradient, as on the CPU."""
    run_on_both(pool_text("pool: STOCHASTIC kernel_size: 2 stride: 2"), [data(2, 3, 6, 6)], phase=TRAIN,
                exact=True)


def test_propagate_down_false_leaves_the_bottom_diff(gpu):
    _, bottom, _ = run_on_both(pool_text("pool: AVE kernel_size: 2"), [data(1, 2, 4, 4)], propagate_down=[False],
                               **exactness(gpu, "AVE"))
    np.testing.assert_array_equal(bottom[0].diff, 7.0)


SPP_CASES = [(pool, data, height, shape) for pool in ("MAX", "AVE")
             for height, shape in [(1, (2, 3, 5, 4)), (2, (2, 2, 5, 7)), (3, (1, 2, 9, 8))]]
# STOCHASTIC takes no padding: sizes that the bins divide
SPP_CASES += [("STOCHASTIC", positive, height, shape) for height, shape in [(1, (2, 3, 5, 4)), (2, (2, 2, 4, 6)),
                                                                            (3, (1, 2, 8, 12))]]


@pytest.mark.parametrize("pool,make,height,shape", SPP_CASES)
def test_spp(gpu, pool, make, height, shape):
    # SPP's internal Pooling layers always run in TRAIN (Caffe builds them with a fresh LayerParameter).
    run_on_both('type: "SPP" spp_param { pyramid_height: %d pool: %s }' % (height, pool), [make(*shape)],
                exact=True)
