"""Element-wise neuron layers: ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, BNLL, Power, Exp, Log, Threshold, Dropout, Clip, Swish.

All share Caffe's NeuronLayer (include/caffe/layers/neuron_layer.hpp): one bottom, one top of the bottom's shape,
in-place computation allowed unless a layer says otherwise. The math is in pycaffe_dist/backend/neuron.py.

In place, the forward overwrites the bottom. Caffe's PReLU keeps a copy of it for the backward; its other layers
read the overwritten values, which is harmless where the backward needs only the top or the sign of x (ReLU with
slope >= 0, ELU with alpha >= 0, Sigmoid, TanH, Swish, Exp, Dropout) and wrong elsewhere. Here every layer whose
backward needs x keeps a copy when computing in place (`backward_needs_bottom`), so in place and not in place
give the same gradients: a deliberate difference from Caffe for in-place BNLL, Log, Clip, Power, ReLU with a
negative slope and ELU with a negative alpha.

GPU code: each layer gives `compute_gpu(dev, x, y)` and `gradient_gpu(dev, x, y, dy, dx)` over flat DeviceArrays,
the kernels of csrc/cuda/neuron.cu (after Caffe's *_layer.cu), computing what the CPU code computes in its order.
"""
import math

import numpy as np

from ..backend import neuron, select
from ..proto import caffe_pb2
from ..random_stream import RandomStream
from . import cudnn_engine
from .base import Layer
from .registry import register


class NeuronLayer(Layer):
    """Caffe's NeuronLayer: exactly 1 bottom and 1 top, top shaped like the bottom (neuron_layer.cpp).

    Subclasses give `compute(x, y)` (the forward, y = top data) and `gradient(x, y, dy, dx)` (the bottom diff)."""
    reshape_from_shapes = True
    exact_num_bottom = 1
    exact_num_top = 1
    flops_per_element = 1        # forward floating-point operations per element (a multiply-add is 2)
    allow_in_place = True
    backward_needs_bottom = False   # the backward reads x: in place, the forward first keeps a copy of it

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # GPU code is inherited only with the CPU code it mirrors: a subclass that redefines its CPU math but not
        # its GPU math runs on the CPU (as Caffe's Forward_gpu falls back to Forward_cpu).
        own = cls.__dict__
        if ("compute" in own and "compute_gpu" not in own) or ("forward" in own and "forward_gpu" not in own):
            cls.forward_gpu = None
        if ("gradient" in own and "gradient_gpu" not in own) or ("backward" in own and "backward_gpu" not in own):
            cls.backward_gpu = None

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

    def forward(self, bottom, top):
        x = bottom[0].data
        if top[0] is bottom[0] and self.backward_needs_bottom:
            np.copyto(self.buffer("bottom", x.shape, x.dtype), x)
        self.compute(x, top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.gradient(self.bottom_data(bottom, top), top[0].data, top[0].diff, bottom[0].diff)

    def bottom_data(self, bottom, top):
        """x as the forward saw it: its copy when computing in place (if the backward needs x), else the data."""
        if top[0] is bottom[0] and self.backward_needs_bottom:
            return self.buffer("bottom")
        return bottom[0].data

    def compute(self, x, y):
        raise NotImplementedError

    def gradient(self, x, y, dy, dx):
        raise NotImplementedError

    # --- GPU ----------------------------------------------------------------------------------------------------
    def forward_gpu(self, bottom, top):
        dev = select.current()
        x = bottom[0].gpu_data
        if top[0] is bottom[0] and self.backward_needs_bottom:
            dev.copy(self.buffer("bottom", x.size, device=True), x)
        self.compute_gpu(dev, x, top[0].mutable_gpu_data)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            dev = select.current()
            x = self.gpu_bottom_data(bottom, top)
            self.gradient_gpu(dev, x, top[0].gpu_data, top[0].gpu_diff, bottom[0].mutable_gpu_diff)

    def gpu_bottom_data(self, bottom, top):
        """bottom_data's device twin: x as the forward saw it."""
        if top[0] is bottom[0] and self.backward_needs_bottom:
            return self.buffer("bottom", device=True)
        return bottom[0].gpu_data

    compute_gpu = None       # (dev, x, y): the forward over flat device arrays
    gradient_gpu = None      # (dev, x, y, dy, dx): the bottom diff


class CudnnActivation:
    """ReLU, Sigmoid and TanH: Caffe's engine CUDNN (layers/cudnn_engine.py), else their own GPU code."""

    def forward_gpu(self, bottom, top):
        if not cudnn_engine.neuron_forward(self, bottom, top):
            super().forward_gpu(bottom, top)

    def backward_gpu(self, top, propagate_down, bottom):
        if not cudnn_engine.neuron_backward(self, top, propagate_down, bottom):
            super().backward_gpu(top, propagate_down, bottom)


@register("ReLU")
class ReLULayer(CudnnActivation, NeuronLayer):
    def neuron_setup(self, bottom, top):
        self.negative_slope = self.param.relu_param.negative_slope
        # y > 0 exactly where x > 0 unless the slope is negative
        self.backward_needs_bottom = self.negative_slope < 0

    def flops(self, bottom, top):
        # max(x, 0) is 1 op; leaky adds negative_slope * min(x, 0) (a multiply-add)
        return bottom[0].count * (3 if self.negative_slope else 1)

    def compute(self, x, y):
        neuron.relu_forward(x, y, self.negative_slope)

    def gradient(self, x, y, dy, dx):
        neuron.relu_backward(x, dy, dx, self.negative_slope)

    def compute_gpu(self, dev, x, y):
        dev.launch("relu_forward", x.size, x, self.negative_slope, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("relu_backward", x.size, x, dy, self.negative_slope, dx)


@register("PReLU")
class PReLULayer(NeuronLayer):
    flops_per_element = 3        # max(x,0) + a * min(x,0)
    backward_needs_bottom = True     # Caffe's bottom_memory_

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
        self.channels, self.dim = bottom[0].channels, bottom[0].count_range(2)

    def compute(self, x, y):
        neuron.prelu_forward(x, y, self.blobs[0].data, self.channels, self.dim)

    def backward(self, top, propagate_down, bottom):
        x, dy = self.bottom_data(bottom, top), top[0].diff
        # The slope's gradient first: in place, the bottom diff overwrites the top diff (as in Caffe).
        if self.param_propagate_down[0]:
            neuron.prelu_slope_backward(x, dy, self.blobs[0].diff, self.channels, self.dim,
                                        self.buffer("min_x", x.shape, x.dtype))
        if propagate_down[0]:
            neuron.prelu_backward(x, dy, self.blobs[0].data, bottom[0].diff, self.channels, self.dim)

    def _div_factor(self):
        # prelu_layer.cu: one shared slope for every channel (a single value, as the CPU kernel decides)
        return self.channels if self.blobs[0].count == 1 else 1

    def compute_gpu(self, dev, x, y):
        dev.launch("prelu_forward", x.size, self.channels, self.dim, self._div_factor(), x, self.blobs[0].gpu_data, y)

    def backward_gpu(self, top, propagate_down, bottom):
        # prelu_layer.cu Backward_gpu: the slope's gradient first (in place, the bottom diff overwrites the top diff)
        dev = select.current()
        x, dy, n = self.gpu_bottom_data(bottom, top), top[0].gpu_diff, bottom[0].count
        slope = self.blobs[0]
        if self.param_propagate_down[0] and n:
            cdim = self.channels * self.dim
            per_position = self.buffer("slope_work", cdim, device=True)
            dev.launch("prelu_param_backward", cdim, n // cdim, x, dy, per_position)
            # slope diff (one value, or one per channel) += the per-position sums summed over each slope's positions
            width = cdim // slope.count
            dev.gemv(False, slope.count, width, 1.0, per_position, self.buffer("ones", width, fill=1.0, device=True),
                     1.0, slope.mutable_gpu_diff)
        if propagate_down[0]:
            dev.launch("prelu_backward", n, self.channels, self.dim, self._div_factor(), x, dy, slope.gpu_data,
                       bottom[0].mutable_gpu_diff)


@register("ELU")
class ELULayer(NeuronLayer):
    flops_per_element = 4        # compare, exp, -1, * alpha

    def neuron_setup(self, bottom, top):
        self.alpha = self.param.elu_param.alpha
        # y > 0 exactly where x > 0 unless alpha is negative
        self.backward_needs_bottom = self.alpha < 0

    def compute(self, x, y):
        neuron.elu_forward(x, y, self.alpha, self.buffer("exp", x.shape, x.dtype))

    def gradient(self, x, y, dy, dx):
        neuron.elu_backward(x, y, dy, dx, self.alpha)

    def compute_gpu(self, dev, x, y):
        dev.launch("elu_forward", x.size, x, self.alpha, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("elu_backward", x.size, x, y, dy, self.alpha, dx)


@register("Sigmoid")
class SigmoidLayer(CudnnActivation, NeuronLayer):
    flops_per_element = 4        # 0.5 * tanh(0.5 x) + 0.5 (Caffe's form): mul, tanh, multiply-add

    def compute(self, x, y):
        neuron.sigmoid_forward(x, y)

    def gradient(self, x, y, dy, dx):
        neuron.sigmoid_backward(y, dy, dx)

    def compute_gpu(self, dev, x, y):
        dev.launch("sigmoid_forward", x.size, x, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("sigmoid_backward", y.size, y, dy, dx)


@register("TanH")
class TanHLayer(CudnnActivation, NeuronLayer):
    flops_per_element = 1

    def compute(self, x, y):
        neuron.tanh_forward(x, y)

    def gradient(self, x, y, dy, dx):
        neuron.tanh_backward(y, dy, dx)

    def compute_gpu(self, dev, x, y):
        dev.launch("tanh_forward", x.size, x, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("tanh_backward", y.size, y, dy, dx)


@register("AbsVal")
class AbsValLayer(NeuronLayer):
    allow_in_place = False       # absval_layer.cpp: CHECK_NE(top[0], bottom[0])

    def compute(self, x, y):
        neuron.absval_forward(x, y)

    def gradient(self, x, y, dy, dx):
        neuron.absval_backward(x, dy, dx)

    def compute_gpu(self, dev, x, y):
        dev.launch("gpu_abs", x.size, x, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("absval_backward", x.size, x, dy, dx)


@register("BNLL")
class BNLLLayer(NeuronLayer):
    flops_per_element = 4        # x + log(1 + exp(-x)) or log(1 + exp(x))
    backward_needs_bottom = True

    def compute(self, x, y):
        neuron.bnll_forward(x, y, self.buffer("exp", x.shape, x.dtype), self.buffer("log", x.shape, x.dtype))

    def gradient(self, x, y, dy, dx):
        neuron.bnll_backward(x, dy, dx, self.buffer("exp", x.shape, x.dtype))

    def compute_gpu(self, dev, x, y):
        dev.launch("bnll_forward", x.size, x, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("bnll_backward", x.size, x, dy, dx)


@register("Power")
class PowerLayer(NeuronLayer):
    """y = (shift + scale * x) ^ power (power_layer.cpp)."""

    def neuron_setup(self, bottom, top):
        p = self.param.power_param
        self.power, self.scale, self.shift = p.power, p.scale, p.shift
        self.diff_scale = self.power * self.scale
        # power 1 and diff_scale 0 have constant derivatives
        self.backward_needs_bottom = self.diff_scale != 0 and self.power != 1

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

    def compute(self, x, y):
        neuron.power_forward(x, y, self.power, self.scale, self.shift)

    def gradient(self, x, y, dy, dx):
        neuron.power_backward(x, y, dy, dx, self.power, self.scale, self.shift)

    def compute_gpu(self, dev, x, y):
        if self.diff_scale == 0:
            # the input does not matter: 1 (power 0) or shift ^ power, as power_forward on the CPU
            dev.fill(y, np.power(np.float32(self.shift), np.float32(self.power)) if self.power != 0 else 1.0)
        else:
            dev.launch("power_forward", x.size, x, self.power, self.scale, self.shift, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        if self.diff_scale == 0:
            dev.memset(dx, 0)
        elif self.power == 1:
            dev.launch("gpu_scale", dy.size, self.diff_scale, dy, dx)
        else:
            dev.launch("power_backward", x.size, x, y, dy, self.power, self.scale, self.shift, dx)


def _log_base(layer, base):
    """Caffe's log_base of Exp and Log: 1 for base -1 (meaning e), else log(base), which must be finite."""
    if base == -1:
        return 1.0
    layer.check(base > 0, "base must be strictly positive.")
    log_base = math.log(base)
    layer.check(math.isfinite(log_base), "Inf result: log(base) = log(%g) = %g" % (base, log_base))
    return log_base


@register("Exp")
class ExpLayer(NeuronLayer):
    """y = base ^ (shift + scale * x); base -1 means e (exp_layer.cpp)."""
    flops_per_element = 3        # multiply-add of the input, exp

    def neuron_setup(self, bottom, top):
        p = self.param.exp_param
        self.base, self.scale, self.shift = p.base, p.scale, p.shift
        # Caffe: y = outer_scale * exp(inner_scale * x)
        self.inner_scale = _log_base(self, p.base) * p.scale
        if p.shift == 0:
            self.outer_scale = 1.0
        else:   # numpy's power overflows to inf, as Caffe's pow does, where Python's would raise
            self.outer_scale = float(np.exp(p.shift) if p.base == -1 else np.power(p.base, p.shift))

    def compute(self, x, y):
        neuron.exp_forward(x, y, self.inner_scale, self.outer_scale)

    def gradient(self, x, y, dy, dx):
        neuron.exp_backward(y, dy, dx, self.inner_scale)

    def compute_gpu(self, dev, x, y):
        dev.launch("exp_forward", x.size, x, self.inner_scale, self.outer_scale, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("exp_backward", y.size, y, dy, self.inner_scale, dx)


@register("Log")
class LogLayer(NeuronLayer):
    """y = log_base(shift + scale * x); base -1 means e (log_layer.cpp)."""
    flops_per_element = 3
    backward_needs_bottom = True

    def neuron_setup(self, bottom, top):
        p = self.param.log_param
        self.base, self.scale, self.shift = p.base, p.scale, p.shift
        log_base = _log_base(self, p.base)
        self.check(log_base != 0, "Inf result: 1/log(base) = 1/log(%g) = inf" % p.base)
        self.base_scale = 1.0 / log_base
        self.backward_numerator = p.scale / log_base     # Caffe's backward_num_scale_

    def compute(self, x, y):
        neuron.log_forward(x, y, self.scale, self.shift, self.base_scale)

    def gradient(self, x, y, dy, dx):
        neuron.log_backward(x, dy, dx, self.scale, self.shift, self.backward_numerator)

    def compute_gpu(self, dev, x, y):
        dev.launch("log_forward", x.size, x, self.scale, self.shift, self.base_scale, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("log_backward", x.size, x, dy, self.scale, self.shift, self.backward_numerator, dx)


@register("Threshold")
class ThresholdLayer(NeuronLayer):
    has_backward = False         # threshold_layer.hpp: Backward_cpu is NOT_IMPLEMENTED

    def neuron_setup(self, bottom, top):
        self.threshold = self.param.threshold_param.threshold

    def compute(self, x, y):
        neuron.threshold_forward(x, y, self.threshold)

    def compute_gpu(self, dev, x, y):
        dev.launch("threshold_forward", x.size, x, self.threshold, y)

    def backward(self, top, propagate_down, bottom):
        raise self.error("Threshold has no backward (Caffe: NOT_IMPLEMENTED)")


@register("Dropout")
class DropoutLayer(NeuronLayer):
    """TRAIN: y = x * mask / (1 - ratio), mask ~ Bernoulli(1 - ratio) drawn at every forward and reused by the
    backward. TEST: y = x (dropout_layer.cpp; BVLC Caffe has no scale_train option).

    The mask is `uniform < 1 - ratio` over float32 uniforms from the layer's own counter-based stream
    (random_stream.py: numpy's Philox, keyed by the seed and the layer's name): the CPU code draws them with numpy,
    the GPU code inside its kernel (csrc/cuda/random.cu dropout_philox_forward), the same numbers for the same
    seed, with nothing uploaded. Both keep the draws (Caffe's rand_vec_) for the backward."""

    def neuron_setup(self, bottom, top):
        ratio = self.param.dropout_param.dropout_ratio
        # dropout_layer.cpp DCHECKs 0 < ratio < 1 (off in release builds); ratio 1 would scale by 1/0.
        self.check(0.0 <= ratio < 1.0, "dropout_ratio must be in [0, 1), got %g" % ratio)
        self.threshold = ratio
        self.scale = 1.0 / (1.0 - ratio)
        self.random_stream = RandomStream(self.name)

    def flops(self, bottom, top):
        # TRAIN: draw the mask, compare, multiply; TEST: a copy.
        return 2 * bottom[0].count if self.phase == caffe_pb2.TRAIN else 0

    def compute(self, x, y):
        if self.phase == caffe_pb2.TRAIN:
            rand = self.random_stream.uniform(self.buffer("rand", x.shape))    # Caffe's rand_vec_, as uniforms
            neuron.dropout(x, rand.reshape(-1), y, 1.0 - self.threshold, self.scale)
        elif y is not x:
            np.copyto(y, x)

    def gradient(self, x, y, dy, dx):
        if self.phase == caffe_pb2.TRAIN:
            neuron.dropout(dy, self.buffer("rand").reshape(-1), dx, 1.0 - self.threshold, self.scale)
        elif dx is not dy:
            np.copyto(dx, dy)

    def compute_gpu(self, dev, x, y):
        if self.phase == caffe_pb2.TRAIN:
            # Caffe draws the mask with curand; the kernel computes the CPU code's numbers (the same stream) and
            # keeps them in the device buffer "rand" for the backward.
            rand = self.buffer("rand", x.size, device=True)
            dev.launch("dropout_philox_forward", *self.random_stream.kernel_arguments(x.size), x,
                       1.0 - self.threshold, self.scale, rand, y)
        elif y.ptr != x.ptr:
            dev.copy(y, x)

    def gradient_gpu(self, dev, x, y, dy, dx):
        if self.phase == caffe_pb2.TRAIN:
            dev.launch("dropout_apply", dy.size, dy, self.buffer("rand", device=True), 1.0 - self.threshold, self.scale,
                       dx)
        elif dx.ptr != dy.ptr:
            dev.copy(dx, dy)


@register("Clip")
class ClipLayer(NeuronLayer):
    flops_per_element = 2        # max(min, min(x, max))
    backward_needs_bottom = True

    def neuron_setup(self, bottom, top):
        p = self.param.clip_param
        # ClipParameter.min and .max are `required` in caffe.proto: Caffe refuses a net without them.
        self.check(p.HasField("min") and p.HasField("max"), "clip_param needs both min and max (required fields)")
        self.min, self.max = p.min, p.max

    def compute(self, x, y):
        neuron.clip_forward(x, y, self.min, self.max)

    def gradient(self, x, y, dy, dx):
        neuron.clip_backward(x, dy, dx, self.min, self.max)

    def compute_gpu(self, dev, x, y):
        dev.launch("clip_forward", x.size, x, self.min, self.max, y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("clip_backward", x.size, x, dy, self.min, self.max, dx)


@register("Swish")
class SwishLayer(NeuronLayer):
    """y = x * sigmoid(beta * x) (swish_layer.cpp); the sigmoid is kept for the backward (Caffe's sigmoid_output_)."""
    flops_per_element = 6        # beta * x, sigmoid (4), * x

    def neuron_setup(self, bottom, top):
        self.beta = self.param.swish_param.beta

    def compute(self, x, y):
        neuron.swish_forward(x, y, self.beta, self.buffer("sigmoid", x.shape, x.dtype))

    def gradient(self, x, y, dy, dx):
        neuron.swish_backward(y, self.buffer("sigmoid"), dy, dx, self.beta)

    def compute_gpu(self, dev, x, y):
        dev.launch("swish_forward", x.size, x, self.beta, self.buffer("sigmoid", x.size, device=True), y)

    def gradient_gpu(self, dev, x, y, dy, dx):
        dev.launch("swish_backward", y.size, y, self.buffer("sigmoid", device=True), dy, self.beta, dx)
