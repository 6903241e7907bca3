"""Element-wise math of the neuron layers on the CPU: numpy's SIMD loops for exp / tanh / log / pow, the fused
loops of csrc/neuron.pyx for what surrounds them.

Arrays are blob memory: C-contiguous, one shape and one dtype (float32, or float64 under the gradient checker).
Each function writes its output array in place, and an output may be one of the inputs (in-place layers; a top
diff that is also the bottom diff). `work` arguments are scratch arrays shaped like the input, owned by the layer.

Measured on 1M float32 elements, one thread, against the plainest numpy: the fused kernels win wherever the work
is selects and arithmetic (ReLU / PReLU / ELU forward and backward 3-28x, where numpy needs np.where and
temporaries; the other backwards and Dropout 1.2-5x); a scalar libm call per element (expf, tanhf) is 2-8x slower
than numpy's SIMD loop, so exp / tanh / log / pow stay in numpy and a kernel finishes around them where that saves
passes (ELU, BNLL: 5x np.logaddexp). AbsVal, Threshold and the Sigmoid / TanH / Exp / Log / Power forwards are
numpy passes; a kernel would not beat them. PReLU's slope gradient is a reduction: numpy's dot / einsum.
"""
import numpy as np

from .._kernels import neuron as _k


def _flat(a):
    return a.reshape(-1)


# --- ReLU, PReLU, ELU -------------------------------------------------------------------------------------------

def relu_forward(x, y, negative_slope):
    _k.relu_forward(_flat(x), _flat(y), negative_slope)


def relu_backward(x, dy, dx, negative_slope):
    _k.relu_backward(_flat(x), _flat(dy), _flat(dx), negative_slope)


def prelu_forward(x, y, slope, channels, dim):
    """x, y: (num, channels, dim) in memory; slope: one per channel, or a single one (channel_shared)."""
    _k.prelu_forward(_flat(x), _flat(y), _flat(slope), channels, dim)


def prelu_backward(x, dy, slope, dx, channels, dim):
    _k.prelu_backward(_flat(x), _flat(dy), _flat(slope), _flat(dx), channels, dim)


def prelu_slope_backward(x, dy, slope_diff, channels, dim, work):
    """slope_diff += sum of dy * min(x, 0) per channel, or over everything when slope_diff holds one value (numpy's
    dot / einsum: a sum in a C loop is either sequential, several times slower, or reordered by hand)."""
    np.minimum(x, 0, out=work)
    if slope_diff.size == 1:
        slope_diff += np.dot(_flat(work), _flat(dy))
    else:
        shape = (x.shape[0], channels, dim)
        slope_diff += np.einsum("ncd,ncd->c", work.reshape(shape), dy.reshape(shape))


def elu_forward(x, y, alpha, work):
    np.minimum(x, 0, out=work)
    np.exp(work, out=work)
    _k.elu_forward(_flat(x), _flat(work), _flat(y), alpha)


def elu_backward(x, y, dy, dx, alpha):
    _k.elu_backward(_flat(x), _flat(y), _flat(dy), _flat(dx), alpha)


# --- Sigmoid, TanH, Swish, BNLL -------------------------------------------------------------------------------

def sigmoid_forward(x, y):
    """y = 1 / (1 + e^-x). Caffe writes 0.5 * tanh(0.5 * x) + 0.5, the same function; this form is faster here and
    keeps its relative accuracy for x << 0, where e^-x may overflow to inf and give the right limit 0."""
    np.negative(x, out=y)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    np.add(y, 1, out=y)
    np.reciprocal(y, out=y)


def sigmoid_backward(y, dy, dx):
    _k.sigmoid_backward(_flat(y), _flat(dy), _flat(dx))


def tanh_forward(x, y):
    np.tanh(x, out=y)


def tanh_backward(y, dy, dx):
    _k.tanh_backward(_flat(y), _flat(dy), _flat(dx))


def swish_forward(x, y, beta, sig):
    """sig = sigmoid(beta * x), kept for the backward; y = x * sig."""
    np.multiply(x, beta, out=sig)
    sigmoid_forward(sig, sig)
    np.multiply(x, sig, out=y)


def swish_backward(y, sig, dy, dx, beta):
    _k.swish_backward(_flat(y), _flat(sig), _flat(dy), _flat(dx), beta)


def bnll_forward(x, y, work, work2):
    """y = log(1 + e^x) = max(x, 0) + log1p(e^-|x|) (see the kernel for how log1p comes from numpy's log)."""
    np.abs(x, out=work)
    np.negative(work, out=work)
    np.exp(work, out=work)
    np.add(work, 1, out=work2)
    np.log(work2, out=work2)
    _k.bnll_forward(_flat(x), _flat(work), _flat(work2), _flat(y))


def bnll_backward(x, dy, dx, work):
    np.minimum(x, 50, out=work)      # Caffe's kBNLL_THRESHOLD
    np.exp(work, out=work)
    _k.bnll_backward(_flat(work), _flat(dy), _flat(dx))


# --- AbsVal, Clip, Threshold ------------------------------------------------------------------------------------

def absval_forward(x, y):
    np.abs(x, out=y)


def absval_backward(x, dy, dx):
    _k.absval_backward(_flat(x), _flat(dy), _flat(dx))


def clip_forward(x, y, lo, hi):
    _k.clip_forward(_flat(x), _flat(y), lo, hi)


def clip_backward(x, dy, dx, lo, hi):
    _k.clip_backward(_flat(x), _flat(dy), _flat(dx), lo, hi)


def threshold_forward(x, y, threshold):
    """y = 1 where x > threshold, else 0; the threshold is compared in x's dtype, as Caffe's Dtype threshold_."""
    np.greater(x, x.dtype.type(threshold), out=y)


# --- Power, Exp, Log ------------------------------------------------------------------------------------------

def power_forward(x, y, power, scale, shift):
    """y = (shift + scale * x) ^ power, skipping the steps that change nothing, as Caffe's Forward_cpu does."""
    if power * scale == 0:
        # The input does not matter: Caffe fills 1 (power 0) or shift ^ power.
        value = np.power(y.dtype.type(shift), y.dtype.type(power)) if power != 0 else 1
        y.fill(value)
        return
    if scale != 1:
        np.multiply(x, scale, out=y)
    elif y is not x:
        np.copyto(y, x)
    if shift != 0:
        np.add(y, shift, out=y)
    if power != 1:
        np.power(y, power, out=y)


def power_backward(x, y, dy, dx, power, scale, shift):
    diff_scale = power * scale
    if diff_scale == 0:
        dx.fill(0)                   # Caffe sets the bottom diff to diff_scale = 0
    elif power == 1:
        np.multiply(dy, diff_scale, out=dx)
    else:
        _k.power_backward(_flat(x), _flat(y), _flat(dy), _flat(dx), power, scale, shift)


def exp_forward(x, y, inner_scale, outer_scale):
    """y = outer_scale * exp(inner_scale * x)."""
    if inner_scale != 1:
        np.multiply(x, inner_scale, out=y)
        np.exp(y, out=y)
    else:
        np.exp(x, out=y)
    if outer_scale != 1:
        np.multiply(y, outer_scale, out=y)


def exp_backward(y, dy, dx, inner_scale):
    _k.scaled_product(_flat(y), _flat(dy), _flat(dx), inner_scale)


def log_forward(x, y, scale, shift, base_scale):
    """y = base_scale * log(scale * x + shift)."""
    if scale != 1:
        np.multiply(x, scale, out=y)
    elif y is not x:
        np.copyto(y, x)
    if shift != 0:
        np.add(y, shift, out=y)
    np.log(y, out=y)
    if base_scale != 1:
        np.multiply(y, base_scale, out=y)


def log_backward(x, dy, dx, scale, shift, numerator):
    """dx = dy * numerator / (scale * x + shift), numerator = scale / log(base)."""
    _k.log_backward(_flat(x), _flat(dy), _flat(dx), scale, shift, numerator)


# --- Dropout ----------------------------------------------------------------------------------------------------

def dropout(x, rand, y, keep, scale):
    """y = x * (rand < keep) * scale, rand: float32 uniform draws in [0, 1), one per element."""
    _k.dropout(_flat(x), rand, _flat(y), keep, scale)
