"""A Caffe net as a PyTorch module, for the benchmarks' reference: the same layers, shapes and losses.

Built from one of our Nets (TRAIN phase, already set up), so every layer's input channels and every blob's shape
are known and no lazy module is needed; the module runs the layers in the net's order over a dict of named blobs,
as Caffe's Net::Forward does, so branching nets (ResNet's Eltwise sums, GoogLeNet's Concats and its three losses)
run as they do in Caffe. The loss is the sum of the loss layers' losses times their loss weights.

Only what the benchmarked nets use is supported (each refusal names the layer): Input, Convolution (groups,
stride, pad, dilation, bias), Pooling (MAX and AVE, global, Caffe's rounding up), ReLU (negative_slope), LRN
(ACROSS_CHANNELS), Dropout, InnerProduct, BatchNorm (batch statistics in TRAIN, no affine part, as Caffe's),
Scale (per channel, with bias), Eltwise (SUM with coefficients, PROD, MAX), Concat, Split, Flatten,
SoftmaxWithLoss, Accuracy (skipped: it has no backward).
"""


class Unsupported(ValueError):
    pass


def _pair(values, default):
    """Caffe's repeated kernel/stride/pad field (or its _h/_w form) as torch's (h, w)."""
    values = list(values)
    if not values:
        return (default, default)
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _conv_geometry(cp):
    kernel = (cp.kernel_h, cp.kernel_w) if cp.HasField("kernel_h") else _pair(cp.kernel_size, 1)
    stride = (cp.stride_h, cp.stride_w) if cp.HasField("stride_h") else _pair(cp.stride, 1)
    pad = (cp.pad_h, cp.pad_w) if cp.HasField("pad_h") else _pair(cp.pad, 0)
    return kernel, stride, pad


def build(net):
    """(torch.nn.Module, torch) for our Net `net`: module(inputs: {blob name: tensor}) -> the weighted loss."""
    import torch
    from torch import nn
    from pycaffe_dist.proto import caffe_pb2
    P = caffe_pb2.PoolingParameter
    E = caffe_pb2.EltwiseParameter

    class Step:
        """One layer: its torch function, bottoms and tops by name, its loss weight (0: not a loss)."""

        def __init__(self, fn, bottoms, tops, loss_weight=0.0):
            self.fn, self.bottoms, self.tops, self.loss_weight = fn, bottoms, tops, loss_weight

    class CaffeGraph(nn.Module):
        def __init__(self):
            super().__init__()
            self.steps, self.inputs = [], []

        def forward(self, inputs):
            blobs = dict(inputs)
            loss = 0.0
            for step in self.steps:
                out = step.fn(*[blobs[b] for b in step.bottoms])
                if step.loss_weight:
                    loss = loss + step.loss_weight * out
                    continue
                outs = out if isinstance(out, tuple) else (out,)
                for name, value in zip(step.tops, outs):
                    blobs[name] = value
            return loss

    graph = CaffeGraph()
    names = net.blob_names
    for layer_id, layer in enumerate(net.layers):
        lp = layer.param
        bottoms = [names[i] for i in net.bottom_ids[layer_id]]
        tops = [names[i] for i in net.top_ids[layer_id]]
        shapes = [net.blob_list[i].shape for i in net.bottom_ids[layer_id]]
        kind = lp.type

        def add(module, loss_weight=0.0, name=lp.name):
            if isinstance(module, nn.Module):
                graph.add_module("l%d_%s" % (layer_id, "".join(c if c.isalnum() else "_" for c in name)), module)
            graph.steps.append(Step(module, bottoms, tops, loss_weight))

        if kind == "Input":
            graph.inputs += tops
        elif kind == "Convolution":
            cp = lp.convolution_param
            kernel, stride, pad = _conv_geometry(cp)
            dilation = _pair(cp.dilation, 1)
            add(nn.Conv2d(shapes[0][1], cp.num_output, kernel, stride=stride, padding=pad, dilation=dilation,
                          groups=cp.group, bias=cp.bias_term))
        elif kind == "Pooling":
            pp = lp.pooling_param
            if pp.pool not in (P.MAX, P.AVE):
                raise Unsupported("bench: layer %s: no torch equivalent for pooling %s" % (lp.name, pp.pool))
            if pp.global_pooling:
                kernel, stride, pad = tuple(shapes[0][2:]), (1, 1), (0, 0)
            else:
                kernel = (pp.kernel_h, pp.kernel_w) if pp.HasField("kernel_h") else (pp.kernel_size,) * 2
                stride = (pp.stride_h, pp.stride_w) if pp.HasField("stride_h") else (pp.stride,) * 2
                pad = (pp.pad_h, pp.pad_w) if pp.HasField("pad_h") else (pp.pad,) * 2
            # Caffe rounds the output size up (ceil_mode), and its AVE divides by the window clipped to the padded
            # input, as torch's count_include_pad with ceil_mode does.
            add(nn.MaxPool2d(kernel, stride, pad, ceil_mode=True) if pp.pool == P.MAX else
                nn.AvgPool2d(kernel, stride, pad, ceil_mode=True, count_include_pad=True))
        elif kind == "ReLU":
            slope = lp.relu_param.negative_slope
            add(nn.LeakyReLU(slope) if slope else nn.ReLU())
        elif kind == "LRN":
            rp = lp.lrn_param
            if rp.norm_region != caffe_pb2.LRNParameter.ACROSS_CHANNELS:
                raise Unsupported("bench: layer %s: no torch equivalent for LRN WITHIN_CHANNEL" % lp.name)
            # Both divide alpha by the window size: k + alpha / n * sum(x^2), so Caffe's alpha passes unchanged.
            add(nn.LocalResponseNorm(rp.local_size, alpha=rp.alpha, beta=rp.beta, k=rp.k))
        elif kind == "Dropout":
            add(nn.Dropout(lp.dropout_param.dropout_ratio))
        elif kind == "InnerProduct":
            axis = lp.inner_product_param.axis if lp.inner_product_param.HasField("axis") else 1
            features = 1
            for d in shapes[0][axis:]:
                features *= d
            linear = nn.Linear(features, lp.inner_product_param.num_output, bias=lp.inner_product_param.bias_term)
            add(nn.Sequential(nn.Flatten(axis), linear))
        elif kind == "BatchNorm":
            # Caffe's BatchNorm normalises only (its scale and shift are a following Scale layer).
            bp = lp.batch_norm_param
            add(nn.BatchNorm2d(shapes[0][1], eps=bp.eps, momentum=1.0 - bp.moving_average_fraction, affine=False,
                               track_running_stats=True))
        elif kind == "Scale":
            if len(bottoms) != 1:
                raise Unsupported("bench: layer %s: Scale by a second bottom" % lp.name)
            add(_ChannelAffine(shapes[0][1], lp.scale_param.bias_term, torch))
        elif kind == "Eltwise":
            ep = lp.eltwise_param
            coeffs = list(ep.coeff) or [1.0] * len(bottoms)
            add(_Eltwise(ep.operation, coeffs, E, torch))
        elif kind == "Concat":
            axis = lp.concat_param.axis
            add(lambda *xs, axis=axis: torch.cat(xs, axis))
        elif kind == "Split":
            add(lambda x, n=len(tops): (x,) * n)
        elif kind == "Flatten":
            add(nn.Flatten(lp.flatten_param.axis))
        elif kind == "SoftmaxWithLoss":
            weight = layer.loss_weights[0] if layer.loss_weights else 1.0
            # Caffe's softmax runs over axis 1 with every other position (N x H x W of them) a sample; its default
            # normalisation (VALID) divides by their count, as cross_entropy's mean does.
            add(lambda x, label: nn.functional.cross_entropy(x.reshape(x.shape[0], x.shape[1], -1),
                                                             label.reshape(x.shape[0], -1).long()),
                loss_weight=weight)
        elif kind in ("Accuracy", "Silence"):
            continue
        else:
            raise Unsupported("bench: layer %s: no torch equivalent for layer type %s" % (lp.name, kind))
    return graph, torch


class _ChannelAffine:
    """Caffe's Scale layer over axis 1: y = x * gamma (+ beta), one of each per channel."""

    def __new__(cls, channels, bias, torch):
        from torch import nn

        class ChannelAffine(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(channels))
                self.bias = nn.Parameter(torch.zeros(channels)) if bias else None

            def forward(self, x):
                shape = (1, -1) + (1,) * (x.dim() - 2)
                y = x * self.weight.view(shape)
                return y + self.bias.view(shape) if self.bias is not None else y
        return ChannelAffine()


class _Eltwise:
    """Caffe's Eltwise: SUM (with coefficients), PROD, MAX."""

    def __new__(cls, operation, coeffs, E, torch):
        from torch import nn

        class Eltwise(nn.Module):
            def forward(self, *xs):
                if operation == E.SUM:
                    out = xs[0] * coeffs[0] if coeffs[0] != 1 else xs[0]
                    for c, x in zip(coeffs[1:], xs[1:]):
                        out = out + (x * c if c != 1 else x)
                    return out
                out = xs[0]
                for x in xs[1:]:
                    out = out * x if operation == E.PROD else torch.maximum(out, x)
                return out
        return Eltwise()
