"""Per-channel sums on the device (csrc/cuda/channel.cu) over a tensor viewed as (outer, channels, inner): the
batch statistics and gradient sums of BatchNorm, the parameter gradients of Scale and Bias.

Caffe sums these with two GEMVs against vectors of ones per sum, after an element-wise pass that writes the product
or the square to a scratch tensor as large as the bottom. Here a first kernel sums fixed parts of each channel (one
thread per part: a single read of the tensor, both sums at once, no scratch tensor) and a second, one thread per
channel, adds the parts in order, so the sums do not depend on timing. On the emulated device the sums' order is
not numpy's either: the GPU path agrees with the CPU path to rounding (tests/gpu/test_norm_gpu.py's tolerance).
"""
from ..backend import select

# A first kernel of enough threads to keep a large GPU's memory system busy (H100: 132 SMs x 2048 threads), each
# summing at least MIN_PER_PART elements where the channels are large enough; folds of MERGE_WIDTH parts each then
# leave at most MERGE_WIDTH per channel for the last kernel (a thread per channel adding thousands of parts would
# take longer than the first pass).
TARGET_THREADS = 1 << 18
MIN_PER_PART = 32
MERGE_WIDTH = 32


def parts_for(channels, m):
    """How many parts each channel's m elements are summed in."""
    if channels <= 0 or m <= 0:
        return 1
    return max(1, min(m // MIN_PER_PART, -(-TARGET_THREADS // channels)))


def _scratch(layer, name, count, size):
    """`count` device arrays of `size` floats, kept by the layer under name."""
    return [layer.buffer("channel_%s_%d" % (name, i), size, device=True, at_least=True).at(0, size)
            for i in range(count)]


def _fold(layer, kernel, arrays, channels, parts):
    """Fold each channel's parts in groups of MERGE_WIDTH, in order, until at most MERGE_WIDTH are left; returns
    (arrays, parts). Two sets of buffers take turns: a level reads what the one before wrote."""
    dev = select.current()
    level = 0
    while parts > MERGE_WIDTH:
        groups = -(-parts // MERGE_WIDTH)
        folded = _scratch(layer, "fold%d" % (level % 2), len(arrays), channels * groups)
        dev.launch(kernel, channels * groups, parts, MERGE_WIDTH, *arrays, *folded)
        arrays, parts, level = folded, groups, level + 1
    return arrays, parts


def sums(layer, a, b, dims, out_a=None, out_ab=None, beta_a=0.0, beta_ab=0.0, relu=None):
    """out_a[c] = beta_a * out_a[c] + the sum of a over channel c of dims = (outer, channels, inner), and
    out_ab[c] likewise for a * b (b may be a: sums of squares). An output given as None is not kept. A beta of 0
    assigns (the output is not read), 1 accumulates, as Caffe's GEMV's beta. relu = (scale, bias, has_bias): a is
    a ReLU's top diff and b the x_norm under it, and a is taken through the ReLU first (net/gpu_fusion.py)."""
    outer, channels, inner = dims
    if channels == 0:
        return
    dev = select.current()
    m = outer * inner
    parts = parts_for(channels, m)
    part_a, part_ab = _scratch(layer, "parts", 2, channels * parts)
    scale, bias, has_bias = relu or (a, a, 0)      # a stands for the ReLU's scale and bias where there is none
    dev.launch("channel_sums_parts", channels * parts, a, b, scale, bias, has_bias, int(relu is not None), channels,
               max(inner, 1), m, parts, part_a, part_ab)
    (part_a, part_ab), parts = _fold(layer, "channel_sums_fold", [part_a, part_ab], channels, parts)
    if out_a is None:
        out_a, beta_a = layer.buffer("channel_unused_a", channels, device=True), 0.0
    if out_ab is None:
        out_ab, beta_ab = layer.buffer("channel_unused_ab", channels, device=True), 0.0
    dev.launch("channel_sums_merge", channels, part_a, part_ab, parts, float(beta_a), float(beta_ab), out_a, out_ab)


def moments(layer, x, dims):
    """The batch statistics of x over dims = (outer, channels, inner) up to their last step: ([part_count,
    part_mean, part_m2], parts), at most MERGE_WIDTH parts per channel, for batch_norm_statistics to combine."""
    outer, channels, inner = dims
    parts = parts_for(channels, outer * inner)
    arrays = _scratch(layer, "parts", 3, channels * parts)
    select.current().launch("channel_moments_parts", channels * parts, x, channels, max(inner, 1), outer * inner,
                            parts, *arrays)
    return _fold(layer, "channel_moments_fold", arrays, channels, parts)
