"""Forward and backward of the loss layers and Accuracy (pycaffe_dist/layers/loss.py): Caffe's gradient checks
(test_*_loss_layer.cpp settings), values against numpy references for settings the golden cases do not cover,
and Caffe's errors."""
import numpy as np
import pytest

from pycaffe_dist.errors import ModelFileError, NetError
from pycaffe_dist.proto.binary import write_binary
from pycaffe_dist.blob.blob import Blob
from tests.layers.gradient_checker import GradientChecker, check_layer, layer_param

FLT_MIN = np.finfo(np.float32).tiny


def make(text, bottoms, num_tops=1, dtype=np.float32):
    return GradientChecker.make(layer_param(text), bottoms, num_tops=num_tops, dtype=dtype)


def forward(text, bottoms, num_tops=1, dtype=np.float32):
    layer, bottom, top = make(text, bottoms, num_tops, dtype)
    layer.forward(bottom, top)
    return layer, bottom, top


def labels(rng, shape, num_labels, ignore=None, fraction=0.25):
    y = rng.integers(0, num_labels, shape).astype(np.float64)
    if ignore is not None:
        y[rng.random(shape) < fraction] = ignore
    return y


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def normalizer(mode, outer, inner, valid):
    return max(1, {"FULL": outer * inner, "VALID": valid, "BATCH_SIZE": outer, "NONE": 1}[mode])


# --- SoftmaxWithLoss ----------------------------------------------------------------------------------------------

def softmax_loss_reference(x, y, axis, mode, ignore=None):
    """Loss and d loss / d x, written position by position."""
    x = x.astype(np.float64)
    p = np.moveaxis(softmax(x, axis), axis, -1).reshape(y.size, -1)
    outer = int(np.prod(x.shape[:axis]))
    loss, grad, valid = 0.0, p.copy(), 0
    for n, label in enumerate(y.reshape(-1).astype(int)):
        if label == ignore:
            grad[n] = 0
            continue
        loss -= np.log(max(p[n, label], FLT_MIN))
        grad[n, label] -= 1
        valid += 1
    norm = normalizer(mode, outer, y.size // outer, valid)
    shape = x.shape[:axis] + x.shape[axis + 1:] + (x.shape[axis],)
    return loss / norm, np.moveaxis(grad.reshape(shape), -1, axis) / norm


@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("axis", [1, 2])
def test_softmax_loss_matches_reference(mode, axis):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 5, 2)) * 3
    y_shape = x.shape[:axis] + (1,) * (axis == 1) + x.shape[axis + 1:]
    y = labels(rng, y_shape, x.shape[axis], ignore=255)
    text = ('type: "SoftmaxWithLoss" loss_weight: 2.5 loss_weight: 0 softmax_param { axis: %d } '
            'loss_param { normalization: %s ignore_label: 255 }' % (axis, mode))
    layer, bottom, top = forward(text, [x, y], num_tops=2, dtype=np.float64)
    want_loss, want_grad = softmax_loss_reference(x, y, axis, mode, ignore=255)
    np.testing.assert_allclose(top[0].data, want_loss, rtol=1e-12)
    np.testing.assert_allclose(top[1].data, softmax(x, axis), rtol=1e-12)   # the optional probability top
    layer.backward(top, [True, False], bottom)
    np.testing.assert_allclose(bottom[0].diff, 2.5 * want_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("normalize,mode", [("true", "VALID"), ("false", "BATCH_SIZE")])
def test_softmax_loss_legacy_normalize_field(normalize, mode):
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((4, 3, 2)), labels(rng, (4, 2), 3, ignore=0)
    _, _, top = forward('type: "SoftmaxWithLoss" loss_param { normalize: %s ignore_label: 0 }' % normalize, [x, y],
                        dtype=np.float64)
    np.testing.assert_allclose(top[0].data, softmax_loss_reference(x, y, 1, mode, ignore=0)[0], rtol=1e-12)


def test_softmax_loss_all_ignored_is_zero_not_nan():
    # get_normalizer's max(1, count): a batch without a valid label gives loss 0 and gradient 0.
    x, y = np.ones((2, 3)), np.full(2, 5.0)
    layer, bottom, top = forward('type: "SoftmaxWithLoss" loss_param { ignore_label: 5 }', [x, y])
    assert top[0].data == 0
    layer.backward(top, [True, False], bottom)
    assert (bottom[0].diff == 0).all()


def test_softmax_loss_clamps_tiny_probabilities_at_flt_min():
    x, y = np.array([[0.0, -1000.0]]), np.array([1.0])
    _, _, top = forward('type: "SoftmaxWithLoss"', [x, y])
    np.testing.assert_allclose(top[0].data, -np.log(FLT_MIN), rtol=1e-6)


@pytest.mark.parametrize("bad,shown", [(5.0, "5"), (-2.0, "-2"), (7.9, "7"), (1e10, "10000000000")])
@pytest.mark.parametrize("ignore", [None, 3])
def test_softmax_loss_names_a_label_outside_the_classes(bad, shown, ignore):
    x, y = np.zeros((4, 5)), np.array([0.0, 4.9, bad, 1.0])    # 4.9 is class 4: labels are truncated
    text = 'type: "SoftmaxWithLoss"' + ('' if ignore is None else ' loss_param { ignore_label: %d }' % ignore)
    with pytest.raises(NetError, match=r"label %s at position 2 is outside \[0, 5\)" % shown):
        forward(text, [x, y])


def test_softmax_loss_keeps_a_nan_probability():
    # Caffe's std::max(prob, FLT_MIN) keeps a NaN (the comparison is false), so the loss is NaN, not -log(FLT_MIN)
    x, y = np.array([[np.nan, 0.0]]), np.array([0.0])
    _, _, top = forward('type: "SoftmaxWithLoss"', [x, y])
    assert np.isnan(top[0].data)


def test_softmax_loss_ignore_each_label_in_turn():
    # Caffe's TestForwardIgnoreLabel: ignoring each of the 5 labels in turn counts every position 4 times.
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((10, 5, 2, 3)) * 10, labels(rng, (10, 1, 2, 3), 5)
    full = forward('type: "SoftmaxWithLoss" loss_param { normalize: false }', [x, y])[2][0].data
    parts = [forward('type: "SoftmaxWithLoss" loss_param { normalize: false ignore_label: %d }' % k,
                     [x, y])[2][0].data for k in range(5)]
    np.testing.assert_allclose(sum(parts), 4 * full, rtol=1e-5)


SOFTMAX_LOSS_SETTINGS = [
    "loss_weight: 3",
    "loss_param { ignore_label: 0 }",
    "loss_param { normalize: false }",
    "loss_weight: 3 loss_param { normalization: FULL ignore_label: 1 }",
    "loss_param { normalization: NONE }",
    "softmax_param { axis: 2 } loss_param { normalization: BATCH_SIZE }",
]


@pytest.mark.parametrize("setting", SOFTMAX_LOSS_SETTINGS)
def test_softmax_loss_gradient(setting):
    # test_softmax_with_loss_layer.cpp: Gaussian std 10 scores, labels rand % 5, GradientChecker(1e-2, 1e-2).
    rng = np.random.default_rng(1701)
    x = rng.standard_normal((4, 5, 2, 3)) * 10
    y = labels(rng, (4, 1, 2, 3), 5) if "axis" not in setting else labels(rng, (4, 5, 1, 3), 2)
    check_layer('type: "SoftmaxWithLoss" ' + setting, [x, y], check_bottom=0, threshold=1e-2)


# --- SigmoidCrossEntropyLoss --------------------------------------------------------------------------------------

@pytest.mark.parametrize("param,mode", [("", "BATCH_SIZE"), ("loss_param { normalization: FULL }", "FULL"),
                                        ("loss_param { normalize: true ignore_label: -1 }", "VALID"),
                                        ("loss_param { normalization: NONE ignore_label: -1 }", "NONE")])
def test_sigmoid_cross_entropy_matches_reference(param, mode):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 3, 2)) * 3
    t = rng.integers(0, 2, x.shape).astype(np.float64)
    t[rng.random(x.shape) < 0.3] = -1
    if "ignore_label" not in param:
        t = rng.random(x.shape)
    layer, bottom, top = forward('type: "SigmoidCrossEntropyLoss" loss_weight: 1.5 ' + param, [x, t],
                                 dtype=np.float64)
    s = 1 / (1 + np.exp(-x))
    valid = t != -1
    terms = -(t * np.log(s) + (1 - t) * np.log(1 - s))
    norm = normalizer(mode, 4, 6, int(valid.sum()))
    np.testing.assert_allclose(top[0].data, terms[valid].sum() / norm, rtol=1e-12)
    layer.backward(top, [True, False], bottom)
    np.testing.assert_allclose(bottom[0].diff, np.where(valid, 1.5 * (s - t) / norm, 0), rtol=1e-12, atol=1e-15)


def test_sigmoid_cross_entropy_is_stable_for_large_scores():
    x, t = np.array([[100.0, -100.0, 100.0]]), np.array([[1.0, 0.0, 0.0]])
    _, _, top = forward('type: "SigmoidCrossEntropyLoss"', [x, t])
    np.testing.assert_allclose(top[0].data, 100, rtol=1e-6)


def test_sigmoid_cross_entropy_diff_is_caffes_double_sigmoid_rounded_once():
    # sigmoid_layer.cpp: 0.5 * tanh(0.5 * x) + 0.5 with double literals; in float32 the small sigmoids of very
    # negative scores would be lost (0 instead of 2.06e-9 at -20)
    x = np.array([[-20.0, -12.0, -9.0, 0.3, 3.0]], np.float32)
    t = np.array([[0.0, 0.0, 1.0, 0.0, 1.0]], np.float32)
    layer, bottom, top = forward('type: "SigmoidCrossEntropyLoss"', [x, t])
    top[0].diff[...] = 1
    layer.backward(top, [True, False], bottom)
    sigmoid = (0.5 * np.tanh(0.5 * x.astype(np.float64)) + 0.5).astype(np.float32)
    np.testing.assert_array_equal(bottom[0].diff, (sigmoid - t) / np.float32(1))
    assert bottom[0].diff[0, 0] > 2e-9


def test_losses_over_only_ignored_labels_are_plus_zero():
    # Caffe subtracts each term from loss = 0, so no term leaves +0 (a negated empty sum would be -0)
    x, t = np.zeros((2, 3)), np.full((2, 3), -1.0)
    _, _, top = forward('type: "SigmoidCrossEntropyLoss" loss_param { ignore_label: -1 }', [x, t])
    assert top[0].data == 0 and not np.signbit(top[0].data)
    _, _, top = forward('type: "InfogainLoss" loss_param { ignore_label: 0 }',
                        [np.full((2, 3), 1 / 3), np.zeros((2, 1)), np.eye(3)])
    assert top[0].data == 0 and not np.signbit(top[0].data)


@pytest.mark.parametrize("setting", ["loss_weight: 3.7", "loss_param { ignore_label: -1 }",
                                     "loss_param { ignore_label: -1 normalization: VALID }"])
def test_sigmoid_cross_entropy_gradient(setting):
    # test_sigmoid_cross_entropy_loss_layer.cpp: Gaussian std 1 scores, uniform targets (0/1/-1 with ignore_label),
    # GradientChecker(1e-2, 1e-2).
    rng = np.random.default_rng(1701)
    x = rng.standard_normal((10, 5))
    t = rng.random((10, 5)) if "ignore" not in setting else rng.integers(-1, 2, (10, 5)).astype(np.float64)
    check_layer('type: "SigmoidCrossEntropyLoss" ' + setting, [x, t], check_bottom=0, threshold=1e-2)


# --- EuclideanLoss ------------------------------------------------------------------------------------------------

def test_euclidean_loss_values_and_both_gradients():
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((4, 3, 2)), rng.standard_normal((4, 6))
    layer, bottom, top = forward('type: "EuclideanLoss" loss_weight: 2', [a, b], dtype=np.float64)
    d = a.reshape(4, 6) - b
    np.testing.assert_allclose(top[0].data, (d ** 2).sum() / 4 / 2, rtol=1e-12)
    layer.backward(top, [True, True], bottom)
    np.testing.assert_allclose(bottom[0].diff.reshape(4, 6), 2 * d / 4, rtol=1e-12)
    np.testing.assert_allclose(bottom[1].diff, -2 * d / 4, rtol=1e-12)


@pytest.mark.parametrize("setting,shapes", [("loss_weight: 3.7", [(10, 5, 1, 1), (10, 5, 1, 1)]),
                                            ("", [(4, 3, 2), (4, 6)])])
def test_euclidean_loss_gradient(setting, shapes):
    # test_euclidean_loss_layer.cpp: GradientChecker(1e-2, 1e-2), every bottom.
    rng = np.random.default_rng(1701)
    check_layer('type: "EuclideanLoss" ' + setting, [rng.standard_normal(s) for s in shapes], threshold=1e-2)


# --- HingeLoss ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_loss_values_and_margins_left_in_diff(norm):
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal((6, 4)) * 2, labels(rng, (6,), 4)
    layer, bottom, top = forward('type: "HingeLoss" hinge_loss_param { norm: %s }' % norm, [x, y], dtype=np.float64)
    sign = -np.ones_like(x)
    sign[np.arange(6), y.astype(int)] = 1
    margins = np.maximum(0, 1 - sign * x)
    # Caffe's forward keeps the margins in bottom 0's diff for the backward pass.
    np.testing.assert_allclose(bottom[0].diff, margins, rtol=1e-12)
    np.testing.assert_allclose(top[0].data, (margins if norm == "L1" else margins ** 2).sum() / 6, rtol=1e-12)
    layer.backward(top, [True, False], bottom)
    want = -sign * (np.sign(margins) if norm == "L1" else 2 * margins) / 6
    np.testing.assert_allclose(bottom[0].diff, want, rtol=1e-12)


@pytest.mark.parametrize("setting,checker", [
    ("", dict(threshold=2e-3, kink=1, kink_range=0.01)),                 # L1: kinks where |x| = 1
    ("loss_weight: 3", dict(threshold=2e-3, kink=1, kink_range=0.01)),
    ("hinge_loss_param { norm: L2 }", dict(threshold=1e-2)),
])
def test_hinge_loss_gradient(setting, checker):
    # test_hinge_loss_layer.cpp: Gaussian std 10 scores (10, 5, 1, 1), labels rand % 5.
    rng = np.random.default_rng(1701)
    x, y = rng.standard_normal((10, 5, 1, 1)) * 10, labels(rng, (10, 1, 1, 1), 5)
    check_layer('type: "HingeLoss" ' + setting, [x, y], check_bottom=0, **checker)


# --- ContrastiveLoss ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("legacy", [False, True])
def test_contrastive_loss_matches_reference(legacy):
    rng = np.random.default_rng(10)
    a, b = rng.standard_normal((8, 3, 1, 1)) * 0.4, rng.standard_normal((8, 3, 1, 1)) * 0.4
    sim = rng.integers(0, 2, (8, 1, 1, 1)).astype(np.float64)
    text = 'type: "ContrastiveLoss" contrastive_loss_param { margin: 0.75 legacy_version: %s }' % str(legacy).lower()
    layer, bottom, top = forward(text, [a, b, sim], dtype=np.float64)
    d = (a - b).reshape(8, 3)
    dist_sq = (d ** 2).sum(axis=1)
    if legacy:
        other = np.maximum(0.75 - dist_sq, 0)
    else:
        other = np.maximum(0.75 - np.sqrt(dist_sq), 0) ** 2
    loss = np.where(sim.reshape(-1) == 1, dist_sq, other).sum() / 8 / 2
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    assert 0 < (other > 0).sum() < (sim == 0).sum() + (sim == 1).sum()   # both sides of the margin occur
    layer.backward(top, [True, True, False], bottom)
    np.testing.assert_allclose(bottom[1].diff, -bottom[0].diff, rtol=1e-12)


@pytest.mark.parametrize("setting", ["", "contrastive_loss_param { legacy_version: true }",
                                     "loss_weight: 3 contrastive_loss_param { margin: 0.5 }"])
@pytest.mark.parametrize("check_bottom", [0, 1])
def test_contrastive_loss_gradient(setting, check_bottom):
    # test_contrastive_loss_layer.cpp: Gaussian std 0.3 features (distances ~ 1, both sides of the margin),
    # similarity rand % 2, GradientChecker(1e-2, 1e-2), bottoms 0 and 1.
    rng = np.random.default_rng(1701)
    a, b = rng.standard_normal((16, 4, 1, 1)) * 0.3, rng.standard_normal((16, 4, 1, 1)) * 0.3
    sim = rng.integers(0, 2, (16, 1, 1, 1)).astype(np.float64)
    check_layer('type: "ContrastiveLoss" ' + setting, [a, b, sim], check_bottom=check_bottom, threshold=1e-2)


# --- InfogainLoss -------------------------------------------------------------------------------------------------

def write_h(path, h):
    blob = Blob((1, 1) + h.shape)
    blob.data[...] = h
    write_binary(path, blob.to_proto())


def infogain_reference(x, y, h, axis, mode, ignore=None):
    p = np.moveaxis(softmax(x, axis), axis, -1).reshape(y.size, -1)
    outer = int(np.prod(x.shape[:axis]))
    loss, grad, valid = 0.0, np.zeros_like(p), 0
    for n, label in enumerate(y.reshape(-1).astype(int)):
        if label == ignore:
            continue
        loss -= (h[label] * np.log(np.maximum(p[n], 1e-20))).sum()
        grad[n] = p[n] * h[label].sum() - h[label]
        valid += 1
    norm = normalizer(mode, outer, y.size // outer, valid)
    shape = x.shape[:axis] + x.shape[axis + 1:] + (x.shape[axis],)
    return loss / norm, np.moveaxis(grad.reshape(shape), -1, axis) / norm


@pytest.mark.parametrize("mode", ["VALID", "BATCH_SIZE", "FULL"])
def test_infogain_loss_with_h_bottom_matches_reference(mode):
    rng = np.random.default_rng(11)
    x, h = rng.standard_normal((4, 2, 5, 2)) * 2, rng.random((5, 5))
    y = labels(rng, (4, 2, 1, 2), 5, ignore=7)
    text = ('type: "InfogainLoss" loss_weight: 2 loss_weight: 0 infogain_loss_param { axis: 2 } '
            'loss_param { ignore_label: 7 normalization: %s }' % mode)
    layer, bottom, top = forward(text, [x, y, h.reshape(1, 1, 5, 5)], num_tops=2, dtype=np.float64)
    want_loss, want_grad = infogain_reference(x, y, h, 2, mode, ignore=7)
    np.testing.assert_allclose(top[0].data, want_loss, rtol=1e-12)
    np.testing.assert_allclose(top[1].data, softmax(x, 2), rtol=1e-12)
    layer.backward(top, [True, False, False], bottom)
    np.testing.assert_allclose(bottom[0].diff, 2 * want_grad, rtol=1e-12, atol=1e-15)


def test_infogain_loss_reads_h_from_source(tmp_path):
    rng = np.random.default_rng(12)
    x, y, h = rng.standard_normal((6, 4)), labels(rng, (6,), 4), rng.random((4, 4)).astype(np.float32)
    write_h(tmp_path / "H.binaryproto", h)
    _, _, top = forward('type: "InfogainLoss" infogain_loss_param { source: "%s" }' % (tmp_path / "H.binaryproto"),
                        [x, y], dtype=np.float64)
    np.testing.assert_allclose(top[0].data, infogain_reference(x, y, h.astype(np.float64), 1, "VALID")[0], rtol=1e-12)


def test_infogain_loss_source_errors(tmp_path):
    x, y = np.zeros((2, 3)), np.zeros(2)
    with pytest.raises(ModelFileError, match="no such file"):
        forward('type: "InfogainLoss" infogain_loss_param { source: "%s" }' % (tmp_path / "missing"), [x, y])
    write_h(tmp_path / "H4.binaryproto", np.eye(4, dtype=np.float32))
    with pytest.raises(NetError, match="num_labels x num_labels \\(3 x 3\\), got 16"):
        forward('type: "InfogainLoss" infogain_loss_param { source: "%s" }' % (tmp_path / "H4.binaryproto"), [x, y])


@pytest.mark.parametrize("setting", ["infogain_loss_param { axis: 2 }",
                                     "loss_weight: 3 infogain_loss_param { axis: 2 } loss_param { ignore_label: 1 }",
                                     "infogain_loss_param { axis: 2 } loss_param { normalization: NONE }"])
def test_infogain_loss_gradient(setting):
    # test_infogain_loss_layer.cpp: data (4, 2, 5, 2) over axis 2, labels (4, 2, 1, 2), H (1, 1, 5, 5) uniform,
    # GradientChecker(1e-4, 2e-2).
    rng = np.random.default_rng(1701)
    x, y, h = rng.standard_normal((4, 2, 5, 2)), labels(rng, (4, 2, 1, 2), 5), rng.random((1, 1, 5, 5))
    check_layer('type: "InfogainLoss" ' + setting, [x, y, h], check_bottom=0, stepsize=1e-4, threshold=2e-2)


def test_infogain_loss_gradient_with_h_from_source(tmp_path):
    rng = np.random.default_rng(1702)
    write_h(tmp_path / "H.binaryproto", rng.random((5, 5)).astype(np.float32))
    x, y = rng.standard_normal((6, 5)), labels(rng, (6,), 5)
    check_layer('type: "InfogainLoss" infogain_loss_param { source: "%s" }' % (tmp_path / "H.binaryproto"),
                [x, y], check_bottom=0, stepsize=1e-4, threshold=2e-2)


# --- MultinomialLogisticLoss --------------------------------------------------------------------------------------

def test_multinomial_logistic_loss_values_and_threshold():
    p = np.array([[0.2, 0.8], [0.0, 1.0], [0.5, 0.5]])
    y = np.array([1.0, 0.0, 0.0]).reshape(3, 1, 1, 1)
    layer, bottom, top = forward('type: "MultinomialLogisticLoss" loss_weight: 2', [p, y], dtype=np.float64)
    # kLOG_THRESHOLD keeps log(0) finite; it is a float constant (1e-20 rounded to float32) in double nets too
    tiny = float(np.float32(1e-20))
    assert tiny != 1e-20
    np.testing.assert_allclose(top[0].data, -(np.log(0.8) + np.log(tiny) + np.log(0.5)) / 3, rtol=1e-15)
    layer.backward(top, [True, False], bottom)
    np.testing.assert_allclose(bottom[0].diff, [[0, -2 / 3 / 0.8], [-2 / 3 / tiny, 0], [-2 / 3 / 0.5, 0]],
                               rtol=1e-15)


@pytest.mark.parametrize("setting", ["", "loss_weight: 3"])
def test_multinomial_logistic_loss_gradient(setting):
    # test_multinomial_logistic_loss_layer.cpp: rows of positive values summing to 1, labels rand % 5,
    # GradientChecker(1e-2, 2e-2, kink 0, kink_range 0.05).
    rng = np.random.default_rng(1701)
    p = rng.random((10, 5)) + 0.05
    p /= p.sum(axis=1, keepdims=True)
    check_layer('type: "MultinomialLogisticLoss" ' + setting, [p.reshape(10, 5, 1, 1), labels(rng, (10, 1, 1, 1), 5)],
                check_bottom=0, threshold=2e-2, kink=0, kink_range=0.05)


# --- errors shared by the losses ----------------------------------------------------------------------------------

LABEL_BOTTOMS = {
    "SoftmaxWithLoss": ([np.zeros((2, 3)), np.zeros(2)], [1]),
    "SigmoidCrossEntropyLoss": ([np.zeros((2, 3)), np.zeros((2, 3))], [1]),
    "HingeLoss": ([np.zeros((2, 3)), np.zeros(2)], [1]),
    "MultinomialLogisticLoss": ([np.full((2, 3), 0.5), np.zeros((2, 1, 1, 1))], [1]),
    "InfogainLoss": ([np.zeros((2, 3)), np.zeros(2), np.eye(3).reshape(1, 1, 3, 3)], [1, 2]),
}


@pytest.mark.parametrize("layer_type", sorted(LABEL_BOTTOMS))
def test_cannot_backpropagate_to_labels(layer_type):
    bottoms, refused = LABEL_BOTTOMS[layer_type]
    for i in refused:
        layer, bottom, top = forward('type: "%s"' % layer_type, bottoms)
        propagate = [j == i for j in range(len(bottoms))]
        what = "infogain" if i == 2 else "label"
        with pytest.raises(NetError, match="%s Layer cannot backpropagate to %s inputs" % (layer_type, what)):
            layer.backward(top, propagate, bottom)


@pytest.mark.parametrize("layer_type,bottoms", [
    ("SoftmaxWithLoss", [np.zeros((2, 3)), np.array([0.0, 3.0])]),
    ("InfogainLoss", [np.zeros((2, 3)), np.array([-1.0, 0.0]), np.eye(3).reshape(1, 1, 3, 3)]),
    ("HingeLoss", [np.zeros((2, 3)), np.array([0.0, 3.0])]),
    ("MultinomialLogisticLoss", [np.zeros((2, 3)), np.array([0.0, 7.0]).reshape(2, 1, 1, 1)]),
    ("Accuracy", [np.zeros((2, 3)), np.array([0.0, 3.0])]),
])
def test_label_out_of_range_is_an_error(layer_type, bottoms):
    with pytest.raises(NetError, match="label .* is outside \\[0, 3\\)"):
        forward('type: "%s"' % layer_type, bottoms)


def test_labels_truncate_toward_zero_as_static_cast():
    x = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    loss = forward('type: "SoftmaxWithLoss"', [x, np.array([2.9, 0.7])])[2][0].data
    same = forward('type: "SoftmaxWithLoss"', [x, np.array([2.0, 0.0])])[2][0].data
    assert loss == same


# --- Accuracy -----------------------------------------------------------------------------------------------------

def accuracy_reference(scores, y, axis, top_k, ignore=None):
    """Position by position: correct when fewer than top_k OTHER classes score >= the true class (ties lose)."""
    s = np.moveaxis(scores, axis, -1).reshape(y.size, -1)
    num_labels = s.shape[1]
    hits, counts = np.zeros(num_labels), np.zeros(num_labels)
    for n, label in enumerate(y.reshape(-1).astype(int)):
        if label == ignore:
            continue
        others = sum(1 for k in range(num_labels) if k != label and s[n, k] >= s[n, label])
        counts[label] += 1
        hits[label] += others < top_k
    total = counts.sum()
    per_class = np.divide(hits, counts, out=np.zeros(num_labels), where=counts > 0)
    return (hits.sum() / total if total else 0.0), per_class


@pytest.mark.parametrize("top_k", [1, 2, 4])
@pytest.mark.parametrize("axis", [1, 2])
def test_accuracy_matches_reference(top_k, axis):
    rng = np.random.default_rng(13 + top_k)
    # scores on a coarse grid, so that ties are frequent
    scores = rng.integers(0, 4, (3, 5, 4, 2)).astype(np.float32)
    y_shape = scores.shape[:axis] + scores.shape[axis + 1:]
    y = labels(rng, y_shape, scores.shape[axis], ignore=9)
    text = 'type: "Accuracy" accuracy_param { top_k: %d axis: %d ignore_label: 9 }' % (top_k, axis)
    _, _, top = forward(text, [scores, y], num_tops=2)
    want, per_class = accuracy_reference(scores, y, axis, top_k, ignore=9)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-7)
    np.testing.assert_allclose(top[1].data, per_class, rtol=1e-7)
    assert top[1].shape == (scores.shape[axis],)


def test_accuracy_ties_count_against_the_true_class():
    scores = np.array([[1.0, 2.0, 2.0], [3.0, 2.0, 2.0], [1.0, 1.0, 1.0]])
    y = np.array([1.0, 0.0, 2.0])
    assert forward('type: "Accuracy"', [scores, y])[2][0].data == np.float32(1 / 3)
    assert forward('type: "Accuracy" accuracy_param { top_k: 2 }', [scores, y])[2][0].data == np.float32(2 / 3)
    assert forward('type: "Accuracy" accuracy_param { top_k: 3 }', [scores, y])[2][0].data == 1


def test_accuracy_without_valid_labels_is_zero():
    _, _, top = forward('type: "Accuracy" accuracy_param { ignore_label: 1 }', [np.zeros((2, 3)), np.ones(2)],
                        num_tops=2)
    assert top[0].data == 0 and (top[1].data == 0).all()


def test_accuracy_has_no_backward():
    layer, bottom, top = forward('type: "Accuracy"', [np.zeros((2, 3)), np.zeros(2)])
    layer.backward(top, [False, False], bottom)   # nothing asked, nothing done (a net never asks)
    with pytest.raises(NetError, match="Accuracy has no backward"):
        layer.backward(top, [True, False], bottom)
