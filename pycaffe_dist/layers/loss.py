"""Loss layers and Accuracy.

Caffe's LossLayer (include/caffe/layers/loss_layer.hpp, src/caffe/layers/loss_layer.cpp): 2 bottoms (predictions,
labels/targets), one scalar top with 0 axes, loss weight 1 on it by default, AutoTopBlobs, and no forced backward
into the label bottom.
"""
from ..net.blob import canonical_axis
from ..proto import caffe_pb2
from .base import Layer
from .registry import register

LossParameter = caffe_pb2.LossParameter

# Operations for a softmax over `count` values: max (compare), subtract, exp, sum, divide.
from .softmax import SOFTMAX_FLOPS_PER_ELEMENT


class LossLayer(Layer):
    exact_num_bottom = 2
    exact_num_top = 1
    auto_top_blobs = True
    is_loss = True

    def reshape(self, bottom, top):
        # loss_layer.cpp: CHECK_EQ(bottom[0]->shape(0), bottom[1]->shape(0)) (older Caffe compared num()).
        self.check(len(bottom[0].shape) > 0 and len(bottom[1].shape) > 0,
                   "loss layer inputs need at least one axis (the batch)")
        self.check(bottom[0].shape[0] == bottom[1].shape[0],
                   "The data and label should have the same first dimension (%d vs %d)"
                   % (bottom[0].shape[0], bottom[1].shape[0]))
        top[0].reshape(())   # Loss layers output a scalar; 0 axes.

    def allow_force_backward(self, bottom_index):
        # LossLayer::AllowForceBackward: we cannot backpropagate to the labels.
        return bottom_index != 1


def normalization_mode(param, default=LossParameter.VALID):
    """Caffe's rule (softmax_loss_layer.cpp, sigmoid_cross_entropy_loss_layer.cpp): `normalization` if given, else
    the deprecated `normalize` bool (true = VALID, false = BATCH_SIZE), else the layer's default."""
    lp = param.loss_param
    if lp.HasField("normalization"):
        return lp.normalization
    if lp.HasField("normalize"):
        return LossParameter.VALID if lp.normalize else LossParameter.BATCH_SIZE
    return default


def _labels_match(layer, bottom, axis, what):
    """outer * inner of bottom 0 around `axis` must equal the label count (softmax_loss_layer.cpp)."""
    outer = bottom[0].count_range(0, axis)
    inner = bottom[0].count_range(axis + 1)
    layer.check(outer * inner == bottom[1].count,
                "Number of labels must match number of predictions; e.g., if %s axis == 1 and prediction shape "
                "is (N, C, H, W), label count (number of labels) must be N*H*W, with integer values in "
                "{0, 1, ..., C-1} (predictions %s, labels %s)" % (what, bottom[0].shape, bottom[1].shape))
    return outer, inner


@register("SoftmaxWithLoss")
class SoftmaxWithLossLayer(LossLayer):
    """Softmax over softmax_param.axis, then the multinomial logistic loss; optional 2nd top = the probabilities."""
    exact_num_top = None
    min_top = 1
    max_top = 2

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = lp.ignore_label if lp.HasField("ignore_label") else None
        self.normalization = normalization_mode(self.param)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = canonical_axis(self.param.softmax_param.axis, len(bottom[0].shape), "softmax axis")
        self.outer_num, self.inner_num = _labels_match(self, bottom, self.axis, "softmax")
        if len(top) >= 2:
            top[1].reshape(bottom[0].shape)

    def flops(self, bottom, top):
        return SOFTMAX_FLOPS_PER_ELEMENT * bottom[0].count + 2 * self.outer_num * self.inner_num


@register("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(LossLayer):
    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = lp.ignore_label if lp.HasField("ignore_label") else None
        # sigmoid_cross_entropy_loss_layer.cpp: the default here is BATCH_SIZE, not VALID.
        self.normalization = normalization_mode(self.param, default=LossParameter.BATCH_SIZE)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.check(bottom[0].count == bottom[1].count,
                   "SIGMOID_CROSS_ENTROPY_LOSS layer inputs must have the same count (%s vs %s)"
                   % (bottom[0].shape, bottom[1].shape))

    def flops(self, bottom, top):
        # sigmoid (4) for the diff + x * (t - (x >= 0)) - log(1 + exp(x - 2x(x >= 0))) (~6) per element
        return 10 * bottom[0].count


@register("EuclideanLoss")
class EuclideanLossLayer(LossLayer):
    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.check(bottom[0].count_range(1) == bottom[1].count_range(1),
                   "Inputs must have the same dimension (%s vs %s)" % (bottom[0].shape, bottom[1].shape))

    def allow_force_backward(self, bottom_index):
        # euclidean_loss_layer.hpp: "Unlike most loss layers, in the EuclideanLossLayer we can backpropagate
        # to both inputs".
        return True

    def flops(self, bottom, top):
        return 3 * bottom[0].count     # subtract, then a dot product (multiply-add)


@register("HingeLoss")
class HingeLossLayer(LossLayer):
    def layer_setup(self, bottom, top):
        self.norm = self.param.hinge_loss_param.norm

    def flops(self, bottom, top):
        # negate the true class, 1 + x, max(0, .), then sum (L1) or sum of squares (L2)
        return (4 if self.norm == caffe_pb2.HingeLossParameter.L1 else 5) * bottom[0].count


@register("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    """Bottoms: a (N, C, 1, 1), b (N, C, 1, 1), similarity y (N, 1, 1, 1) (contrastive_loss_layer.cpp)."""
    exact_num_bottom = 3

    def layer_setup(self, bottom, top):
        a, b, y = bottom
        self.check(a.channels == b.channels, "the two feature bottoms must have the same channels (%s vs %s)"
                   % (a.shape, b.shape))
        for blob, what in ((a, "bottom 0"), (b, "bottom 1")):
            self.check(blob.height == 1 and blob.width == 1, "%s must have height and width 1, got %s"
                       % (what, blob.shape))
        self.check(y.channels == 1 and y.height == 1 and y.width == 1,
                   "the similarity bottom must have channels, height and width 1, got %s" % (y.shape,))
        p = self.param.contrastive_loss_param
        self.margin, self.legacy_version = p.margin, p.legacy_version

    def allow_force_backward(self, bottom_index):
        # contrastive_loss_layer.hpp: both feature bottoms get a gradient, the similarity label does not.
        return bottom_index != 2

    def flops(self, bottom, top):
        # a - b, squared distance (multiply-add), and a few ops per pair for the margin term
        return 3 * bottom[0].count + 5 * bottom[0].num


@register("InfogainLoss")
class InfogainLossLayer(LossLayer):
    """Softmax over infogain_loss_param.axis, then -sum_l H[label, l] * log(prob_l) (this Caffe version applies the
    softmax inside, infogain_loss_layer.cpp). H comes from bottom 2 or from the BlobProto file
    infogain_loss_param.source; optional 2nd top = the probabilities."""
    exact_num_bottom = None
    min_bottom = 2
    max_bottom = 3
    exact_num_top = None
    min_top = 1
    max_top = 2

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = lp.ignore_label if lp.HasField("ignore_label") else None
        self.check(not lp.HasField("normalize"), 'normalize is deprecated. use "normalization"')
        self.normalization = lp.normalization
        if len(bottom) < 3:
            # Reading H from the file belongs to the forward pass's work; here only check that one is named.
            self.check(self.param.infogain_loss_param.HasField("source"),
                       "Infogain matrix source must be specified.")

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = canonical_axis(self.param.infogain_loss_param.axis, len(bottom[0].shape), "infogain axis")
        self.outer_num, self.inner_num = _labels_match(self, bottom, self.axis, "infogain")
        self.num_labels = bottom[0].shape[self.axis]
        if len(bottom) > 2:
            self.check(bottom[2].count == self.num_labels ** 2,
                       "InfogainLoss expects the infogain matrix H to be num_labels x num_labels (%d x %d), got %s"
                       % (self.num_labels, self.num_labels, bottom[2].shape))
        if len(top) >= 2:
            top[1].reshape(bottom[0].shape)

    def allow_force_backward(self, bottom_index):
        # infogain_loss_layer.cpp Backward: "cannot backpropagate to label inputs" nor "to infogain inputs".
        return bottom_index == 0

    def flops(self, bottom, top):
        # softmax, then per label position a log and a multiply-add per class
        return SOFTMAX_FLOPS_PER_ELEMENT * bottom[0].count + 3 * bottom[0].count


@register("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(LossLayer):
    """Bottoms: probabilities (N, C, ...) and labels (N, 1, 1, 1) (multinomial_logistic_loss_layer.cpp)."""

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        label = bottom[1]
        self.check(label.channels == 1 and label.height == 1 and label.width == 1,
                   "the label bottom must have channels, height and width 1, got %s" % (label.shape,))

    def flops(self, bottom, top):
        return 3 * bottom[0].num     # max(p, threshold), log, sum


@register("Accuracy")
class AccuracyLayer(Layer):
    """Top-k accuracy over accuracy_param.axis; optional 2nd top = per-class accuracy (accuracy_layer.cpp)."""
    exact_num_bottom = 2
    min_top = 1
    max_top = 2
    has_backward = False     # Backward_cpu: NOT_IMPLEMENTED for any propagate_down

    def layer_setup(self, bottom, top):
        p = self.param.accuracy_param
        self.top_k = p.top_k
        self.ignore_label = p.ignore_label if p.HasField("ignore_label") else None

    def reshape(self, bottom, top):
        self.check(bottom[1].count > 0 and self.top_k <= bottom[0].count // bottom[1].count,
                   "top_k must be less than or equal to the number of classes (top_k %d, predictions %s, labels %s)"
                   % (self.top_k, bottom[0].shape, bottom[1].shape))
        self.axis = canonical_axis(self.param.accuracy_param.axis, len(bottom[0].shape), "accuracy axis")
        self.outer_num = bottom[0].count_range(0, self.axis)
        self.inner_num = bottom[0].count_range(self.axis + 1)
        self.check(self.outer_num * self.inner_num == bottom[1].count,
                   "Number of labels must match number of predictions; e.g., if label axis == 1 and prediction "
                   "shape is (N, C, H, W), label count (number of labels) must be N*H*W, with integer values in "
                   "{0, 1, ..., C-1} (predictions %s, labels %s)" % (bottom[0].shape, bottom[1].shape))
        top[0].reshape(())                                  # Accuracy is a scalar; 0 axes.
        if len(top) > 1:
            top[1].reshape((bottom[0].shape[self.axis],))   # per-class accuracy: (num_labels,)

    def flops(self, bottom, top):
        # a partial sort of the class scores at each position: about one comparison per score and per k
        return bottom[0].count * self.top_k
