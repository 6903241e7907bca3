"""Device code that several layer modules run, kept here so that no layer module imports another's helpers:
Caffe's ones multiplier (Convolution, Deconvolution, InnerProduct, Embed), its softmax pass (Softmax and the
softmax losses, after softmax_layer.cu), and the address tables of the kernels that take several blobs in one
launch (Concat, Split)."""
import numpy as np

from ..backend import select

# The softmax pass's floating-point operations per element: max, subtract, exp, sum, divide (the CPU kernel takes
# the same steps), which Softmax and the softmax losses count in flops().
SOFTMAX_FLOPS_PER_ELEMENT = 5
# The most channels whose softmax runs as one kernel (gpu_softmax)
ONE_PASS_MAX_CHANNELS = 64


def gpu_ones(layer, size):
    """Caffe's bias_multiplier_: a device vector of at least `size` ones kept by `layer` (it only grows)."""
    return layer.buffer("ones", size, fill=1.0, device=True, at_least=True)


def gpu_table(layer, name, values, dtype):
    """A device array of `values` (blob addresses as int64, sizes as int32) kept by `layer` under `name`, uploaded
    again only where the values change (a reshape, another device): one launch over several blobs reads it, where
    Caffe launches once per blob."""
    dev = select.current()
    tables = layer.__dict__.setdefault("gpu_tables", {})
    key = (dev, tuple(values))
    held = tables.get(name)
    if held is None or held[0] != key:
        held = tables[name] = (key, dev.to_device(np.array(values, dtype)))
    return held[1]


def gpu_softmax(x, y, outer, channels, inner, scale, one_pass=None):
    """y = softmax of the (outer, channels, inner) device array x over its channels, as softmax_layer.cu's
    Forward_gpu (max, subtract, exp, sum, divide); y may be x. scale: outer * inner floats of scratch.

    Up to ONE_PASS_MAX_CHANNELS channels (one_pass None) the five steps run as one kernel, a thread per position,
    with the same bits: a classifier's loss over 10 classes is then one launch where Caffe's kernels are five (and
    a copy), which a small net's step pays on the host. Over more channels a thread's loops would take longer than
    the launches they save (1000 classes at batch 32: 32 threads)."""
    dev = select.current()
    count = outer * channels * inner
    if count == 0:      # nothing to compute (the kernels would read a first channel that is not there)
        return
    if one_pass is None:
        one_pass = channels <= ONE_PASS_MAX_CHANNELS
    if one_pass:
        dev.launch("softmax_positions", outer * inner, channels, inner, x, y)
        return
    if x.ptr != y.ptr:
        dev.copy(y, x)
    dev.launch("softmax_channel_max", outer * inner, channels, inner, y, scale)
    dev.launch("softmax_channel_subtract", count, channels, inner, scale, y)
    dev.launch("softmax_exp", count, y, y)
    dev.launch("softmax_channel_sum", outer * inner, channels, inner, y, scale)
    dev.launch("softmax_channel_div", count, channels, inner, scale, y)
