"""The update rules as functions of arrays, against the formulas of Caffe's solvers written out in float64."""
import numpy as np
import pytest

from pycaffe_dist.errors import SolverError
from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.solver import updates

RNG = np.random.default_rng(5)
LR = 0.05


def arrays(*shape, n=3):
    return [RNG.standard_normal(shape).astype(np.float32) for _ in range(n)]


def test_sgd_momentum():
    g, h, _ = arrays(4, 3)
    want_h = 0.9 * h.astype(np.float64) + LR * g
    updates.sgd(g, h, LR, 0.9)
    np.testing.assert_allclose(h, want_h, rtol=1e-6)
    np.testing.assert_array_equal(g, h)          # the step is the new history


def test_nesterov_steps_back_then_over():
    g, h, _ = arrays(5)
    old = h.astype(np.float64)
    new = 0.9 * old + LR * g
    updates.nesterov(g, h, LR, 0.9)
    np.testing.assert_allclose(h, new, rtol=1e-6)
    np.testing.assert_allclose(g, 1.9 * new - 0.9 * old, rtol=1e-5, atol=1e-7)


def test_adagrad():
    g, h, _ = arrays(6)
    h = np.abs(h)
    want_h = h.astype(np.float64) + g.astype(np.float64) ** 2
    want = LR * g / (np.sqrt(want_h) + 1e-8)
    updates.adagrad(g, h, LR, 1e-8)
    np.testing.assert_allclose(h, want_h, rtol=1e-6)
    np.testing.assert_allclose(g, want, rtol=1e-6)


def test_rmsprop():
    g, h, _ = arrays(6)
    h = np.abs(h)
    want_h = 0.98 * h.astype(np.float64) + 0.02 * g.astype(np.float64) ** 2
    want = LR * g / (np.sqrt(want_h) + 1e-8)
    updates.rmsprop(g, h, LR, 0.98, 1e-8)
    np.testing.assert_allclose(h, want_h, rtol=1e-6)
    np.testing.assert_allclose(g, want, rtol=1e-5)


def test_adadelta_updates_both_histories_with_the_unscaled_step():
    g, h, h2 = arrays(7)
    h, h2 = np.abs(h), np.abs(h2)
    g64, m, d = g.astype(np.float64), 0.95, 1e-6
    want_h = m * h + (1 - m) * g64 ** 2
    u = g64 * np.sqrt((h2 + d) / (want_h + d))
    want_h2 = m * h2 + (1 - m) * u ** 2
    updates.adadelta(g, h, h2, LR, m, d)
    np.testing.assert_allclose(h, want_h, rtol=1e-5)
    np.testing.assert_allclose(h2, want_h2, rtol=1e-5)
    np.testing.assert_allclose(g, LR * u, rtol=1e-5)


def test_adam_folds_the_bias_correction_into_the_rate():
    g, m, v = arrays(8)
    v = np.abs(v)
    g64, b1, b2, eps, t = g.astype(np.float64), 0.9, 0.999, 1e-8, 3
    want_m = b1 * m + (1 - b1) * g64
    want_v = b2 * v + (1 - b2) * g64 ** 2
    correction = np.sqrt(1 - np.float32(b2).astype(np.float64) ** t) / (1 - np.float32(b1).astype(np.float64) ** t)
    updates.adam(g, m, v, LR, b1, b2, eps, t)
    np.testing.assert_allclose(m, want_m, rtol=1e-5)
    np.testing.assert_allclose(v, want_v, rtol=1e-5)
    np.testing.assert_allclose(g, LR * correction * want_m / (np.sqrt(want_v) + eps), rtol=1e-5)
    assert updates.adam_correction(0.9, 0.999, 1) == np.float32(np.sqrt(1 - np.float64(np.float32(0.999)))
                                                                / (1 - np.float64(np.float32(0.9))))


def test_regularize_l2_l1_and_decay_mult():
    w = np.array([-2.0, 0.0, 3.0], np.float32)
    g = np.ones(3, np.float32)
    updates.regularize(w, g, 0.1, 2.0, "L2")
    np.testing.assert_allclose(g, [1 - 0.4, 1, 1 + 0.6], rtol=1e-6)
    g = np.ones(3, np.float32)
    updates.regularize(w, g, 0.1, 2.0, "L1")
    np.testing.assert_allclose(g, [0.8, 1.0, 1.2], rtol=1e-6)   # sign(0) = 0
    g = np.ones(3, np.float32)
    updates.regularize(w, g, 0.1, 0.0, "nonsense")                # no decay: Caffe never looks at the type
    np.testing.assert_array_equal(g, 1)
    with pytest.raises(SolverError, match="unknown regularization type: 'L3'"):
        updates.regularize(w, g, 0.1, 1.0, "L3")


def test_clip_gradients_uses_the_global_norm():
    a, b = np.full(4, 3.0, np.float32), np.full(9, 4.0 / 3, np.float32)    # norm sqrt(36 + 16) = sqrt(52)
    norm, scale = updates.clip_gradients([a, b], 1.0)
    assert norm == pytest.approx(np.sqrt(52), rel=1e-6) and scale == pytest.approx(1 / np.sqrt(52), rel=1e-6)
    assert np.sqrt((a ** 2).sum() + (b ** 2).sum()) == pytest.approx(1.0, rel=1e-6)
    assert updates.clip_gradients([a, b], 5.0) == (pytest.approx(1.0, rel=1e-6), None)   # under the bound
    assert updates.clip_gradients([a, b], -1) == (None, None)                            # off


def test_normalize_for_iter_size():
    g = np.full(3, 6.0, np.float32)
    updates.normalize(g, 3)
    np.testing.assert_array_equal(g, 2.0)
    updates.normalize(g, 1)
    np.testing.assert_array_equal(g, 2.0)


def solver_param(**fields):
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="fixed", **fields)
    return p


def test_compute_steps_order_clip_normalize_regularize_then_rule():
    # Two parameters, iter_size 2, clipping, weight decay with decay_mult 0 on the second: one full ApplyUpdate.
    p = solver_param(type="SGD", momentum=0.5, weight_decay=0.01, clip_gradients=1.0, iter_size=2)
    w = [np.array([1.0, -1.0], np.float32), np.array([2.0], np.float32)]
    g = [np.array([3.0, 0.0], np.float32), np.array([4.0], np.float32)]
    history = updates.new_history(p, [x.shape for x in w])
    result = updates.compute_steps(p, w, g, [1.0, 2.0], [1.0, 0.0], history, iteration=0)
    scale = 1 / 5.0
    g0 = np.array([3.0, 0.0]) * scale / 2 + 0.01 * np.array([1.0, -1.0])
    g1 = np.array([4.0]) * scale / 2
    np.testing.assert_allclose(g[0], 0.1 * g0, rtol=1e-6)
    np.testing.assert_allclose(g[1], 0.2 * g1, rtol=1e-6)
    assert result["clip_scale"] == pytest.approx(scale) and result["rate"] == np.float32(0.1)
    updates.apply_steps(w, g)
    np.testing.assert_allclose(w[1], [2.0 - 0.2 * 0.4], rtol=1e-6)


@pytest.mark.parametrize("weight_decay, decay_mult", [(0.0005, 1.0), (0.01, 0.0), (0.0, 1.0)])
def test_sgd_in_one_pass_gives_the_numpy_functions_bits(weight_decay, decay_mult):
    # compute_steps runs SGD with L2 through csrc/updates.pyx; regularize then sgd are the reference. Values
    # spread over magnitudes and a history of momentum, so that any change of operation order shows in the bits.
    p = solver_param(type="SGD", momentum=0.9, weight_decay=weight_decay)
    w, g, h = (RNG.standard_normal(1001).astype(np.float32) * np.float32(10) ** RNG.integers(-4, 4, 1001)
               for _ in range(3))
    w[:3] = [np.inf, np.nan, 0.0]                  # 0 * inf is NaN: a decay of 0 must not touch the gradient
    history = [h.copy()]
    steps = [g.copy()]
    updates.compute_steps(p, [w], steps, [2.0], [decay_mult], history, iteration=7)
    rate = np.float32(p.base_lr) * np.float32(2.0)
    want_g, want_h = g.copy(), h.copy()
    updates.regularize(w, want_g, weight_decay, decay_mult)
    updates.sgd(want_g, want_h, rate, 0.9)
    np.testing.assert_array_equal(steps[0], want_g)
    np.testing.assert_array_equal(history[0], want_h)


@pytest.mark.parametrize("kind, regularization", [("SGD", "L2"), ("SGD", "L1"), ("Adam", "L2")])
def test_applying_each_step_at_once_is_applying_them_after(kind, regularization):
    # apply=True (the solver's path: csrc/updates.pyx applies fused SGD steps in their pass) gives the bits of
    # compute_steps then apply_steps, for the fused rule and the others.
    p = solver_param(type=kind, momentum=0.9, weight_decay=0.004, regularization_type=regularization,
                     clip_gradients=5.0)
    shapes = [(30, 7), (7,)]
    w = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    g = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    args = ([1.0, 2.0], [1.0, 0.0])
    history_after = [h + 0.1 for h in updates.new_history(p, shapes)]
    history_at_once = [h.copy() for h in history_after]
    w_after, g_after = [x.copy() for x in w], [x.copy() for x in g]
    updates.compute_steps(p, w_after, g_after, *args, history_after, iteration=3)
    updates.apply_steps(w_after, g_after)
    updates.compute_steps(p, w, g, *args, history_at_once, iteration=3, apply=True)
    for got, want in zip(w + g + history_at_once, w_after + g_after + history_after):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(w_after[0], w_after[0] + g_after[0])     # the steps are not zero


def test_the_fused_step_refuses_shared_arrays():
    # its loops read through restrict pointers: data, diff and history may not be one array
    from pycaffe_dist._kernels import updates as kernel
    w, h = np.ones(4, np.float32), np.ones(4, np.float32)
    for data, diff, history in ((w, w, h), (w, h, h), (h, w, h)):
        with pytest.raises(ValueError, match="must be separate arrays"):
            kernel.sgd_step(data, diff, history, 0.0, 0.1, 0.9, True)


def test_history_layout_is_caffes():
    shapes = [(2, 3), (3,)]
    for kind, sets in (("SGD", 1), ("AdaGrad", 1), ("AdaDelta", 2), ("Adam", 2)):
        history = updates.new_history(solver_param(type=kind), shapes)
        assert [h.shape for h in history] == shapes * sets


@pytest.mark.parametrize("fields, message", [
    (dict(type="AdaGrad", momentum=0.9), "momentum cannot be used with AdaGrad"),
    (dict(type="RMSProp", momentum=0.9), "momentum cannot be used with RMSProp"),
    (dict(type="RMSProp", rms_decay=1.0), "rms_decay should lie between 0 and 1"),
    (dict(type="Adamax"), "unknown solver type: 'Adamax' (known types: AdaDelta, AdaGrad, Adam, Nesterov, RMSProp, "
                          "SGD)"),
    (dict(type="SGD", average_loss=0), "average_loss should be at least 1"),
])
def test_solver_checks(fields, message):
    with pytest.raises(SolverError) as info:
        updates.check_solver(solver_param(**fields), "s.prototxt")
    assert str(info.value).startswith("s.prototxt: ") and message in str(info.value)


def test_rates_past_the_float_range_are_what_cpp_gives_not_errors():
    from pycaffe_dist.solver.lr_policy import learning_rate
    # sigmoid with gamma * stepsize > 709.8: exp is inf in C++, so the rate is 0 (math.exp would raise)
    sigmoid = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="sigmoid", gamma=0.01, stepsize=100000)
    assert learning_rate(sigmoid, 0)[0] == 0
    exp = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="exp", gamma=1.01)
    assert np.isinf(learning_rate(exp, 100000)[0])
    assert np.isinf(updates.adam_correction(1.0, 0.999, 3))          # 1 - beta1^t = 0
    assert np.isnan(updates.adam_correction(0.9, 1.5, 3))            # sqrt of a negative
