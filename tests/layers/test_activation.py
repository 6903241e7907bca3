"""Neuron layers (pycaffe_dist/layers/activation.py) and their kernels (csrc/neuron.pyx via
pycaffe_dist/backend/neuron.py): values against numpy in both dtypes (small arrays and arrays long enough for the
OpenMP path), in place against not in place, Dropout's mask, Caffe's special cases and errors, and the gradient
checks of Caffe's test_neuron_layer.cpp / test_power_layer.cpp."""
import warnings

import numpy as np
import pytest

from pycaffe_dist import common, random_stream
from pycaffe_dist.errors import NetError
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.gradient_checker import check_layer, layer_param

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def run(text, x, dy=None, in_place=False, phase=TRAIN, seed=None, slopes=None):
    """Forward (and backward with top diff dy) on one bottom of x's dtype; returns (layer, top data, bottom diff).
    slopes: PReLU's slope values; seed: set before the forward (Dropout)."""
    bottom = Blob(x.shape, dtype=x.dtype)
    bottom.data[...] = x
    top = bottom if in_place else Blob(dtype=x.dtype)
    layer = create_layer(layer_param(text), phase)
    layer.setup([bottom], [top])
    for blob in layer.blobs:
        blob.astype(x.dtype)
        if slopes is not None:
            blob.data[...] = slopes
    if seed is not None:
        common.set_random_seed(seed)
    layer.reshape([bottom], [top])
    layer.forward([bottom], [top])
    y = top.data.copy()
    if dy is None:
        return layer, y, None
    top.diff[...] = dy
    layer.backward([top], [True], [bottom])
    return layer, y, bottom.diff.copy()


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def normal(rng, shape):
    return rng.standard_normal(shape)


def positive(rng, shape):
    # Caffe's LogBottomInit is exp(normal); halving the exponent keeps x above ~0.1, where a finite difference of
    # step 1e-2 still estimates log's derivative within the checker's threshold.
    return np.exp(0.5 * rng.standard_normal(shape))


def power_base_positive(power, scale, shift):
    """Caffe's TestBackward of test_power_layer.cpp: reflect x so that shift + scale * x >= 0 (plus a margin, so
    that no finite difference crosses the pole of the derivative at 0)."""
    def make(rng, shape):
        x = rng.standard_normal(shape)
        if power in (0, 1, 2):
            return x
        least = -shift / scale
        x = np.where((x - least) * np.sign(scale) < 0, 2 * least - x, x)
        return x + 0.1 * np.sign(scale)
    return make


def away_from(*kinks):
    """Gaussian inputs moved at least 0.03 away from each kink (Caffe's TestClipGradient does the same with 0.01)."""
    def make(rng, shape):
        x = rng.standard_normal(shape)
        for k in kinks:
            near = np.abs(x - k) < 0.03
            x = np.where(near, k + 0.03 * np.where(x >= k, 1, -1), x)
        return x
    return make


# (prototxt, input maker, reference forward f(x) -> y, reference backward g(x, y, dy) -> dx), in float64 with the
# parameters rounded to float32, as caffe.proto holds them.
def f32(*values):
    return [float(np.float32(v)) for v in values]


def _power(p, a, b):
    p, a, b = f32(p, a, b)
    return ('type: "Power" power_param { power: %r scale: %r shift: %r }' % (p, a, b), power_base_positive(p, a, b),
            lambda x: (b + a * x) ** p,
            lambda x, y, dy: dy * (p * a * (b + a * x) ** (p - 1) if p != 0 else 0 * x))


def _exp(base, a, b):
    base, a, b = f32(base, a, b)
    log_base = 1.0 if base == -1 else np.log(base)
    return ('type: "Exp" exp_param { base: %r scale: %r shift: %r }' % (base, a, b), normal,
            lambda x: np.exp(log_base * (b + a * x)),
            lambda x, y, dy: dy * y * a * log_base)


def _log(base, a, b):
    base, a, b = f32(base, a, b)
    log_base = 1.0 if base == -1 else np.log(base)
    return ('type: "Log" log_param { base: %r scale: %r shift: %r }' % (base, a, b), positive,
            lambda x: np.log(b + a * x) / log_base,
            lambda x, y, dy: dy * a / ((b + a * x) * log_base))


def _relu(s):
    s, = f32(s)
    return ('type: "ReLU" relu_param { negative_slope: %r }' % s, normal,
            lambda x: np.where(x > 0, x, s * x), lambda x, y, dy: dy * np.where(x > 0, 1, s))


def _elu(alpha):
    alpha, = f32(alpha)
    return ('type: "ELU" elu_param { alpha: %r }' % alpha, normal,
            lambda x: np.where(x > 0, x, alpha * (np.exp(x) - 1)), lambda x, y, dy: dy * np.where(x > 0, 1, y + alpha))


def _swish(beta):
    beta, = f32(beta)
    return ('type: "Swish" swish_param { beta: %r }' % beta, normal,
            lambda x: x * sigmoid(beta * x),
            lambda x, y, dy: dy * (beta * y + sigmoid(beta * x) * (1 - beta * y)))


CASES = {
    "relu": _relu(0.0),
    "relu_leaky": _relu(0.01),
    "relu_negative_slope": _relu(-0.5),
    "elu": _elu(1.0),
    "elu_alpha0.5": _elu(0.5),
    "elu_as_relu": _elu(0.0),
    "elu_negative_alpha": _elu(-0.7),
    "sigmoid": ('type: "Sigmoid"', normal, sigmoid, lambda x, y, dy: dy * y * (1 - y)),
    "tanh": ('type: "TanH"', normal, np.tanh, lambda x, y, dy: dy * (1 - y * y)),
    "absval": ('type: "AbsVal"', away_from(0), np.abs, lambda x, y, dy: dy * np.sign(x)),
    "bnll": ('type: "BNLL"', lambda rng, shape: 3 * rng.standard_normal(shape), lambda x: np.logaddexp(x, 0),
             lambda x, y, dy: dy * sigmoid(x)),
    "power": _power(0.37, 0.83, -2.4),
    "power_shift0": _power(0.37, 0.83, 0.0),
    "power_zero": _power(0.0, 0.83, -2.4),
    "power_one": _power(1.0, 0.83, -2.4),
    "power_two": _power(2.0, 0.34, -2.4),
    "power_two_scale_half": _power(2.0, 0.5, -2.4),
    "power_three_negative_scale": _power(3.0, -0.7, 0.2),
    "exp": _exp(-1, 1.0, 0.0),
    "exp_shift": _exp(-1, 1.0, 1.0),
    "exp_base2": _exp(2, 1.0, 0.0),
    "exp_base2_shift1": _exp(2, 1.0, 1.0),
    "exp_base2_scale3": _exp(2, 3.0, 0.0),
    "exp_base2_shift1_scale3": _exp(2, 3.0, 1.0),
    "log": _log(-1, 1.0, 0.0),
    "log_shift": _log(-1, 1.0, 1.0),
    "log_base2": _log(2, 1.0, 0.0),
    "log_base2_shift1": _log(2, 1.0, 1.0),
    "log_base2_scale3": _log(2, 3.0, 0.0),
    "log_base2_shift1_scale3": _log(2, 3.0, 1.0),
    "clip": ('type: "Clip" clip_param { min: -1 max: 2 }', away_from(-1, 2), lambda x: np.clip(x, -1, 2),
             lambda x, y, dy: dy * ((x >= -1) & (x <= 2))),
    "swish": _swish(1.0),
    "swish_beta1.5": _swish(1.5),
    "swish_as_linear": _swish(0.0),
}

# Caffe's checkers: ReLU, ELU, Sigmoid, AbsVal, Swish (1e-2, 1e-3, 1701, kink 0, range 0.01); Power (1e-3, 1e-2,
# 1701, 0, 0.01); Log (1e-2, 1e-2); the others (1e-2, 1e-3). All element-wise.
CHECKER = {"power": dict(stepsize=1e-3, threshold=1e-2, kink=0.0, kink_range=0.01),
           "log": dict(threshold=1e-2)}
KINKED = ("relu", "elu", "sigmoid", "absval", "swish")


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient(name):
    text, make, _, _ = CASES[name]
    family = name.split("_")[0]
    checker = CHECKER.get(family, dict(kink=0.0, kink_range=0.01) if family in KINKED else {})
    check_layer(text, [make(np.random.default_rng(1701), (2, 3, 4, 5))], mode="eltwise", **checker)


# 2 x 32 x 48 x 48 = 147456 elements: above the kernels' GRAIN, so the OpenMP path runs.
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 32, 48, 48)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_backward_match_numpy(name, dtype, shape):
    text, make, forward, backward = CASES[name]
    rng = np.random.default_rng(7)
    x = make(rng, shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    _, y, dx = run(text, x, dy)
    x64, y64 = x.astype(np.float64), forward(x.astype(np.float64))
    rtol, atol = (2e-5, 1e-6) if dtype == np.float32 else (1e-12, 1e-13)
    np.testing.assert_allclose(y, y64, rtol=rtol, atol=atol)
    np.testing.assert_allclose(dx, backward(x64, y64, dy.astype(np.float64)), rtol=rtol, atol=atol)
    assert y.dtype == dtype and dx.dtype == dtype


MORE_IN_PLACE = {"prelu": 'type: "PReLU"', "prelu_shared": 'type: "PReLU" prelu_param { channel_shared: true }',
                 "dropout": 'type: "Dropout" dropout_param { dropout_ratio: 0.3 }'}
IN_PLACE = sorted(set(CASES) - {"absval"}) + sorted(MORE_IN_PLACE)     # AbsVal refuses in place, as in Caffe


@pytest.mark.parametrize("name", IN_PLACE)
def test_in_place_matches_out_of_place(name):
    """Every backward sees x as the forward did: for BNLL, Log, Clip, Power, ReLU with a negative slope and ELU with
    a negative alpha this differs from Caffe, whose in-place backward reads the overwritten bottom."""
    text, make = (MORE_IN_PLACE[name], normal) if name in MORE_IN_PLACE else CASES[name][:2]
    rng = np.random.default_rng(3)
    x = make(rng, (2, 3, 4, 5))
    dy = rng.standard_normal(x.shape)
    slopes = -0.6 if name == "prelu_shared" else (np.array([0.25, -0.5, 1.5]) if name == "prelu" else None)
    apart, y, dx = run(text, x, dy, seed=5, slopes=slopes)
    together, y_in, dx_in = run(text, x, dy, in_place=True, seed=5, slopes=slopes)
    np.testing.assert_array_equal(y_in, y)
    np.testing.assert_array_equal(dx_in, dx)
    for a, b in zip(apart.blobs, together.blobs):
        np.testing.assert_array_equal(b.diff, a.diff)


# --- PReLU ----------------------------------------------------------------------------------------------------

def per_channel(slopes, x):
    """PReLU's slopes broadcast against x (one per channel, or one for all)."""
    return np.asarray(slopes, dtype=np.float64).reshape((1, -1) + (1,) * (x.ndim - 2))


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (2, 40, 40, 40)])
@pytest.mark.parametrize("shared", [False, True])
def test_prelu_matches_numpy(shape, shared):
    rng = np.random.default_rng(11)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    slopes = np.array(0.3) if shared else rng.standard_normal(shape[1])
    text = 'type: "PReLU" prelu_param { channel_shared: %s }' % ("true" if shared else "false")
    layer, y, dx = run(text, x, dy, slopes=slopes)
    a = per_channel(slopes, x)
    np.testing.assert_allclose(y, np.where(x > 0, x, a * x), rtol=1e-13)
    np.testing.assert_allclose(dx, dy * np.where(x > 0, 1, a), rtol=1e-13)
    axes = tuple(i for i in range(x.ndim) if shared or i != 1)
    np.testing.assert_allclose(layer.blobs[0].diff, (dy * np.minimum(x, 0)).sum(axis=axes), rtol=1e-10)


def test_prelu_accumulates_slope_diff_and_respects_propagate_down():
    x, dy = np.random.default_rng(2).standard_normal((2, 3, 4)), np.ones((2, 3, 4))
    bottom, top = Blob(x.shape, dtype=np.float64), Blob(dtype=np.float64)
    bottom.data[...] = x
    layer = create_layer(layer_param('type: "PReLU"'))
    layer.setup([bottom], [top])
    layer.blobs[0].astype(np.float64)
    layer.forward([bottom], [top])
    top.diff[...] = dy
    bottom.diff[...] = 7
    layer.backward([top], [False], [bottom])
    once = np.minimum(x, 0).sum(axis=(0, 2))
    np.testing.assert_allclose(layer.blobs[0].diff, once)
    assert (bottom.diff == 7).all()                 # propagate_down False leaves the bottom diff alone
    layer.param_propagate_down = [False]
    layer.backward([top], [True], [bottom])
    np.testing.assert_allclose(layer.blobs[0].diff, once)  # not accumulated again
    layer.param_propagate_down = [True]
    layer.backward([top], [True], [bottom])
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * once)  # Caffe accumulates parameter diffs


@pytest.mark.parametrize("shared", [False, True])
def test_prelu_gradient(shared):
    text = 'type: "PReLU" prelu_param { channel_shared: %s filler { type: "gaussian" std: 1 } }' % (
        "true" if shared else "false")
    x = np.random.default_rng(1701).standard_normal((2, 3, 2, 2))
    check_layer(text, [x], mode="exhaustive", kink=0.0, kink_range=0.01)


# --- Dropout --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ratio", [0.5, 0.75, 0.1])
def test_dropout_train_mask_and_scale(ratio):
    """Caffe's TestDropoutForward: kept values are x / (1 - ratio), the dropped fraction is near the ratio; the
    backward drops and scales the same elements."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 25, 20, 20)).astype(np.float32) + 10        # no zeros in x
    dy = rng.standard_normal(x.shape).astype(np.float32)
    _, y, dx = run('type: "Dropout" dropout_param { dropout_ratio: %r }' % ratio, x, dy, seed=1701)
    kept = y != 0
    scale = np.float32(1 / (1 - np.float32(ratio)))
    np.testing.assert_array_equal(y[kept], x[kept] * scale)
    np.testing.assert_array_equal(dx, np.where(kept, dy * scale, 0))
    std_error = np.sqrt(ratio * (1 - ratio) / x.size)
    assert abs((1 - kept.mean()) - ratio) < 4 * std_error


def _philox_uniforms(seed, name, counter, count):
    """numpy's Philox draws of the stream `name` under `seed` (random_stream.py), from `counter`."""
    key = random_stream.seeded_key(seed, name)
    return np.random.Generator(np.random.Philox(key=key, counter=counter)).random(count, dtype=np.float32)


def test_dropout_mask_is_numpys_philox_stream_of_the_seed_and_the_layer():
    """The mask is uniform < 1 - ratio over the layer's Philox stream; each forward moves the counter past the
    blocks (8 draws each) the previous one used."""
    x = np.ones((3, 1001), np.float32)
    common.set_random_seed(9)
    layer, first, _ = run('name: "drop7" type: "Dropout" dropout_param { dropout_ratio: 0.3 }', x)
    keep = np.float32(1 - np.float32(0.3))
    expected = _philox_uniforms(9, "drop7", 0, x.size).reshape(x.shape) < keep
    np.testing.assert_array_equal(first != 0, expected)
    bottom, top = Blob(x.shape), Blob()
    bottom.data[...] = x
    layer.reshape([bottom], [top])
    layer.forward([bottom], [top])
    expected = _philox_uniforms(9, "drop7", random_stream.blocks_for(x.size), x.size).reshape(x.shape) < keep
    np.testing.assert_array_equal(top.data != 0, expected)
    assert (expected != (first != 0)).any()                  # the stream moved on: a new mask


def test_dropout_masks_by_seed_and_layer_name():
    """Reseeding restarts the layer's stream (the same mask again); a layer of the same name draws the same mask
    after the same seed, another layer or another seed another mask."""
    x = np.ones((3, 1000), np.float32)
    common.set_random_seed(9)
    layer, first, _ = run('type: "Dropout"', x)
    common.set_random_seed(9)
    np.testing.assert_array_equal(run('type: "Dropout"', x)[1], first)
    np.testing.assert_array_equal(run('type: "Dropout"', x, seed=9)[1], first)
    assert (run('name: "drop2" type: "Dropout"', x, seed=9)[1] != first).any()
    assert (run('type: "Dropout"', x, seed=10)[1] != first).any()


def test_dropout_without_a_seed_draws_its_key_from_common_rng(monkeypatch):
    """Never seeded, the stream's key comes from common.rng() (fresh entropy), as the draws did before."""
    monkeypatch.setattr(common, "random_seed", lambda: None)
    x = np.ones((2, 500), np.float32)
    masks = []
    for _ in range(2):
        monkeypatch.setattr(common, "rng", lambda generator=np.random.default_rng(4): generator)
        masks.append(run('type: "Dropout"', x)[1])
    np.testing.assert_array_equal(masks[1], masks[0])      # the same common.rng() state, the same key
    key = int.from_bytes(np.random.default_rng(4).bytes(16), "little")
    uniforms = np.random.Generator(np.random.Philox(key=key)).random(x.size, dtype=np.float32).reshape(x.shape)
    np.testing.assert_array_equal(masks[0] != 0, uniforms < np.float32(0.5))


def test_dropout_ratio_zero_keeps_everything():
    x = np.random.default_rng(1).standard_normal((2, 50))
    _, y, dx = run('type: "Dropout" dropout_param { dropout_ratio: 0 }', x, 2 * x, seed=1)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, 2 * x)


@pytest.mark.parametrize("in_place", [False, True])
def test_dropout_test_phase_is_the_identity(in_place):
    """BVLC Caffe at the golden commit has no scale_train: TEST passes values and diffs through unscaled."""
    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    _, y, dx = run('type: "Dropout" dropout_param { dropout_ratio: 0.3 }', x, 3 * x, in_place=in_place, phase=TEST)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, 3 * x)


@pytest.mark.parametrize("ratio", [0.5, 0.2])
def test_dropout_gradient(ratio):
    """Caffe's TestDropoutGradient (TRAIN); the checker reseeds before every forward, so the mask stays fixed."""
    x = np.random.default_rng(1701).standard_normal((2, 3, 2, 2))
    check_layer('type: "Dropout" dropout_param { dropout_ratio: %r }' % ratio, [x], mode="exhaustive")


def test_dropout_gradient_test_phase():
    x = np.random.default_rng(1701).standard_normal((2, 3, 2, 2))
    check_layer('type: "Dropout"', [x], mode="exhaustive", phase=TEST)


# --- Caffe's special cases and extreme inputs -----------------------------------------------------------------

@pytest.mark.parametrize("text,value", [('power_param { power: 0 scale: 2 shift: 3 }', 1.0),
                                        ('power_param { power: 2 scale: 0 shift: 3 }', 9.0),
                                        ('power_param { power: 0.5 scale: 0 shift: -4 }', np.nan)])
def test_power_ignores_the_input_when_power_or_scale_is_zero(text, value):
    """diff_scale = power * scale = 0: Caffe fills 1 (power 0) or shift ^ power, and a zero bottom diff."""
    x = np.random.default_rng(0).standard_normal((2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # (-4) ^ 0.5
        _, y, dx = run('type: "Power" ' + text, x, np.ones_like(x))
    np.testing.assert_array_equal(y, np.full_like(x, value))
    np.testing.assert_array_equal(dx, np.zeros_like(x))


def test_sigmoid_and_swish_saturate_without_nan_or_warnings():
    x = np.array([-200.0, -100, -20, 0, 20, 100, 200], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, y, dx = run('type: "Sigmoid"', x, np.ones_like(x))
        _, s, _ = run('type: "Swish"', x, np.ones_like(x))
    np.testing.assert_allclose(y, sigmoid(x.astype(np.float64)), rtol=1e-6, atol=1e-40)   # relative down to 2e-9
    np.testing.assert_allclose(s, x * sigmoid(x.astype(np.float64)), rtol=1e-6, atol=1e-40)
    assert np.isfinite(dx).all()


def test_bnll_is_accurate_at_both_ends():
    """log(1 + e^x) keeps its relative accuracy for x << 0 (Caffe computes log(1. + exp(x)) in double); its
    backward stops growing at Caffe's kBNLL_THRESHOLD 50."""
    x = np.array([-100, -40, -17, -1e-3, 0, 1e-3, 17, 40, 60, 100], np.float32)
    _, y, dx = run('type: "BNLL"', x, np.ones_like(x))
    np.testing.assert_allclose(y, np.logaddexp(x.astype(np.float64), 0), rtol=3e-7, atol=1e-43)  # 1e-43: subnormal
    np.testing.assert_allclose(dx, sigmoid(np.minimum(x.astype(np.float64), 50)), rtol=3e-7, atol=1e-43)


def test_clip_bounds_pass_the_gradient_and_nan_becomes_min():
    """Caffe's gradient mask is min <= x <= max; std::max(min, std::min(NaN, max)) is min."""
    x = np.array([-1, 2, -1.5, 2.5, 0.5, np.nan], np.float32)
    _, y, dx = run('type: "Clip" clip_param { min: -1 max: 2 }', x, np.ones_like(x))
    np.testing.assert_array_equal(y, [-1, 2, -1, 2, 0.5, -1])
    np.testing.assert_array_equal(dx, [1, 1, 0, 0, 1, 0])


def test_threshold_is_strict_and_has_no_backward():
    x = np.array([0.1, 0.2, 0.2000001, 5, -5], np.float32)
    layer, y, _ = run('type: "Threshold" threshold_param { threshold: 0.2 }', x)
    np.testing.assert_array_equal(y, [0, 0, 1, 1, 0])       # x > threshold, compared in float32 like Caffe
    assert y.dtype == np.float32
    with pytest.raises(NetError, match="Threshold has no backward"):
        layer.backward([Blob(x.shape)], [True], [Blob(x.shape)])


def test_absval_gradient_at_zero_is_zero():
    x = np.array([-2.0, 0.0, 3.0])
    _, y, dx = run('type: "AbsVal"', x, np.full(3, 5.0))
    np.testing.assert_array_equal(y, [2, 0, 3])
    np.testing.assert_array_equal(dx, [-5, 0, 5])


def test_backward_respects_propagate_down():
    x = np.random.default_rng(0).standard_normal((2, 3))
    bottom, top = Blob(x.shape, dtype=np.float64), Blob(dtype=np.float64)
    bottom.data[...] = x
    layer = create_layer(layer_param('type: "ELU"'))
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    top.diff[...] = 1
    bottom.diff[...] = 4
    layer.backward([top], [False], [bottom])
    assert (bottom.diff == 4).all()


# --- errors ---------------------------------------------------------------------------------------------------

def test_log_base_one_is_refused():
    with pytest.raises(NetError, match=r"Inf result: 1/log\(base\)"):
        run('type: "Log" log_param { base: 1 }', np.ones((2, 2)))


def test_exp_base_one_is_a_constant():
    """Exp allows base 1 (log(base) = 0): y = 1 ^ (shift + scale * x) = 1, with a zero gradient."""
    x = np.random.default_rng(0).standard_normal((2, 3))
    _, y, dx = run('type: "Exp" exp_param { base: 1 scale: 3 shift: 2 }', x, np.ones_like(x))
    np.testing.assert_array_equal(y, np.ones_like(x))
    np.testing.assert_array_equal(dx, np.zeros_like(x))
