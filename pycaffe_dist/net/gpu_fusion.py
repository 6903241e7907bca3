"""Runs of layers that the GPU runs as one kernel pass where Caffe runs them one by one: fewer passes over the
same tensor, fewer launches, the same results up to rounding. Three runs:

- BatchNorm followed by an in-place Scale (and the in-place ReLU after it, where there is one): `BatchNormScale`
  (ResNet);
- an Eltwise SUM of two bottoms followed by an in-place ReLU: `EltwiseSumReLU` (ResNet);
- a Convolution with a bias followed by an in-place ReLU, forward only: `ConvolutionReLU` (nearly every conv of
  AlexNet, VGG, GoogLeNet).

Layers are fused only where nothing can tell:
- the run's layers are in place on one blob (the Eltwise writes its own top, the ReLU works in place on it):
  whatever each layer leaves in the blob's data and diff, the last one overwrites, fused or not; where the last
  layer's diff is the only one left visible (the Eltwise's top), the fused backward writes it too;
- the layers' bottoms need a gradient alike (a BatchNorm on the data, whose Scale still computes its bottom diff, is
  not fused);
- the range run (Net.forward_from_to / backward_from_to) holds all of them, so that a run that ends between them
  (pycaffe's forward(end=...), a pipeline cut) sees each layer's own output (`dist_caffe time` times such layers
  together, as a training iteration runs them: net/timing.py);
- the net prints no debug info (which shows each layer's output).
A backward is fused as its forward was (where the run has a fused backward), and a backward run layer by layer after
a fused forward is right too.
The CPU path never fuses. tests/gpu/test_gpu_fusion_gpu.py compares the fused runs with the layers run apart, on
the GPU and the CPU.

BatchNorm + Scale (+ ReLU). Caffe has no BatchNorm with a learned affine step, so every ResNet-style net of the zoo
writes the pair: a BatchNorm, then a Scale (bias_term: true) on the same blob, and mostly a ReLU on it after that.
Run as layers on the GPU, the pair makes 7 passes over the tensor forward (BatchNorm: read for the statistics, read
and write y and its kept x_norm; Scale: read, write y and its saved copy of the input) and 9 backward (Scale: read
dy and its input for the sums, read dy and write dx; BatchNorm: read dy and x_norm for its sums, read both and write
dx); the ReLU 2 and 3 more. Together they make 4 and 5:

- forward: the statistics as BatchNorm's, then one kernel writes x_norm (kept: it is the Scale's input, so the
  Scale keeps no copy) and y = gamma x_norm + beta, through the ReLU;
- backward: one read of dy and x_norm gives the Scale's gradients, sum(dy) and sum(dy x_norm), which times gamma
  are BatchNorm's sums too; one more pass writes dx = gamma (dy - (x_norm sum(dy x_norm) + sum(dy)) / m) / std. The
  ReLU's mask is where gamma x_norm + beta > 0, recomputed from x_norm with the forward's float operations (so the
  same bits), and dy is taken through it in both passes.
The arithmetic is the layers' up to rounding (gamma multiplies the sums instead of dy before they are summed).
After a fused forward the Scale's kept input is the BatchNorm's x_norm (shared, not copied).

Eltwise SUM + ReLU. ResNet ends each block so: the sum of the shortcut and the branch, then a ReLU in place. Apart,
the Eltwise writes c0 a, then adds c1 b (an axpy), and the ReLU reads and writes the sum: 7 passes over the tensor;
backward the ReLU reads y and dy and writes its diff, and the Eltwise scales that into each bottom's diff: 7 more.
Together: 3 forward (read a and b, write y), 5 backward (read y and dy, write the ReLU's diff, which stays visible
in the blob as the layers leave it, and both bottoms' diffs). The arithmetic is the layers' (the axpy's fused
multiply-add; with ResNet's coefficients of 1 the same bits).

Convolution + ReLU. Apart, the forward adds the bias (cuDNN's AddTensor, or Caffe's GEMM against a ones vector)
and the ReLU reads and writes the top again: two kernels after the convolution's. Fused, one kernel adds the bias
and applies the ReLU (the same float operations: the same bits). What that saves is a launch more than a pass over
memory: on a GPU shared with a driver that takes tens of microseconds a launch, GoogLeNet's 57 such pairs wait on
the host more than on the GPU (bench/gpu_kernels.py). The backward stays the layers': the ReLU's backward reads the
top, which holds what it holds apart.
"""
from ..backend import select
from ..blob.blob import count
from ..layers import channel_sums
from ..proto import caffe_pb2


def find(net):
    """{first layer id: run} for the runs of `net` that the GPU may run as one."""
    runs = {}
    for first in range(len(net.layers) - 1):
        run = BatchNormScale.at(net, first) or EltwiseSumReLU.at(net, first) or ConvolutionReLU.at(net, first)
        if run is not None:
            runs[first] = run
    return runs


def _in_place_relu(net, layer_id, blob, slope_zero=False):
    """Whether layer `layer_id` is a ReLU in place on `blob` (of slope 0 where slope_zero)."""
    if layer_id >= len(net.layers) or net.layers[layer_id].type != "ReLU":
        return False
    if net.bottom_ids[layer_id] != [blob] or net.top_ids[layer_id] != [blob]:
        return False
    return not slope_zero or net.layers[layer_id].param.relu_param.negative_slope == 0


class LayerRun:
    """Layers first .. first + most - 1 of `net`, which the GPU may run as one: at least `least` of them."""
    least = 2
    fuses_backward = True                   # False: the backward runs the layers apart, however the forward ran

    def __init__(self, net, first, most):
        self.net, self.first, self.most = net, first, most
        self.forward_fused = None           # how many layers the last forward ran as one, or None: run apart

    def members(self):
        return range(self.first, self.first + self.most)

    def layers_in(self, end):
        """How many of the run's layers a forward up to layer `end` fuses (0: fewer than `least`)."""
        layers = min(self.most, end - self.first + 1)
        return layers if layers >= self.least else 0

    def fits(self):
        """Whether the layers, reshaped, may be fused as they are shaped now."""
        return True

    def holds_elements(self):
        """Whether the first layer's bottoms and tops all hold elements. An empty batch or axis runs the layers
        apart: each layer's own code says what no elements mean (a BatchNorm keeps its statistics)."""
        net = self.net
        return all(net.blob_list[i].count for i in net.bottom_ids[self.first] + net.top_ids[self.first])

    def needs_backward(self):
        return self.net.layer_need_backward[self.first + self.forward_fused - 1]


class BatchNormScale(LayerRun):
    """A BatchNorm, the in-place Scale after it and, where `relu`, the in-place ReLU (slope 0) after that."""

    @classmethod
    def at(cls, net, bn_id):
        bn, scale = net.layers[bn_id], net.layers[bn_id + 1]
        if bn.type != "BatchNorm" or scale.type != "Scale" or len(net.bottom_ids[bn_id + 1]) != 1:
            return None
        blob = net.top_ids[bn_id][0]
        in_place = [blob]
        if net.bottom_ids[bn_id] != in_place or net.bottom_ids[bn_id + 1] != in_place or \
                net.top_ids[bn_id + 1] != in_place:
            return None
        if net.bottom_need_backward[bn_id][0] != net.bottom_need_backward[bn_id + 1][0]:
            return None
        relu = _in_place_relu(net, bn_id + 2, blob, slope_zero=True) and \
            net.bottom_need_backward[bn_id + 2][0] == net.bottom_need_backward[bn_id + 1][0]
        return cls(net, bn_id, relu)

    def __init__(self, net, bn_id, relu):
        super().__init__(net, bn_id, 3 if relu else 2)     # the ReLU after them too, where relu
        self.bn, self.scale = net.layers[bn_id], net.layers[bn_id + 1]

    def fits(self):
        """Whether the Scale's parameters are per channel of the BatchNorm's bottom as it is shaped now (reshaped
        already): scale_param's axis 1 and num_axes 1, as the zoo's nets have it."""
        dims = self.bn.gpu_dims([self.net.blob_list[self.net.top_ids[self.first][0]]])
        scale = self.scale
        return tuple(scale.dims) == dims and (not scale.param.scale_param.bias_term or
                                              tuple(scale.bias_dims) == dims)

    def _affine(self):
        """(gamma, beta, has_bias) on the device; beta is gamma where the Scale has no bias (never read)."""
        scale = self.scale
        has_bias = scale.param.scale_param.bias_term
        gamma = scale.blobs[0].gpu_data
        return gamma, (scale.blobs[-1].gpu_data if has_bias else gamma), int(has_bias)

    def forward(self, bottom, top, layers):
        """The run's forward on the GPU over `layers` (2 or 3) of them, all reshaped; bottom and top are the first
        layer's (the one blob they share)."""
        blob, bn = top[0], self.bn
        dev = select.current()
        mean, std = bn.gpu_statistics([blob])
        count, channels = blob.count, bn.channels
        inner = max(bn.gpu_dims([blob])[2], 1)
        keep = any(self.net.layer_need_backward[i] for i in range(self.first, self.first + layers))
        x_norm = bn.buffer("x_norm", count, device=True) if keep else None
        dev.launch("batch_norm_scale_normalize", count, blob.gpu_data, mean, std, *self._affine(), int(layers == 3),
                   channels, inner, x_norm if keep else blob.mutable_gpu_data, blob.mutable_gpu_data)
        if keep:
            self.scale.adopt_buffer("saved", x_norm)    # the Scale's input, should its backward run alone
        self.forward_fused = layers

    def needs_backward(self):
        return self.net.layer_need_backward[self.first + 1]   # the Scale's

    def backward(self, bottom, top):
        """The run's backward on the GPU (as its forward was fused): the Scale's parameter gradients, and where the
        BatchNorm's bottom needs one, its diff (dy taken back through the ReLU, the Scale and the BatchNorm)."""
        blob, bn, scale, net = top[0], self.bn, self.scale, self.net
        bn_propagate_down = net.layer_need_backward[self.first] and net.bottom_need_backward[self.first][0]
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


class EltwiseSumReLU(LayerRun):
    """An Eltwise SUM of two bottoms (not in place) and the in-place ReLU (any slope) on its top."""

    @classmethod
    def at(cls, net, eltwise_id):
        eltwise = net.layers[eltwise_id]
        if eltwise.type != "Eltwise" or eltwise.param.eltwise_param.operation != caffe_pb2.EltwiseParameter.SUM:
            return None
        bottoms, top = net.bottom_ids[eltwise_id], net.top_ids[eltwise_id]
        if len(bottoms) != 2 or bottoms[0] == bottoms[1] or top[0] in bottoms:
            return None
        if not _in_place_relu(net, eltwise_id + 1, top[0]) or \
                net.bottom_need_backward[eltwise_id + 1][0] != net.layer_need_backward[eltwise_id]:
            return None
        return cls(net, eltwise_id, 2)

    def forward(self, bottom, top, layers):
        eltwise, relu = self.net.layers[self.first], self.net.layers[self.first + 1]
        (c0, c1), y = eltwise.coeffs, top[0]
        select.current().launch("eltwise_sum_relu_forward", y.count, c0, bottom[0].gpu_data, c1, bottom[1].gpu_data,
                                relu.param.relu_param.negative_slope, y.mutable_gpu_data)
        self.forward_fused = layers

    def backward(self, bottom, top):
        """The ReLU's diff into the blob (as it leaves it), and the Eltwise's into the bottoms that need one."""
        net, eltwise_id = self.net, self.first
        eltwise, relu = net.layers[eltwise_id], net.layers[eltwise_id + 1]
        y = top[0]
        want = [net.layer_need_backward[eltwise_id] and down for down in net.bottom_need_backward[eltwise_id]]
        dy = y.mutable_gpu_diff
        dx = [b.mutable_gpu_diff if w else dy for b, w in zip(bottom, want)]
        select.current().launch("eltwise_sum_relu_backward", y.count, y.gpu_data, relu.param.relu_param.negative_slope,
                                eltwise.coeffs[0], eltwise.coeffs[1], int(want[0]), int(want[1]), dy, dx[0], dx[1])


class ConvolutionReLU(LayerRun):
    """A Convolution (one bottom, one top, a bias) and the in-place ReLU (any slope) on its top; forward only."""
    fuses_backward = False

    @classmethod
    def at(cls, net, conv_id):
        conv = net.layers[conv_id]
        if conv.type != "Convolution" or not conv.param.convolution_param.bias_term:
            return None
        bottoms, top = net.bottom_ids[conv_id], net.top_ids[conv_id]
        if len(bottoms) != 1 or len(top) != 1 or not _in_place_relu(net, conv_id + 1, top[0]):
            return None
        return cls(net, conv_id, 2)

    def forward(self, bottom, top, layers):
        conv, relu = self.net.layers[self.first], self.net.layers[self.first + 1]
        conv.forward_gpu(bottom, top, bias=False)
        y = top[0]
        select.current().launch("bias_relu_forward", y.count, y.gpu_data, conv.blobs[1].gpu_data, conv.num_output,
                                max(count(conv.output_spatial), 1), relu.param.relu_param.negative_slope,
                                y.mutable_gpu_data)
        self.forward_fused = layers
