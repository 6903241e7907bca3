"""Element-wise neuron layers: ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, BNLL, Power, Exp, Log, Threshold, Dropout, Clip, Swish.

All share Caffe's NeuronLayer (include/caffe/layers/neuron_layer.hpp): one bottom, one top of the bottom's shape,
in-place computation allowed unless a layer says otherwise.
"""
from ..proto import caffe_pb2
from .base import Layer
from .registry import register


class NeuronLayer(Layer):
    """Caffe's NeuronLayer: exactly 1 bottom and 1 top, top shaped like the bottom (neuron_layer.cpp)."""
    exact_num_bottom = 1
    exact_num_top = 1
    flops_per_element = 1        # forward floating-point operations per element (a multiply-add is 2)
    allow_in_place = True

    def layer_setup(self, bottom, top):
        if not self.allow_in_place:
            self.check(top[0] is not bottom[0], "%s Layer does not allow in-place computation" % self.param.type)
        self.neuron_setup(bottom, top)

    def neuron_setup(self, bottom, top):
        """Read the layer's parameters (subclasses)."""

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def flops(self, bottom, top):
        return self.flops_per_element * bottom[0].count


@register("ReLU")
class ReLULayer(NeuronLayer):
    def neuron_setup(self, bottom, top):
        self.negative_slope = self.param.relu_param.negative_slope

    def flops(self, bottom, top):
        # max(x, 0) is 1 op; leaky adds negative_slope * min(x, 0) (a multiply-add)
        return bottom[0].count * (3 if self.negative_slope else 1)


@register("PReLU")
class PReLULayer(NeuronLayer):
    flops_per_element = 3        # max(x,0) + a * min(x,0)

    def neuron_setup(self, bottom, top):
        # prelu_layer.cpp LayerSetUp
        p = self.param.prelu_param
        self.check(len(bottom[0].shape) >= 2, "Number of axes of bottom blob must be >=2.")
        # Caffe reads bottom->channels(), a legacy accessor that CHECK-fails beyond 4 axes.
        self.check(len(bottom[0].shape) <= 4, "bottom has %d axes; PReLU reads its legacy channel count, which "
                   "Caffe only allows for blobs of at most 4 axes" % len(bottom[0].shape))
        channels = bottom[0].channels
        self.channel_shared = p.channel_shared
        if not self.blobs:
            # Caffe: a channel-shared slope is a scalar blob with 0 axes; otherwise one slope per channel.
            shape = () if self.channel_shared else (channels,)
            if p.HasField("filler"):
                filler = p.filler
            else:
                filler = caffe_pb2.FillerParameter(type="constant", value=0.25)
            self.blobs = [self.make_param(shape, filler)]
        if self.channel_shared:
            self.check(self.blobs[0].count == 1, "Negative slope size is inconsistent with prototxt config")
        else:
            self.check(self.blobs[0].count == channels, "Negative slope size is inconsistent with prototxt config")

    def reshape(self, bottom, top):
        self.check(len(bottom[0].shape) >= 2, "Number of axes of bottom blob must be >=2.")
        top[0].reshape(bottom[0].shape)


@register("ELU")
class ELULayer(NeuronLayer):
    flops_per_element = 4        # compare, exp, -1, * alpha

    def neuron_setup(self, bottom, top):
        self.alpha = self.param.elu_param.alpha


@register("Sigmoid")
class SigmoidLayer(NeuronLayer):
    flops_per_element = 4        # 0.5 * tanh(0.5 x) + 0.5 (Caffe's form): mul, tanh, multiply-add


@register("TanH")
class TanHLayer(NeuronLayer):
    flops_per_element = 1


@register("AbsVal")
class AbsValLayer(NeuronLayer):
    allow_in_place = False       # absval_layer.cpp: CHECK_NE(top[0], bottom[0])


@register("BNLL")
class BNLLLayer(NeuronLayer):
    flops_per_element = 4        # x + log(1 + exp(-x)) or log(1 + exp(x))


@register("Power")
class PowerLayer(NeuronLayer):
    """y = (shift + scale * x) ^ power (power_layer.cpp)."""

    def neuron_setup(self, bottom, top):
        p = self.param.power_param
        self.power, self.scale, self.shift = p.power, p.scale, p.shift
        self.diff_scale = self.power * self.scale

    def flops(self, bottom, top):
        if self.diff_scale == 0:     # Caffe fills a constant: (shift)^power or 1
            return 0
        ops = 0
        if self.scale != 1:
            ops += 1
        if self.shift != 0:
            ops += 1
        if self.power != 1:
            ops += 1
        return ops * bottom[0].count


@register("Exp")
class ExpLayer(NeuronLayer):
    """y = base ^ (shift + scale * x); base -1 means e (exp_layer.cpp)."""
    flops_per_element = 3        # multiply-add of the input, exp

    def neuron_setup(self, bottom, top):
        p = self.param.exp_param
        if p.base != -1:
            self.check(p.base > 0, "base must be strictly positive.")
        self.base, self.scale, self.shift = p.base, p.scale, p.shift


@register("Log")
class LogLayer(NeuronLayer):
    """y = log_base(shift + scale * x); base -1 means e (log_layer.cpp)."""
    flops_per_element = 3

    def neuron_setup(self, bottom, top):
        p = self.param.log_param
        if p.base != -1:
            self.check(p.base > 0, "base must be strictly positive.")
        self.base, self.scale, self.shift = p.base, p.scale, p.shift


@register("Threshold")
class ThresholdLayer(NeuronLayer):
    has_backward = False         # threshold_layer.hpp: Backward_cpu is NOT_IMPLEMENTED

    def neuron_setup(self, bottom, top):
        self.threshold = self.param.threshold_param.threshold


@register("Dropout")
class DropoutLayer(NeuronLayer):
    def neuron_setup(self, bottom, top):
        ratio = self.param.dropout_param.dropout_ratio
        # dropout_layer.cpp DCHECKs 0 < ratio < 1 (off in release builds); ratio 1 would scale by 1/0.
        self.check(0.0 <= ratio < 1.0, "dropout_ratio must be in [0, 1), got %g" % ratio)
        self.threshold = ratio
        self.scale = 1.0 / (1.0 - ratio)

    def flops(self, bottom, top):
        # TRAIN: draw the mask, compare, multiply; TEST: a copy.
        return 2 * bottom[0].count if self.phase == caffe_pb2.TRAIN else 0


@register("Clip")
class ClipLayer(NeuronLayer):
    flops_per_element = 2        # max(min, min(x, max))

    def neuron_setup(self, bottom, top):
        p = self.param.clip_param
        # ClipParameter.min and .max are `required` in caffe.proto: Caffe refuses a net without them.
        self.check(p.HasField("min") and p.HasField("max"), "clip_param needs both min and max (required fields)")
        self.min, self.max = p.min, p.max


@register("Swish")
class SwishLayer(NeuronLayer):
    """y = x * sigmoid(beta * x) (swish_layer.cpp)."""
    flops_per_element = 6        # beta * x, sigmoid (4), * x

    def neuron_setup(self, bottom, top):
        self.beta = self.param.swish_param.beta
