"""Loss layers and Accuracy.

Caffe's LossLayer (include/caffe/layers/loss_layer.hpp, src/caffe/layers/loss_layer.cpp): 2 bottoms (predictions,
labels/targets), one scalar top with 0 axes, loss weight 1 on it by default, AutoTopBlobs, and no forced backward
into the label bottom. Backward scales by the loss weight Caffe keeps in top[0].diff.

Labels are float blobs read as Caffe's static_cast<int> (truncation toward zero). Caffe only DCHECKs their range
(a release build reads out of bounds); we raise a NetError naming the bad label instead.
"""
import numpy as np

from ..backend import select, softmax
from ..blob.binaryproto import read_blob_file
from ..proto import caffe_pb2
from . import channel_sums
from .base import Layer, checked_axis
from .gpu_helpers import SOFTMAX_FLOPS_PER_ELEMENT, gpu_softmax
from .registry import register

LossParameter = caffe_pb2.LossParameter

# loss_layer.hpp kLOG_THRESHOLD (MultinomialLogistic and Infogain losses): a float constant, also in double nets
LOG_THRESHOLD = float(np.float32(1e-20))
# The most label positions whose SoftmaxWithLoss is summed by one GPU thread (a classifier's batch). The thread's
# loop is bound by the latency of its loads: about 256 x 2 L2 reads, 4 at a time, some 20 us of GPU time at 256,
# where the parallel sum's three more launches cost the host about as much and the GPU of a small net has time to
# spare while the host queues the backward.
SEQUENTIAL_LOSS_MAX_POSITIONS = 256


class LossLayer(Layer):
    reshape_from_shapes = True
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

    def no_backward_into(self, propagate_down, *indices, what="label"):
        """Caffe's LOG(FATAL) "<type> Layer cannot backpropagate to label inputs." when asked to."""
        for i in indices:
            if i < len(propagate_down) and propagate_down[i]:
                raise self.error("%s Layer cannot backpropagate to %s inputs." % (self.param.type, what))

    @staticmethod
    def loss_weight(top):
        return top[0].diff[()]


def normalization_mode(param, default=LossParameter.VALID):
    """Caffe's rule (softmax_loss_layer.cpp, sigmoid_cross_entropy_loss_layer.cpp): `normalization` if given, else
    the deprecated `normalize` bool (true = VALID, false = BATCH_SIZE), else the layer's default."""
    lp = param.loss_param
    if lp.HasField("normalization"):
        return lp.normalization
    if lp.HasField("normalize"):
        return LossParameter.VALID if lp.normalize else LossParameter.BATCH_SIZE
    return default


def normalizer(mode, outer_num, inner_num, valid_count):
    """Caffe's get_normalizer (softmax, sigmoid cross-entropy and infogain losses). It is never below 1: a batch
    whose labels are all ignored gives loss 0, not NaN."""
    n = {LossParameter.FULL: outer_num * inner_num, LossParameter.VALID: valid_count,
         LossParameter.BATCH_SIZE: outer_num, LossParameter.NONE: 1}[mode]
    return max(1, n)


def read_labels(layer, blob, num_labels, ignore_label=None, count=None):
    """The first `count` labels of `blob` as Caffe's static_cast<int>, and a mask of those that count (not
    ignore_label). Ignored labels are replaced by 0 so that they can index."""
    labels = blob.data.reshape(-1)[:count].astype(np.int64)   # float -> int truncates toward zero
    valid = np.ones(labels.shape, bool) if ignore_label is None else labels != ignore_label
    bad = valid & ((labels < 0) | (labels >= num_labels))
    if bad.any():
        i = int(np.argmax(bad))
        raise layer.error("label %d at position %d is outside [0, %d)%s" % (
            labels[i], i, num_labels, "" if ignore_label is None else " and is not ignore_label %d" % ignore_label))
    return np.where(valid, labels, 0), valid


def ignore_args(ignore_label):
    """(has_ignore_label, ignore_label) as the GPU kernels take them."""
    return (0, 0) if ignore_label is None else (1, ignore_label)


def refuse_bad_labels(layer, dev, bad, blob, num_labels, ignore_label):
    """The GPU kernels flag labels outside [0, num_labels) instead of reading past the class axis; where any is
    flagged, raise the CPU path's error (read_labels names the first one)."""
    if dev.asum(bad.size, bad) > 0:
        read_labels(layer, blob, num_labels, ignore_label)


def _labels_match(layer, bottom, axis, what):
    """outer * inner of bottom 0 around `axis` must equal the label count (softmax_loss_layer.cpp)."""
    outer = bottom[0].count_range(0, axis)
    inner = bottom[0].count_range(axis + 1)
    layer.check(outer * inner == bottom[1].count,
                "Number of labels must match number of predictions; e.g., if %s axis == 1 and prediction shape "
                "is (N, C, H, W), label count (number of labels) must be N*H*W, with integer values in "
                "{0, 1, ..., C-1} (predictions %s, labels %s)" % (what, bottom[0].shape, bottom[1].shape))
    return outer, inner


class _SoftmaxLossBase(LossLayer):
    """The softmax + label bookkeeping SoftmaxWithLoss and InfogainLoss share. Subclasses set self.axis,
    self.outer_num, self.inner_num in reshape, and self.ignore_label, self.normalization in layer_setup."""
    _prob = None   # the probabilities of the last forward, which backward reads

    def softmax_forward(self, bottom, top):
        """Softmax of bottom 0 over self.axis into top[1] when there is one (Caffe's top[1]->ShareData(prob_): the
        second top IS the probability blob backward reads), else into a buffer of our own."""
        x = bottom[0].data
        prob = top[1].data if len(top) > 1 else self.buffer("prob", x.shape, x.dtype)
        softmax.forward(x, prob, self.axis)
        self._prob = prob
        return prob.reshape(self.outer_num, x.shape[self.axis], self.inner_num)   # no -1: a batch may be empty

    def labels(self, bottom):
        labels, valid = read_labels(self, bottom[1], bottom[0].shape[self.axis], self.ignore_label)
        return labels.reshape(self.outer_num, self.inner_num), valid.reshape(self.outer_num, self.inner_num)

    def scaled_diff(self, top, valid, diff3):
        """Zero the ignored positions (every channel, as Caffe) and scale by loss weight / normalizer."""
        np.copyto(diff3, 0, where=~valid[:, None, :])
        n = normalizer(self.normalization, self.outer_num, self.inner_num, int(valid.sum()))
        diff3 *= self.loss_weight(top) / diff3.dtype.type(n)


@register("SoftmaxWithLoss")
class SoftmaxWithLossLayer(_SoftmaxLossBase):
    """Softmax over softmax_param.axis, then the multinomial logistic loss; optional 2nd top = the probabilities.

    forward: -sum log(max(prob[label], FLT_MIN)) over non-ignored positions / normalizer;
    backward: (prob - onehot(label)) * loss_weight / normalizer, 0 at ignored positions."""
    exact_num_top = None
    min_top = 1
    max_top = 2

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = lp.ignore_label if lp.HasField("ignore_label") else None
        self.normalization = normalization_mode(self.param)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = checked_axis(self, self.param.softmax_param.axis, len(bottom[0].shape), "softmax axis")
        self.outer_num, self.inner_num = _labels_match(self, bottom, self.axis, "softmax")
        if len(top) >= 2:
            top[1].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        self.softmax_forward(bottom, top)
        loss, count, bad = softmax.loss_forward(self._prob, bottom[1].data, self.axis, self.ignore_label)
        if bad >= 0:
            self.labels(bottom)      # raises the error that names the label
        n = normalizer(self.normalization, self.outer_num, self.inner_num, count)
        top[0].data[...] = loss / self._prob.dtype.type(n)

    def backward(self, top, propagate_down, bottom):
        self.no_backward_into(propagate_down, 1)
        if not propagate_down[0]:
            return
        diff = bottom[0].diff
        count = softmax.loss_backward(self._prob, bottom[1].data, self.axis, self.ignore_label, diff)
        n = normalizer(self.normalization, self.outer_num, self.inner_num, count)
        diff *= self.loss_weight(top) / diff.dtype.type(n)

    # GPU, after softmax_loss_layer.cu: per-position loss and count arrays summed on the device. Caffe reduces
    # them with asum, which returns to the host: the host waits for the GPU in mid-pass. Here the loss stays on
    # the device (channel_sums, then softmax_loss_total; up to SEQUENTIAL_LOSS_MAX_POSITIONS positions, one thread
    # in one launch, where three more launches would cost the host about what the thread's loop costs the GPU), and
    # the labels' check (Caffe has none on the GPU: it reads past the class axis) waits for the net to read the loss
    # (finish_forward_gpu).
    defers_checks = True

    def _fixed_normalizer(self):
        """The normalizer where it does not depend on the labels, else 0 (VALID with an ignore_label)."""
        if self.normalization == LossParameter.VALID and self.ignore_label is not None:
            return 0
        return normalizer(self.normalization, self.outer_num, self.inner_num, self.outer_num * self.inner_num)

    def _device_loss(self, flags, values, positions, pass_name, loss):
        """The sums of flags = [counts | bad] and of flags * values ([loss | 0]) on the device (2 values each,
        kept under the pass's name), then softmax_loss_total into `loss` (a device array of 1) and the pass's
        normalizer, which it returns."""
        dev = select.current()
        sums_a = self.buffer(pass_name + "_sums", 2, device=True)
        sums_ab = self.buffer(pass_name + "_loss_sums", 2, device=True)
        channel_sums.sums(self, flags, values, (1, 2, positions), sums_a, sums_ab)
        norm = self.buffer(pass_name + "_normalizer", 1, device=True)
        dev.launch("softmax_loss_total", 1, sums_a, sums_ab, float(self._fixed_normalizer()), norm, loss)
        return norm

    def forward_gpu(self, bottom, top):
        dev = select.current()
        channels, positions = bottom[0].shape[self.axis], self.outer_num * self.inner_num
        prob = top[1].mutable_gpu_data if len(top) > 1 else self.buffer("prob", bottom[0].count, device=True)
        gpu_softmax(bottom[0].gpu_data, prob, self.outer_num, channels, self.inner_num,
                    self.buffer("scale", positions, device=True))
        self._labels_to_check = (bottom[1], channels)
        if positions <= SEQUENTIAL_LOSS_MAX_POSITIONS and channels:
            # One thread, one launch, Caffe's CPU order; the buffers _device_loss fills ("forward_sums": read by
            # finish_forward_gpu). (It reads channel 0 at an invalid label: there must be one.)
            dev.launch("softmax_loss_sequential", 1, positions, prob, bottom[1].gpu_data, channels, self.inner_num,
                       *ignore_args(self.ignore_label), float(self._fixed_normalizer()),
                       self.buffer("forward_sums", 2, device=True), self.buffer("forward_loss_sums", 2, device=True),
                       self.buffer("forward_normalizer", 1, device=True), top[0].mutable_gpu_data)
            return
        flags = self.buffer("counts_bad", 2 * positions, device=True)           # [counts | bad]
        values = self.buffer("loss_zeros", 2 * positions, device=True, fill=0.0)  # [loss | 0]
        dev.launch("softmax_loss_forward", positions, prob, bottom[1].gpu_data, channels, self.inner_num,
                   *ignore_args(self.ignore_label), values.at(0, positions), flags.at(0, positions),
                   flags.at(positions, positions))
        self._device_loss(flags, values, positions, "forward", top[0].mutable_gpu_data)

    def finish_forward_gpu(self):
        """Raise the CPU path's error for a label outside [0, channels) that the last GPU forward flagged."""
        pending, self._labels_to_check = getattr(self, "_labels_to_check", None), None
        if pending is not None and select.current().to_host(self.buffer("forward_sums", device=True))[1] > 0:
            read_labels(self, pending[0], pending[1], self.ignore_label)

    def backward_gpu(self, top, propagate_down, bottom):
        self.no_backward_into(propagate_down, 1)
        if not propagate_down[0]:
            return
        dev = select.current()
        channels, positions = bottom[0].shape[self.axis], self.outer_num * self.inner_num
        diff = bottom[0].mutable_gpu_diff
        # The probabilities of the forward: top[1] when there is one (Caffe's top[1]->ShareData(prob_)).
        prob = top[1].gpu_data if len(top) > 1 else self.buffer("prob", bottom[0].count, device=True)
        weight = np.float32(top[0].cpu_diff[()])
        fixed = self._fixed_normalizer()
        if fixed:   # Caffe's copy, kernel and scal in one launch, the same bits
            dev.launch("softmax_loss_backward_scaled", positions, prob, bottom[1].gpu_data, channels, self.inner_num,
                       *ignore_args(self.ignore_label), float(weight / np.float32(fixed)), diff)
            return
        dev.copy(diff, prob)
        flags = self.buffer("counts_bad", 2 * positions, device=True)
        dev.launch("softmax_loss_backward", positions, bottom[1].gpu_data, channels, self.inner_num,
                   *ignore_args(self.ignore_label), diff, flags.at(0, positions))
        # the normalizer of the backward's counts (its bad labels, those of the forward: unused)
        values = self.buffer("loss_zeros", 2 * positions, device=True, fill=0.0)
        norm = self._device_loss(flags, values, positions, "backward",
                                 self.buffer("backward_loss", 1, device=True))     # not used
        dev.launch("gpu_scale_by_quotient", bottom[0].count, float(weight), norm, diff)

    def flops(self, bottom, top):
        return SOFTMAX_FLOPS_PER_ELEMENT * bottom[0].count + 2 * self.outer_num * self.inner_num


@register("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(LossLayer):
    """forward: -sum[x (t - (x >= 0)) - log(1 + exp(x - 2x (x >= 0)))] over non-ignored targets / normalizer
    (Caffe's overflow-free form); backward: (sigmoid(x) - t) * loss_weight / normalizer, 0 where ignored."""

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

    def _valid(self, bottom):
        if self.ignore_label is None:
            return None
        return bottom[1].data.reshape(-1).astype(np.int64) != self.ignore_label   # static_cast<int>(target)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(-1)
        t = bottom[1].data.reshape(-1)
        positive = (x >= 0).astype(x.dtype)
        terms = x * (t - positive) - np.log(1 + np.exp(x - 2 * x * positive))
        valid = self._valid(bottom)
        # Caffe subtracts from loss = 0: no valid term gives +0, not -0
        loss = 0 - (terms.sum() if valid is None else terms[valid].sum())
        valid_count = x.size if valid is None else int(valid.sum())
        # Caffe keeps this normalizer_ for the backward pass.
        self._normalizer = normalizer(self.normalization, bottom[0].shape[0], bottom[0].count_range(1), valid_count)
        top[0].data[...] = loss / x.dtype.type(self._normalizer)

    def backward(self, top, propagate_down, bottom):
        self.no_backward_into(propagate_down, 1)
        if not propagate_down[0]:
            return
        x = bottom[0].data
        diff = bottom[0].diff
        # Caffe's SigmoidLayer: 0.5 * tanh(0.5 x) + 0.5, whose double literals make it a double sum rounded once
        # to Dtype (a float32 one loses the small values of very negative x); recomputed rather than kept from
        # the forward
        diff[...] = np.tanh(x.astype(np.float64) * 0.5) * 0.5 + 0.5
        diff -= bottom[1].data.reshape(diff.shape)
        valid = self._valid(bottom)
        if valid is not None:
            np.copyto(diff, 0, where=~valid.reshape(diff.shape))
        diff *= self.loss_weight(top) / x.dtype.type(self._normalizer)

    def forward_gpu(self, bottom, top):
        # sigmoid_cross_entropy_loss_layer.cu: per-element terms and counts on the device, then their sums. The terms
        # are summed by a dot product with ones rather than Caffe's asum: a target outside [0, 1] can make a term
        # positive, and the CPU path sums the signed terms.
        dev = select.current()
        count = bottom[0].count
        terms = self.buffer("terms", count, device=True)
        counts = self.buffer("counts", count, device=True)
        dev.launch("sigmoid_ce_loss_forward", count, bottom[0].gpu_data, bottom[1].gpu_data,
                   *ignore_args(self.ignore_label), terms, counts)
        loss = 0 - np.float32(dev.dot(count, terms, self.buffer("ones", count, fill=1.0, device=True)))
        if self.normalization == LossParameter.VALID and self.ignore_label is not None:
            valid_count = int(round(dev.asum(count, counts)))
        else:
            valid_count = count    # only VALID reads it
        self._normalizer = normalizer(self.normalization, bottom[0].shape[0], bottom[0].count_range(1), valid_count)
        top[0].data[...] = loss / np.float32(self._normalizer)

    def backward_gpu(self, top, propagate_down, bottom):
        self.no_backward_into(propagate_down, 1)
        if not propagate_down[0]:
            return
        scale = np.float32(top[0].cpu_diff[()]) / np.float32(self._normalizer)
        select.current().launch("sigmoid_ce_loss_backward", bottom[0].count, bottom[0].gpu_data, bottom[1].gpu_data,
                                *ignore_args(self.ignore_label), float(scale), bottom[0].mutable_gpu_diff)

    def flops(self, bottom, top):
        # sigmoid (4) for the diff + x * (t - (x >= 0)) - log(1 + exp(x - 2x(x >= 0))) (~6) per element
        return 10 * bottom[0].count


@register("EuclideanLoss")
class EuclideanLossLayer(LossLayer):
    """forward: sum((a - b)^2) / num / 2; backward: +-(a - b) * loss_weight / num into both bottoms."""

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.check(bottom[0].count_range(1) == bottom[1].count_range(1),
                   "Inputs must have the same dimension (%s vs %s)" % (bottom[0].shape, bottom[1].shape))

    def forward(self, bottom, top):
        a = bottom[0].data.reshape(-1)
        self._diff = a - bottom[1].data.reshape(-1)
        dot = np.dot(self._diff, self._diff)
        top[0].data[...] = dot / a.dtype.type(bottom[0].shape[0]) / a.dtype.type(2)

    def backward(self, top, propagate_down, bottom):
        for i, sign in ((0, 1), (1, -1)):
            if propagate_down[i]:
                alpha = sign * self.loss_weight(top) / self._diff.dtype.type(bottom[i].shape[0])
                np.multiply(self._diff, alpha, out=bottom[i].diff.reshape(-1))

    def forward_gpu(self, bottom, top):
        # euclidean_loss_layer.cu: diff_ = a - b on the device, loss = dot(diff_, diff_) / num / 2.
        dev = select.current()
        count = bottom[0].count
        diff = self.buffer("diff", count, device=True)
        dev.launch("gpu_sub", count, bottom[0].gpu_data, bottom[1].gpu_data, diff)
        dot = np.float32(dev.dot(count, diff, diff))
        top[0].data[...] = dot / np.float32(bottom[0].shape[0]) / np.float32(2)

    def backward_gpu(self, top, propagate_down, bottom):
        dev = select.current()
        diff = self.buffer("diff", bottom[0].count, device=True)
        for i, sign in ((0, 1), (1, -1)):
            if propagate_down[i]:
                alpha = sign * np.float32(top[0].cpu_diff[()]) / np.float32(bottom[i].shape[0])
                # Caffe's caffe_gpu_axpby(alpha, diff_, 0, bottom_diff), written as a plain scale: 0 * a stale NaN
                # in the bottom's diff would stay NaN.
                dev.launch("gpu_scale", bottom[i].count, float(alpha), diff, bottom[i].mutable_gpu_diff)

    def allow_force_backward(self, bottom_index):
        # euclidean_loss_layer.hpp: "Unlike most loss layers, in the EuclideanLossLayer we can backpropagate
        # to both inputs".
        return True

    def flops(self, bottom, top):
        return 3 * bottom[0].count     # subtract, then a dot product (multiply-add)


@register("HingeLoss")
class HingeLossLayer(LossLayer):
    """margins m = max(0, 1 - y x) with y = +1 for the true class, -1 otherwise; forward: sum(m) / num (L1) or
    sum(m^2) / num (L2); backward: -y sign(m) (L1) or -2 y m (L2), times loss_weight / num.

    As Caffe, forward leaves the margins in bottom 0's DIFF and backward starts from them (the net does not clear
    diffs between the two)."""

    def layer_setup(self, bottom, top):
        self.norm = self.param.hinge_loss_param.norm

    def _true_class(self, bottom):
        num = bottom[0].shape[0]
        labels, _ = read_labels(self, bottom[1], bottom[0].count_range(1), count=num)
        return np.arange(num), labels

    def forward(self, bottom, top):
        num = bottom[0].shape[0]
        margins = bottom[0].diff.reshape(num, bottom[0].count_range(1))
        np.copyto(margins, bottom[0].data.reshape(margins.shape))
        margins[self._true_class(bottom)] *= -1
        margins += 1
        np.maximum(margins, 0, out=margins)
        flat = margins.reshape(-1)
        if self.norm == caffe_pb2.HingeLossParameter.L1:
            loss = np.abs(flat).sum()
        else:
            loss = np.dot(flat, flat)
        top[0].data[...] = loss / margins.dtype.type(num)

    def backward(self, top, propagate_down, bottom):
        self.no_backward_into(propagate_down, 1)
        if not propagate_down[0]:
            return
        num = bottom[0].shape[0]
        diff = bottom[0].diff.reshape(num, bottom[0].count_range(1))
        diff[self._true_class(bottom)] *= -1
        scale = self.loss_weight(top) / diff.dtype.type(num)
        if self.norm == caffe_pb2.HingeLossParameter.L1:
            np.sign(diff, out=diff)
        else:
            scale *= 2
        diff *= scale

    def flops(self, bottom, top):
        # negate the true class, 1 + x, max(0, .), then sum (L1) or sum of squares (L2)
        return (4 if self.norm == caffe_pb2.HingeLossParameter.L1 else 5) * bottom[0].count


@register("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    """Bottoms: a (N, C, 1, 1), b (N, C, 1, 1), similarity y (N, 1, 1, 1) (contrastive_loss_layer.cpp).

    forward: sum over pairs of d^2 (similar) or max(margin - d, 0)^2 (dissimilar; legacy: max(margin - d^2, 0)),
    / N / 2; backward into a and b (opposite signs), nothing into y (Caffe ignores propagate_down[2]).
    GPU code: contrastive_loss_layer.cu's, with csrc/cuda/loss.cu's kernels (its legacy gradient as the CPU code's:
    docs/differences.md)."""
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

    def forward(self, bottom, top):
        num, dim = bottom[0].shape[0], bottom[0].count_range(1)
        self._diff = bottom[0].data.reshape(num, dim) - bottom[1].data.reshape(num, dim)
        self._dist_sq = np.einsum("ij,ij->i", self._diff, self._diff)
        self._similar = bottom[2].data.reshape(-1)[:num].astype(np.int64) != 0   # static_cast<int>(y)
        dtype = self._diff.dtype.type
        margin = dtype(self.margin)
        if self.legacy_version:
            dissimilar = np.maximum(margin - self._dist_sq, 0)
        else:
            dissimilar = np.maximum(margin - np.sqrt(self._dist_sq), 0) ** 2
        loss = np.where(self._similar, self._dist_sq, dissimilar).sum()
        top[0].data[...] = loss / dtype(num) / dtype(2)

    def backward(self, top, propagate_down, bottom):
        num = bottom[0].shape[0]
        dtype = self._diff.dtype.type
        margin = dtype(self.margin)
        for i, sign in ((0, 1), (1, -1)):
            if not propagate_down[i]:
                continue
            alpha = sign * self.loss_weight(top) / dtype(num)
            if self.legacy_version:
                mdist = margin - self._dist_sq
                beta = np.full_like(mdist, -alpha)
            else:
                dist = np.sqrt(self._dist_sq)
                mdist = margin - dist
                beta = -alpha * mdist / (dist + dtype(1e-4))   # Caffe's epsilon against d = 0
            coeff = np.where(self._similar, alpha, np.where(mdist > 0, beta, 0))
            np.multiply(self._diff, coeff[:, None], out=bottom[i].diff.reshape(self._diff.shape))

    def forward_gpu(self, bottom, top):
        # contrastive_loss_layer.cu: diff_ = a - b and the squared distances on the device; the per-pair loss terms
        # are summed there too, so only the loss comes to the host (Caffe reads dist_sq_ back and sums on the host).
        dev = select.current()
        num, count = bottom[0].shape[0], bottom[0].count
        diff = self.buffer("diff", count, device=True)
        pairs = self.buffer("pairs", 2 * num, device=True, at_least=True)    # dist_sq_, then the loss terms
        dev.launch("gpu_sub", count, bottom[0].gpu_data, bottom[1].gpu_data, diff)
        dev.launch("contrastive_loss_forward", num, count // max(num, 1), diff, bottom[2].gpu_data,
                   float(np.float32(self.margin)), int(self.legacy_version), pairs.at(0, num), pairs.at(num, num))
        loss = np.float32(dev.asum(num, pairs.at(num, num)) if num else 0)    # every term is >= 0
        top[0].data[...] = loss / np.float32(num) / np.float32(2)

    def backward_gpu(self, top, propagate_down, bottom):
        dev = select.current()
        num, count = bottom[0].shape[0], bottom[0].count
        diff = self.buffer("diff", count, device=True)
        dist_sq = self.buffer("pairs", 2 * num, device=True, at_least=True).at(0, num)
        for i, sign in ((0, 1), (1, -1)):
            if propagate_down[i]:
                alpha = sign * np.float32(top[0].cpu_diff[()]) / np.float32(num)
                dev.launch("contrastive_loss_backward", count, count // max(num, 1), float(np.float32(self.margin)),
                           int(self.legacy_version), float(alpha), bottom[2].gpu_data, diff, dist_sq,
                           bottom[i].mutable_gpu_diff)

    def allow_force_backward(self, bottom_index):
        # contrastive_loss_layer.hpp: both feature bottoms get a gradient, the similarity label does not.
        return bottom_index != 2

    def flops(self, bottom, top):
        # a - b, squared distance (multiply-add), and a few ops per pair for the margin term
        return 3 * bottom[0].count + 5 * bottom[0].num


@register("InfogainLoss")
class InfogainLossLayer(_SoftmaxLossBase):
    """Softmax over infogain_loss_param.axis, then -sum_l H[label, l] * log(max(prob_l, 1e-20)) (this Caffe version
    applies the softmax inside, infogain_loss_layer.cpp). H comes from bottom 2 or from the BlobProto file
    infogain_loss_param.source; optional 2nd top = the probabilities.
    backward: (prob * sum_l H[label, l] - H[label, :]) * loss_weight / normalizer, 0 at ignored positions."""
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
        self._file_h = None
        if len(bottom) < 3:
            # Reading H from the file belongs to the forward pass's work (building a net to see its shapes reads
            # no data); here only check that one is named.
            self.check(self.param.infogain_loss_param.HasField("source"),
                       "Infogain matrix source must be specified.")

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = checked_axis(self, self.param.infogain_loss_param.axis, len(bottom[0].shape), "infogain axis")
        self.outer_num, self.inner_num = _labels_match(self, bottom, self.axis, "infogain")
        self.num_labels = bottom[0].shape[self.axis]
        if len(bottom) > 2:
            self._check_h(bottom[2].count)
        if len(top) >= 2:
            top[1].reshape(bottom[0].shape)

    def _check_h(self, count):
        self.check(count == self.num_labels ** 2,
                   "InfogainLoss expects the infogain matrix H to be num_labels x num_labels (%d x %d), got %d "
                   "values" % (self.num_labels, self.num_labels, count))

    def _infogain(self, bottom):
        if len(bottom) > 2:
            h = bottom[2].data
        else:
            if self._file_h is None:
                self._file_h = read_blob_file(self.param.infogain_loss_param.source)
            h = self._file_h
            self._check_h(h.size)
        return h.reshape(self.num_labels, self.num_labels).astype(bottom[0].dtype, copy=False)

    def forward(self, bottom, top):
        prob = self.softmax_forward(bottom, top)
        labels, valid = self.labels(bottom)
        h_rows = self._infogain(bottom)[labels]                                  # (outer, inner, labels)
        log_prob = np.log(np.maximum(prob, prob.dtype.type(LOG_THRESHOLD)))     # (outer, labels, inner)
        per_position = np.einsum("ilj,ijl->ij", log_prob, h_rows)
        loss = 0 - per_position[valid].sum(dtype=prob.dtype)     # +0 when every label is ignored, as Caffe
        n = normalizer(self.normalization, self.outer_num, self.inner_num, int(valid.sum()))
        top[0].data[...] = loss / prob.dtype.type(n)

    def backward(self, top, propagate_down, bottom):
        self.no_backward_into(propagate_down, 1)
        self.no_backward_into(propagate_down, 2, what="infogain")
        if not propagate_down[0]:
            return
        labels, valid = self.labels(bottom)
        h = self._infogain(bottom)
        diff = bottom[0].diff.reshape(self.outer_num, self.num_labels, self.inner_num)
        np.multiply(self._prob.reshape(diff.shape), h.sum(axis=1)[labels][:, None, :], out=diff)
        diff -= h[labels].transpose(0, 2, 1)
        self.scaled_diff(top, valid, diff)

    def allow_force_backward(self, bottom_index):
        # infogain_loss_layer.cpp Backward: "cannot backpropagate to label inputs" nor "to infogain inputs".
        return bottom_index == 0

    def flops(self, bottom, top):
        # softmax, then per label position a log and a multiply-add per class
        return SOFTMAX_FLOPS_PER_ELEMENT * bottom[0].count + 3 * bottom[0].count


@register("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(LossLayer):
    """Bottoms: probabilities (N, C, ...) and labels (N, 1, 1, 1) (multinomial_logistic_loss_layer.cpp).
    forward: -sum log(max(p[label], 1e-20)) / N; backward: -loss_weight / N / max(p[label], 1e-20) at the label,
    0 elsewhere."""

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        label = bottom[1]
        self.check(label.channels == 1 and label.height == 1 and label.width == 1,
                   "the label bottom must have channels, height and width 1, got %s" % (label.shape,))

    def _picked(self, bottom):
        num = bottom[0].shape[0]
        x = bottom[0].data.reshape(num, bottom[0].count_range(1))
        labels, _ = read_labels(self, bottom[1], x.shape[1], count=num)
        rows = np.arange(num)
        return rows, labels, np.maximum(x[rows, labels], x.dtype.type(LOG_THRESHOLD))

    def forward(self, bottom, top):
        _, _, prob = self._picked(bottom)
        top[0].data[...] = -np.log(prob).sum() / prob.dtype.type(bottom[0].shape[0])

    def backward(self, top, propagate_down, bottom):
        self.no_backward_into(propagate_down, 1)
        if not propagate_down[0]:
            return
        rows, labels, prob = self._picked(bottom)
        diff = bottom[0].diff.reshape(rows.size, bottom[0].count_range(1))
        diff[...] = 0
        diff[rows, labels] = -self.loss_weight(top) / prob.dtype.type(rows.size) / prob

    def flops(self, bottom, top):
        return 3 * bottom[0].num     # max(p, threshold), log, sum


@register("Accuracy")
class AccuracyLayer(Layer):
    """Top-k accuracy over accuracy_param.axis; optional 2nd top = per-class accuracy (accuracy_layer.cpp).

    A position is correct when fewer than top_k scores are >= the true class's score other than itself: ties
    count against it, as in Caffe. Ignored positions count neither way; no valid position gives 0."""
    reshape_from_shapes = True
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
        self.axis = checked_axis(self, self.param.accuracy_param.axis, len(bottom[0].shape), "accuracy axis")
        self.outer_num = bottom[0].count_range(0, self.axis)
        self.inner_num = bottom[0].count_range(self.axis + 1)
        self.check(self.outer_num * self.inner_num == bottom[1].count,
                   "Number of labels must match number of predictions; e.g., if label axis == 1 and prediction "
                   "shape is (N, C, H, W), label count (number of labels) must be N*H*W, with integer values in "
                   "{0, 1, ..., C-1} (predictions %s, labels %s)" % (bottom[0].shape, bottom[1].shape))
        top[0].reshape(())                                  # Accuracy is a scalar; 0 axes.
        if len(top) > 1:
            top[1].reshape((bottom[0].shape[self.axis],))   # per-class accuracy: (num_labels,)

    def forward(self, bottom, top):
        num_labels = bottom[0].shape[self.axis]
        scores = bottom[0].data.reshape(self.outer_num, num_labels, self.inner_num)
        labels, valid = read_labels(self, bottom[1], num_labels, self.ignore_label)
        labels = labels.reshape(self.outer_num, self.inner_num)
        valid = valid.reshape(self.outer_num, self.inner_num)
        true_score = np.take_along_axis(scores, labels[:, None, :], axis=1)
        # The true class is among the scores >= its own (Caffe starts its count at -1); NaN compares false.
        better = np.count_nonzero(scores >= true_score, axis=1) - 1
        correct = valid & (better < self.top_k)
        dtype = scores.dtype.type
        count = int(valid.sum())
        top[0].data[...] = 0 if count == 0 else dtype(correct.sum()) / dtype(count)
        if len(top) > 1:
            per_label = np.bincount(labels[valid], minlength=num_labels).astype(scores.dtype)
            hits = np.bincount(labels[correct], minlength=num_labels).astype(scores.dtype)
            top[1].data[...] = 0    # classes without a valid position
            np.divide(hits, per_label, out=top[1].data, where=per_label > 0)

    def forward_gpu(self, bottom, top):
        # accuracy_layer.cu: a 0/1 hit and a 0/1 count per label position, summed on the device. The per-class
        # tallies use AccuracyForwardWithPerClassGPU's layout (class-major, one row of positions per class), whose
        # row sums one GEMV against ones gives at once instead of Caffe's two asums per class.
        dev = select.current()
        num_labels = bottom[0].shape[self.axis]
        positions = self.outer_num * self.inner_num
        correct = self.buffer("correct", positions, device=True)
        counts = self.buffer("counts", positions, device=True)
        bad = self.buffer("bad", positions, device=True)
        labels = bottom[1].gpu_data
        dev.launch("accuracy_forward", positions, bottom[0].gpu_data, labels, num_labels, self.inner_num, self.top_k,
                   *ignore_args(self.ignore_label), correct, counts, bad)
        refuse_bad_labels(self, dev, bad, bottom[1], num_labels, self.ignore_label)
        hits, count = np.float32(dev.asum(positions, correct)), np.float32(dev.asum(positions, counts))
        top[0].data[...] = 0 if count == 0 else hits / count
        if len(top) > 1:
            tallies = self.buffer("tallies", 2 * num_labels * positions, device=True)   # hits rows, then seen rows
            n = num_labels * positions
            dev.launch("accuracy_per_class", n, labels, correct, counts, positions, tallies.at(0, n), tallies.at(n, n))
            sums = self.buffer("class_sums", 2 * num_labels, device=True)
            dev.gemv(False, 2 * num_labels, positions, 1.0, tallies,
                     self.buffer("ones", positions, fill=1.0, device=True), 0.0, sums)
            class_hits, per_label = np.split(dev.to_host(sums), 2)
            top[1].data[...] = 0    # classes without a valid position
            np.divide(class_hits, per_label, out=top[1].data, where=per_label > 0)

    def backward(self, top, propagate_down, bottom):
        self.check(not any(propagate_down), "Accuracy has no backward (Caffe: Not Implemented Yet)")

    def flops(self, bottom, top):
        # a partial sort of the class scores at each position: about one comparison per score and per k
        return bottom[0].count * self.top_k
