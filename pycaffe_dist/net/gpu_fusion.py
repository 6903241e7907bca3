"""BatchNorm followed by an in-place Scale, run together on the GPU.

Caffe has no BatchNorm with a learned affine step, so every ResNet-style net of the zoo writes the pair: a
BatchNorm, then a Scale (bias_term: true) on the same blob. Run as two layers on the GPU they make 7 passes over the
tensor forward (BatchNorm: read for the statistics, read and write y and its kept x_norm; Scale: read, write y and
its saved copy of the input) and 9 backward (Scale: read dy and its input for the sums, read dy and write dx;
BatchNorm: read dy and x_norm for its sums, read both and write dx). Together they make 4 and 5:

- forward: the statistics as BatchNorm's, then one kernel writes x_norm (kept: it is the Scale's input, so the
  Scale keeps no copy) and y = gamma x_norm + beta;
- backward: one read of dy and x_norm gives the Scale's gradients, sum(dy) and sum(dy x_norm), which times gamma
  are BatchNorm's sums too; one more pass writes dx = gamma (dy - (x_norm sum(dy x_norm) + sum(dy)) / m) / std.

The arithmetic is the two layers' up to rounding (gamma multiplies the sums instead of dy before they are summed):
tests/gpu/test_gpu_fusion.py compares with the layers run apart, on the GPU and the CPU. The CPU path never fuses.

A pair is fused only where nothing can tell: the Scale is the next layer, in place on the BatchNorm's top, with one
bottom and a per-channel scale (and bias) of the BatchNorm's channels; the Scale's bottom needs a gradient where
the BatchNorm's does; and the range run (Net.forward_from_to / backward_from_to) holds both layers, so that a run that ends
at the BatchNorm (pycaffe's forward(end=...), `dist_caffe time`'s layer by layer, a pipeline stage's cut) sees
BatchNorm's own output. A backward is fused only after a fused forward.
"""
from ..backend import select
from ..layers import channel_sums


def find(net):
    """{BatchNorm layer id: BatchNormScale} for the pairs of `net` that may be fused."""
    pairs = {}
    for bn_id in range(len(net.layers) - 1):
        bn, scale = net.layers[bn_id], net.layers[bn_id + 1]
        if bn.type != "BatchNorm" or scale.type != "Scale" or len(net.bottom_ids[bn_id + 1]) != 1:
            continue
        blob = net.top_ids[bn_id][0]
        if net.bottom_ids[bn_id + 1] != [blob] or net.top_ids[bn_id + 1] != [blob]:
            continue
        if net.bottom_need_backward[bn_id][0] and not net.bottom_need_backward[bn_id + 1][0]:
            continue        # an explicit propagate_down: false on the Scale
        pairs[bn_id] = BatchNormScale(net, bn_id)
    return pairs


class BatchNormScale:
    def __init__(self, net, bn_id):
        self.net, self.bn_id, self.scale_id = net, bn_id, bn_id + 1
        self.bn, self.scale = net.layers[bn_id], net.layers[bn_id + 1]
        self.forward_fused = False      # whether the last forward of the pair was this one's

    def fits(self):
        """Whether the Scale's parameters are per channel of the BatchNorm's bottom as it is shaped now (reshaped
        already): scale_param's axis 1 and num_axes 1, as the zoo's nets have it."""
        blob = self.net.blob_list[self.net.top_ids[self.bn_id][0]]
        if len(blob.shape) < 2:
            return False
        num, channels = blob.shape[0], blob.shape[1]
        dims = (num, channels, blob.count // (num * channels) if num * channels else 0)
        scale = self.scale
        return tuple(scale.dims) == dims and (not scale.param.scale_param.bias_term or
                                              tuple(scale.bias_dims) == dims)

    def forward(self, bottom, top):
        """The pair's forward on the GPU (both layers reshaped); top is the blob they share."""
        bn, scale = self.bn, self.scale
        dev = select.current()
        mean, std = bn.gpu_statistics(bottom)
        count, channels = bottom[0].count, bn.channels
        inner = max(bn.gpu_dims(bottom)[2], 1)
        y = top[0].mutable_gpu_data
        keep = self.net.layer_need_backward[self.scale_id] or self.net.layer_need_backward[self.bn_id]
        x_norm = bn.buffer("x_norm", count, device=True) if keep else y
        bias_term = scale.param.scale_param.bias_term
        gamma = scale.blobs[0].gpu_data
        beta = scale.blobs[-1].gpu_data if bias_term else gamma
        dev.launch("batch_norm_scale_normalize", count, bottom[0].gpu_data, mean, std, gamma, beta, int(bias_term),
                   channels, inner, x_norm, y)
        self.forward_fused = True

    def backward(self, top, bn_propagate_down, bottom):
        """The pair's backward on the GPU: the Scale's parameter gradients, and with bn_propagate_down the
        BatchNorm's bottom diff (as the Scale's bottom diff taken through the BatchNorm); without it, the Scale's
        bottom diff where the Scale's bottom needs one (a BatchNorm on the data: Caffe's net still computes it)."""
        bn, scale = self.bn, self.scale
        dev = select.current()
        dims = bn.gpu_dims(bottom)
        channels, count = bn.channels, bottom[0].count
        dy = top[0].gpu_diff
        x_norm = bn.buffer("x_norm", count, device=True)
        sum_dy, sum_dyy = bn.buffer("sum_dy", channels, device=True), bn.buffer("sum_dyy", channels, device=True)
        channel_sums.sums(bn, dy, x_norm, dims, sum_dy, sum_dyy)
        want_bias = scale.param.scale_param.bias_term and scale.param_propagate_down[-1]
        want_scale = scale.param_propagate_down[0]
        if want_bias or want_scale:
            outer, dim, inner = scale.dims
            assign = outer == 1 and not (dim == 1 and inner > 1)     # where the Scale assigns its gradient
            dev.launch("batch_norm_scale_parameter_diffs", channels, sum_dy, sum_dyy, int(want_bias), int(want_scale),
                       0.0 if assign else 1.0,
                       scale.blobs[-1].mutable_gpu_diff if want_bias else sum_dy,
                       scale.blobs[0].mutable_gpu_diff if want_scale else sum_dyy)
        if not bn_propagate_down:
            if self.net.bottom_need_backward[self.scale_id][0]:
                _, dim, inner = scale.dims
                dev.launch("scale_forward", count, dy, scale.blobs[0].gpu_data, dim, inner, top[0].mutable_gpu_diff)
            return
        dev.launch("batch_norm_scale_backward", count, dy, x_norm, sum_dyy, sum_dy, scale.blobs[0].gpu_data,
                   bn.buffer("std", channels, device=True), int(bn.use_global_stats), channels, max(dims[2], 1),
                   -1.0 / (count // channels), bottom[0].mutable_gpu_diff)
