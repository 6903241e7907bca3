"""BatchNorm followed by an in-place Scale (and the in-place ReLU after it, where there is one), run together on the
GPU.

Caffe has no BatchNorm with a learned affine step, so every ResNet-style net of the zoo writes the pair: a
BatchNorm, then a Scale (bias_term: true) on the same blob, and mostly a ReLU on it after that. Run as layers on the
GPU, the pair makes 7 passes over the tensor forward (BatchNorm: read for the statistics, read and write y and its
kept x_norm; Scale: read, write y and its saved copy of the input) and 9 backward (Scale: read dy and its input for
the sums, read dy and write dx; BatchNorm: read dy and x_norm for its sums, read both and write dx); the ReLU 2 and
3 more. Together they make 4 and 5:

- forward: the statistics as BatchNorm's, then one kernel writes x_norm (kept: it is the Scale's input, so the
  Scale keeps no copy) and y = gamma x_norm + beta, through the ReLU;
- backward: one read of dy and x_norm gives the Scale's gradients, sum(dy) and sum(dy x_norm), which times gamma
  are BatchNorm's sums too; one more pass writes dx = gamma (dy - (x_norm sum(dy x_norm) + sum(dy)) / m) / std. The
  ReLU's mask is where gamma x_norm + beta > 0, recomputed from x_norm with the forward's float operations (so the
  same bits), and dy is taken through it in both passes.

The arithmetic is the layers' up to rounding (gamma multiplies the sums instead of dy before they are summed):
tests/gpu/test_gpu_fusion_gpu.py compares with the layers run apart, on the GPU and the CPU. The CPU path never fuses.

Layers are fused only where nothing can tell:
- the BatchNorm is in place, the Scale is the next layer, in place, with one bottom and a per-channel scale (and
  bias) of the BatchNorm's channels, and the ReLU (slope 0) the one after, in place: whatever each layer leaves in
  the blob's data and diff, the last one overwrites, fused or not;
- the layers' bottoms need a gradient alike (a BatchNorm on the data, whose Scale still computes its bottom diff, is
  not fused);
- the range run (Net.forward_from_to / backward_from_to) holds all of them, so that a run that ends between them
  (pycaffe's forward(end=...), a pipeline cut) sees each layer's own output (`dist_caffe time` times such layers
  together, as a training iteration runs them: net/timing.py);
- the net prints no debug info (which shows each layer's output).
A backward is fused as its forward was. After a fused forward the Scale's kept input is the BatchNorm's x_norm
(shared, not copied), so a backward run layer by layer is right too.
"""
from ..backend import select
from ..layers import channel_sums


def find(net):
    """{BatchNorm layer id: BatchNormScale} for the BatchNorm + Scale (+ ReLU) runs of `net` that may be fused."""
    runs = {}
    for bn_id in range(len(net.layers) - 1):
        bn, scale = net.layers[bn_id], net.layers[bn_id + 1]
        if bn.type != "BatchNorm" or scale.type != "Scale" or len(net.bottom_ids[bn_id + 1]) != 1:
            continue
        blob = net.top_ids[bn_id][0]
        in_place = [blob]
        if net.bottom_ids[bn_id] != in_place or net.bottom_ids[bn_id + 1] != in_place or \
                net.top_ids[bn_id + 1] != in_place:
            continue
        if net.bottom_need_backward[bn_id][0] != net.bottom_need_backward[bn_id + 1][0]:
            continue
        relu_id = bn_id + 2
        relu = relu_id < len(net.layers) and net.layers[relu_id].type == "ReLU" and \
            net.bottom_ids[relu_id] == in_place and net.top_ids[relu_id] == in_place and \
            net.layers[relu_id].param.relu_param.negative_slope == 0 and \
            net.bottom_need_backward[relu_id][0] == net.bottom_need_backward[bn_id + 1][0]
        runs[bn_id] = BatchNormScale(net, bn_id, relu)
    return runs


class BatchNormScale:
    def __init__(self, net, bn_id, relu):
        self.net, self.bn_id, self.scale_id = net, bn_id, bn_id + 1
        self.bn, self.scale = net.layers[bn_id], net.layers[bn_id + 1]
        self.relu = relu                    # whether the ReLU after them may be fused too
        self.forward_fused = None           # the last forward's fused layers (2 or 3), or None: run apart

    def layers_in(self, end):
        """How many of the run's layers a forward up to layer `end` fuses: 3, 2, or 0 (not even the pair)."""
        if self.relu and self.bn_id + 2 <= end:
            return 3
        return 2 if self.bn_id + 1 <= end else 0

    def fits(self):
        """Whether the Scale's parameters are per channel of the BatchNorm's bottom as it is shaped now (reshaped
        already): scale_param's axis 1 and num_axes 1, as the zoo's nets have it."""
        dims = self.bn.gpu_dims([self.net.blob_list[self.net.top_ids[self.bn_id][0]]])
        scale = self.scale
        return tuple(scale.dims) == dims and (not scale.param.scale_param.bias_term or
                                              tuple(scale.bias_dims) == dims)

    def _affine(self):
        """(gamma, beta, has_bias) on the device; beta is gamma where the Scale has no bias (never read)."""
        scale = self.scale
        has_bias = scale.param.scale_param.bias_term
        gamma = scale.blobs[0].gpu_data
        return gamma, (scale.blobs[-1].gpu_data if has_bias else gamma), int(has_bias)

    def forward(self, blob, layers):
        """The run's forward on the GPU over `layers` (2 or 3) of them, all reshaped; blob is the one they share."""
        bn = self.bn
        dev = select.current()
        mean, std = bn.gpu_statistics([blob])
        count, channels = blob.count, bn.channels
        inner = max(bn.gpu_dims([blob])[2], 1)
        keep = any(self.net.layer_need_backward[i] for i in range(self.bn_id, self.bn_id + layers))
        x_norm = bn.buffer("x_norm", count, device=True) if keep else None
        dev.launch("batch_norm_scale_normalize", count, blob.gpu_data, mean, std, *self._affine(), int(layers == 3),
                   channels, inner, x_norm if keep else blob.mutable_gpu_data, blob.mutable_gpu_data)
        if keep:
            self.scale.adopt_buffer("saved", x_norm)    # the Scale's input, should its backward run alone
        self.forward_fused = layers

    def backward(self, blob, bn_propagate_down):
        """The run's backward on the GPU (as its forward was fused): the Scale's parameter gradients, and with
        bn_propagate_down the BatchNorm's bottom diff (dy taken back through the ReLU, the Scale and the
        BatchNorm)."""
        bn, scale = self.bn, self.scale
        dev = select.current()
        dims = bn.gpu_dims([blob])
        channels, count = bn.channels, blob.count
        dy = blob.gpu_diff
        x_norm = bn.buffer("x_norm", count, device=True)
        gamma, beta, has_bias = self._affine()
        relu = self.forward_fused == 3
        sum_dy, sum_dyy = bn.buffer("sum_dy", channels, device=True), bn.buffer("sum_dyy", channels, device=True)
        channel_sums.sums(bn, dy, x_norm, dims, sum_dy, sum_dyy, relu=(gamma, beta, has_bias) if relu else None)
        want_bias = has_bias and scale.param_propagate_down[-1]
        want_scale = scale.param_propagate_down[0]
        if want_bias or want_scale:
            dev.launch("batch_norm_scale_parameter_diffs", channels, sum_dy, sum_dyy, int(want_bias), int(want_scale),
                       0.0 if scale.assigns_scale_diff(False) else 1.0,
                       scale.blobs[-1].mutable_gpu_diff if want_bias else sum_dy,
                       scale.blobs[0].mutable_gpu_diff if want_scale else sum_dyy)
        if bn_propagate_down:
            dev.launch("batch_norm_scale_backward", count, dy, x_norm, sum_dyy, sum_dy, gamma, beta, has_bias,
                       int(relu), bn.buffer("std", channels, device=True), int(bn.use_global_stats), channels,
                       max(dims[2], 1), -1.0 / (count // channels), blob.mutable_gpu_diff)
