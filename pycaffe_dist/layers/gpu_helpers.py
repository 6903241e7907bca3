"""Device code that several layer modules run, kept here so that no layer module imports another's helpers:
Caffe's ones multiplier (Convolution, Deconvolution, InnerProduct, Embed) and its softmax pass (Softmax and the
softmax losses, after softmax_layer.cu)."""
from ..backend import select

# The softmax pass's floating-point operations per element: max, subtract, exp, sum, divide (the CPU kernel takes
# the same steps), which Softmax and the softmax losses count in flops().
SOFTMAX_FLOPS_PER_ELEMENT = 5


def gpu_ones(layer, size):
    """Caffe's bias_multiplier_: a device vector of at least `size` ones kept by `layer` (it only grows)."""
    return layer.buffer("ones", size, fill=1.0, device=True, at_least=True)


def gpu_softmax(x, y, outer, channels, inner, scale):
    """y = softmax of the (outer, channels, inner) device array x over its channels, as softmax_layer.cu's
    Forward_gpu (max, subtract, exp, sum, divide); y may be x. scale: outer * inner floats of scratch."""
    dev = select.current()
    count = outer * channels * inner
    if x.ptr != y.ptr:
        dev.copy(y, x)
    dev.launch("softmax_channel_max", outer * inner, channels, inner, y, scale)
    dev.launch("softmax_channel_subtract", count, channels, inner, scale, y)
    dev.launch("softmax_exp", count, y, y)
    dev.launch("softmax_channel_sum", outer * inner, channels, inner, y, scale)
    dev.launch("softmax_channel_div", count, channels, inner, scale, y)
