"""Setup and shapes of the loss layers and Accuracy (pycaffe_dist/layers/loss.py) against Caffe."""
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.golden_shapes import cases_of, check_case_shapes

LOSS_TYPES = ["SoftmaxWithLoss", "SigmoidCrossEntropyLoss", "EuclideanLoss", "HingeLoss", "ContrastiveLoss",
              "InfogainLoss", "MultinomialLogisticLoss"]

# bottom shapes each loss accepts: (predictions, labels/targets[, third])
GOOD_BOTTOMS = {
    "SoftmaxWithLoss": [(4, 5), (4,)],
    "SigmoidCrossEntropyLoss": [(4, 5), (4, 5)],
    "EuclideanLoss": [(4, 5), (4, 5)],
    "HingeLoss": [(4, 5), (4,)],
    "ContrastiveLoss": [(4, 5, 1, 1), (4, 5, 1, 1), (4, 1, 1, 1)],
    "InfogainLoss": [(4, 5), (4,), (1, 1, 5, 5)],
    "MultinomialLogisticLoss": [(4, 5), (4, 1, 1, 1)],
}


def make(text, *bottom_shapes, ntop=1):
    lp = parse_text('name: "l" ' + text, caffe_pb2.LayerParameter())
    bottom = [Blob(s) for s in bottom_shapes]
    top = [Blob() for _ in range(ntop)]
    layer = create_layer(lp, caffe_pb2.TRAIN)
    layer.setup(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("name", cases_of(*LOSS_TYPES, "Accuracy"))
def test_golden_shapes(name):
    check_case_shapes(name)


@pytest.mark.parametrize("layer_type", LOSS_TYPES)
def test_loss_contract(layer_type):
    layer, bottom, top = make('type: "%s"' % layer_type, *GOOD_BOTTOMS[layer_type])
    assert top[0].shape == ()
    assert layer.is_loss and layer.auto_top_blobs and layer.has_backward
    assert layer.loss_weights == [1.0]
    assert float(top[0].diff) == 1.0          # Caffe keeps the loss weight in the top's diff
    assert layer.allow_force_backward(0)
    assert layer.flops(bottom, top) > 0
    assert layer.blobs == []


@pytest.mark.parametrize("layer_type", LOSS_TYPES)
def test_loss_first_dimensions_must_match(layer_type):
    shapes = list(GOOD_BOTTOMS[layer_type])
    shapes[1] = (3,) + shapes[1][1:]
    with pytest.raises(NetError, match="same first dimension"):
        make('type: "%s"' % layer_type, *shapes)


@pytest.mark.parametrize("layer_type", LOSS_TYPES)
def test_loss_bottom_counts(layer_type):
    shapes = GOOD_BOTTOMS[layer_type]
    with pytest.raises(NetError, match="bottom"):
        make('type: "%s"' % layer_type, shapes[0])
    with pytest.raises(NetError, match="top"):
        make('type: "%s"' % layer_type, *shapes, ntop=3)


@pytest.mark.parametrize("layer_type,no_grad", [
    ("SoftmaxWithLoss", [1]), ("SigmoidCrossEntropyLoss", [1]), ("HingeLoss", [1]),
    ("MultinomialLogisticLoss", [1]), ("EuclideanLoss", []), ("ContrastiveLoss", [2]), ("InfogainLoss", [1, 2])])
def test_no_forced_backward_into_labels(layer_type, no_grad):
    layer, bottom, _ = make('type: "%s"' % layer_type, *GOOD_BOTTOMS[layer_type])
    for i in range(len(bottom)):
        assert layer.allow_force_backward(i) == (i not in no_grad)


def test_loss_weight_overrides_default():
    layer, _, top = make('type: "EuclideanLoss" loss_weight: 2.5', (4, 5), (4, 5))
    assert layer.loss_weights == [2.5] and float(top[0].diff) == 2.5


def test_softmax_loss_prob_top_and_axis():
    layer, _, top = make('type: "SoftmaxWithLoss"', (2, 5, 3, 3), (2, 1, 3, 3), ntop=2)
    assert top[0].shape == () and top[1].shape == (2, 5, 3, 3)
    assert layer.loss_weights == [1.0, 0.0]
    layer, _, top = make('type: "SoftmaxWithLoss" softmax_param { axis: -1 }', (2, 3, 5), (2, 3), ntop=2)
    assert layer.axis == 2 and top[1].shape == (2, 3, 5)


def test_softmax_loss_label_count_must_match():
    with pytest.raises(NetError, match="Number of labels must match"):
        make('type: "SoftmaxWithLoss"', (2, 5, 3, 3), (2, 1, 3, 2))
    with pytest.raises(NetError, match="out of range"):
        make('type: "SoftmaxWithLoss" softmax_param { axis: 4 }', (2, 5, 3, 3), (2, 1, 3, 3))


def test_softmax_loss_normalization_rules():
    N = caffe_pb2.LossParameter
    assert make('type: "SoftmaxWithLoss"', (4, 5), (4,))[0].normalization == N.VALID
    assert make('type: "SoftmaxWithLoss" loss_param { normalize: false }', (4, 5), (4,))[0].normalization \
        == N.BATCH_SIZE
    assert make('type: "SoftmaxWithLoss" loss_param { normalize: false normalization: FULL }',
                (4, 5), (4,))[0].normalization == N.FULL
    # SigmoidCrossEntropyLoss defaults to BATCH_SIZE
    assert make('type: "SigmoidCrossEntropyLoss"', (4, 5), (4, 5))[0].normalization == N.BATCH_SIZE
    layer = make('type: "SoftmaxWithLoss" loss_param { ignore_label: 255 }', (4, 5), (4,))[0]
    assert layer.ignore_label == 255


def test_sigmoid_cross_entropy_counts_must_match():
    with pytest.raises(NetError, match="same count"):
        make('type: "SigmoidCrossEntropyLoss"', (4, 5), (4, 4))


def test_euclidean_dimensions_must_match():
    make('type: "EuclideanLoss"', (4, 6), (4, 2, 3))     # count(1) equal, shapes differ: accepted
    with pytest.raises(NetError, match="same dimension"):
        make('type: "EuclideanLoss"', (4, 5), (4, 6))


def test_contrastive_shapes():
    with pytest.raises(NetError, match="exactly 3 bottom"):
        make('type: "ContrastiveLoss"', (4, 5, 1, 1), (4, 5, 1, 1))
    with pytest.raises(NetError, match="same channels"):
        make('type: "ContrastiveLoss"', (4, 5, 1, 1), (4, 6, 1, 1), (4, 1, 1, 1))
    with pytest.raises(NetError, match="height and width 1"):
        make('type: "ContrastiveLoss"', (4, 5, 2, 1), (4, 5, 2, 1), (4, 1, 1, 1))
    with pytest.raises(NetError, match="similarity"):
        make('type: "ContrastiveLoss"', (4, 5), (4, 5), (4, 2))
    make('type: "ContrastiveLoss"', (4, 5), (4, 5), (4,))    # missing legacy axes count as 1


def test_infogain_source_bottoms_and_tops():
    with pytest.raises(NetError, match="source must be specified"):
        make('type: "InfogainLoss"', (4, 5), (4,))
    layer, _, top = make('type: "InfogainLoss" infogain_loss_param { source: "H.binaryproto" }', (4, 5), (4,),
                         ntop=2)
    assert top[0].shape == () and top[1].shape == (4, 5) and layer.num_labels == 5
    make('type: "InfogainLoss"', (4, 5), (4,), (5, 5))       # H as a bottom: no source needed
    with pytest.raises(NetError, match="num_labels x num_labels"):
        make('type: "InfogainLoss"', (4, 5), (4,), (1, 1, 4, 4))
    with pytest.raises(NetError, match="deprecated"):
        make('type: "InfogainLoss" loss_param { normalize: true }', (4, 5), (4,), (5, 5))
    layer, _, _ = make('type: "InfogainLoss" infogain_loss_param { axis: 2 }', (2, 3, 5), (2, 3), (5, 5))
    assert layer.num_labels == 5
    with pytest.raises(NetError, match="at most 3 bottom"):
        make('type: "InfogainLoss"', (4, 5), (4,), (5, 5), (5, 5))


def test_multinomial_logistic_label_shape():
    make('type: "MultinomialLogisticLoss"', (4, 5), (4,))
    with pytest.raises(NetError, match="label bottom"):
        make('type: "MultinomialLogisticLoss"', (4, 5), (4, 2))


def test_accuracy_shapes_and_contract():
    layer, bottom, top = make('type: "Accuracy"', (4, 5), (4,))
    assert top[0].shape == () and not layer.is_loss and layer.has_backward is False
    assert layer.loss_weights == [0.0]
    assert layer.flops(bottom, top) > 0
    layer, _, top = make('type: "Accuracy" accuracy_param { axis: 2 top_k: 2 }', (2, 3, 7), (2, 3), ntop=2)
    assert top[0].shape == () and top[1].shape == (7,)
    with pytest.raises(NetError, match="at most 2 top"):
        make('type: "Accuracy"', (4, 5), (4,), ntop=3)


def test_accuracy_top_k_and_label_checks():
    make('type: "Accuracy" accuracy_param { top_k: 5 }', (4, 5), (4,))
    with pytest.raises(NetError, match="top_k must be less than or equal to the number of classes"):
        make('type: "Accuracy" accuracy_param { top_k: 6 }', (4, 5), (4,))
    with pytest.raises(NetError, match="Number of labels must match"):
        make('type: "Accuracy"', (4, 5, 2), (4, 5))
