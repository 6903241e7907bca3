"""A built TEST-phase Net as an ONNX graph: one emitter per Caffe layer type, each writing the ONNX nodes that
compute what our layer's forward computes, with the weights read from the net's blobs.

Why it is done this way:
- Shapes are static: every blob's shape is known once the net is built (Caffe's Reshape with 0 / -1, Flatten,
  Crop, the pooled sizes), so shape-changing layers become Reshape / Slice to the shapes our net computed, which
  is exact where re-deriving Caffe's rules in ONNX terms would not be. Export again with other input shapes
  (to_onnx's input_shapes, `export-onnx --input-shape`) for another batch size.
- Caffe writes blobs in place (ReLU on conv1); ONNX values are written once. Each write of a blob becomes its own
  value: the last write keeps the blob's name (the first, for an Input blob, which is the graph's input), earlier
  or later ones are named "<blob>/<layer that wrote it>". Graph inputs and outputs carry the net's blob names.
- Caffe's pooling is not ONNX's: the output size rounds up and the last window must start inside the image, and
  AVE divides by the window clipped to the padded input, not by the kernel size nor by the unpadded part. Pooling
  is written as an explicit zero Pad and a floor-mode AveragePool (count_include_pad 0) whose extra end padding
  reaches Caffe's output size: the divisor is then Caffe's exactly. MAX ignores padding in both, so only the end
  padding is extended.
- A layer with no ONNX form (data, loss and Python layers, recurrent nets, data-dependent shapes) stops the export
  with one line naming the layer and why; nothing is written (to_onnx writes a temporary file, renamed at the end).
"""
import os
import tempfile

import numpy as np

from ..blob.blob import canonical_axis, count
from ..errors import ExportError
from ..proto import caffe_pb2

MIN_OPSET = 13        # Softmax over one axis (Caffe's), Split / ReduceSum / Squeeze taking their sizes as inputs
DEFAULT_OPSET = 17
PROTOBUF_LIMIT = (2 << 30) - (64 << 20)     # a protobuf message is at most 2 GiB: room left for the graph
FLT_MIN = np.float32(np.finfo(np.float32).tiny)
PP = caffe_pb2.PoolingParameter

# Layer types that have no ONNX form, and why (docs/pycaffe.md: the layers that do not export).
REFUSED = {
    "Data": "a data layer reads a database: export a deploy net whose inputs are Input layers",
    "ImageData": "a data layer reads image files: export a deploy net whose inputs are Input layers",
    "WindowData": "a data layer reads image windows: export a deploy net whose inputs are Input layers",
    "HDF5Data": "a data layer reads HDF5 files: export a deploy net whose inputs are Input layers",
    "MemoryData": "its batches come from set_input_arrays: use an Input layer instead",
    "DummyData": "it generates its data from fillers: use an Input layer instead",
    "HDF5Output": "it writes files as a side effect; ONNX graphs have none",
    "Python": "its forward is user Python code",
    "LSTM": "a recurrent layer runs an inner unrolled net over the time axis, which is not exported",
    "RNN": "a recurrent layer runs an inner unrolled net over the time axis, which is not exported",
    "Filter": "its output size depends on the selector's values",
    "Accuracy": "it needs labels: export a deploy net without it",
    "SoftmaxWithLoss": "a loss layer needs labels: export a deploy net (Softmax for the probabilities)",
    "SigmoidCrossEntropyLoss": "a loss layer needs labels: export a deploy net",
    "EuclideanLoss": "a loss layer needs targets: export a deploy net",
    "HingeLoss": "a loss layer needs labels: export a deploy net",
    "ContrastiveLoss": "a loss layer needs pair labels: export a deploy net",
    "InfogainLoss": "a loss layer needs labels: export a deploy net",
    "MultinomialLogisticLoss": "a loss layer needs labels: export a deploy net",
}


def _onnx():
    """The onnx package, or the one-line reason there is none (it is an optional dependency)."""
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError:
        raise ExportError("ONNX export needs the onnx package: pip install 'pycaffe-dist[onnx]' "
                          "(or pip install onnx)") from None
    return onnx, helper, numpy_helper


class Graph:
    """The nodes and initializers being built; value and node names kept unique."""

    def __init__(self, opset, reserved=()):
        self.onnx, self.helper, self.numpy_helper = _onnx()
        self.opset = opset
        self.nodes, self.initializers = [], []
        self.used = set(reserved)
        self._params = {}      # id(blob) -> initializer name: a blob shared by layers is stored once

    def fresh(self, hint):
        name, i = hint, 1
        while name in self.used:
            name, i = "%s_%d" % (hint, i), i + 1
        self.used.add(name)
        return name

    def const(self, array, hint, dtype=np.float32):
        name = self.fresh(hint)
        self.initializers.append(self.numpy_helper.from_array(np.asarray(array, dtype=dtype), name))
        return name

    def ints(self, values, hint):
        return self.const(np.asarray(values, np.int64).reshape(-1), hint, np.int64)

    def scalar(self, value, hint):
        return self.const(np.float32(value), hint)

    def param(self, blob, hint, shape=None):
        """A layer's blob as an initializer (float32, reshaped to `shape` if given), once per blob and shape."""
        key = (id(blob), None if shape is None else tuple(shape))
        if key not in self._params:
            data = np.asarray(blob.data, np.float32)
            self._params[key] = self.const(data if shape is None else data.reshape(shape), hint)
        return self._params[key]

    def op(self, op_type, inputs, hint, out=None, outputs=1, **attrs):
        """Append a node; returns its output name (or list of names when outputs > 1). `out` names the output(s)
        where the caller wants a given value name (a blob's)."""
        if out is None:
            names = [self.fresh("%s_%d" % (hint, k) if outputs > 1 else hint) for k in range(outputs)]
        else:
            names = [out] if isinstance(out, str) else list(out)
        node = self.helper.make_node(op_type, list(inputs), names, name=self.fresh("%s:%s" % (hint, op_type)),
                                     **attrs)
        self.nodes.append(node)
        return names if outputs > 1 or not isinstance(out, (str, type(None))) else names[0]

    def reshape(self, x, shape, hint, out=None):
        return self.op("Reshape", [x, self.ints(shape, hint + "/shape")], hint + "/reshaped", out)

    def reduce(self, op_type, x, axes, keepdims, hint, out=None):
        """ReduceSum takes its axes as an input from opset 13, the other reductions from opset 18."""
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.op(op_type, [x, self.ints(axes, hint + "/axes")], hint, out, keepdims=int(keepdims))
        return self.op(op_type, [x], hint, out, axes=list(axes), keepdims=int(keepdims))


class LayerContext:
    """What an emitter sees of one layer: the layer, its bottoms' and tops' ONNX value names and blob shapes."""

    def __init__(self, graph, layer, bottoms, tops, bottom_shapes, top_shapes):
        self.g, self.layer = graph, layer
        self.bottoms, self.tops = bottoms, tops
        self.bottom_shapes, self.top_shapes = bottom_shapes, top_shapes

    @property
    def name(self):
        return self.layer.name

    def refuse(self, reason):
        raise ExportError("layer '%s' (%s): cannot be exported to ONNX: %s" % (self.layer.name, self.layer.type,
                                                                            reason))

    def hint(self, what):
        return "%s/%s" % (self.layer.name, what)

    def unary(self, op_type, **attrs):
        """The common case: one bottom, one top, one node."""
        self.g.op(op_type, [self.bottoms[0]], self.hint(op_type), self.tops[0], **attrs)


EMITTERS = {}


def emits(*types):
    def wrap(function):
        for t in types:
            EMITTERS[t] = function
        return function
    return wrap


# --- element-wise -------------------------------------------------------------------------------------------

@emits("ReLU")
def _relu(ctx):
    slope = ctx.layer.negative_slope
    if slope:
        ctx.unary("LeakyRelu", alpha=float(slope))
    else:
        ctx.unary("Relu")


@emits("PReLU")
def _prelu(ctx):
    # ONNX broadcasts the slope from the trailing axes: one slope per channel is (C, 1, ..., 1).
    shape = ctx.bottom_shapes[0]
    blob = ctx.layer.blobs[0]
    slope_shape = (1,) if blob.count == 1 else (blob.count,) + (1,) * (len(shape) - 2)
    ctx.g.op("PRelu", [ctx.bottoms[0], ctx.g.param(blob, ctx.hint("slope"), slope_shape)], ctx.hint("PRelu"),
             ctx.tops[0])


@emits("Sigmoid")
def _sigmoid(ctx):
    ctx.unary("Sigmoid")


@emits("TanH")
def _tanh(ctx):
    ctx.unary("Tanh")


@emits("AbsVal")
def _absval(ctx):
    ctx.unary("Abs")


@emits("BNLL")
def _bnll(ctx):
    ctx.unary("Softplus")      # log(1 + e^x), which Caffe computes in its overflow-safe form; so does Softplus


@emits("ELU")
def _elu(ctx):
    ctx.unary("Elu", alpha=float(ctx.layer.alpha))


@emits("Dropout")
def _dropout(ctx):
    ctx.unary("Identity")      # TEST phase: BVLC Caffe's dropout passes its input through (scaling is at TRAIN)


@emits("Split")
def _split(ctx):
    for top in ctx.tops:
        ctx.g.op("Identity", [ctx.bottoms[0]], ctx.hint("Identity"), top)


def _affine(ctx, x, scale, shift, hint):
    """scale * x + shift, skipping the identities."""
    g = ctx.g
    if scale != 1:
        x = g.op("Mul", [x, g.scalar(scale, ctx.hint(hint + "/scale"))], ctx.hint(hint + "/scaled"))
    if shift != 0:
        x = g.op("Add", [x, g.scalar(shift, ctx.hint(hint + "/shift"))], ctx.hint(hint + "/shifted"))
    return x


def _finish(ctx, x, hint):
    """x, an earlier node's output, is the layer's result: an Identity gives it the top's name."""
    ctx.g.op("Identity", [x], ctx.hint(hint), ctx.tops[0])


@emits("Power")
def _power(ctx):
    layer, g = ctx.layer, ctx.g
    x = _affine(ctx, ctx.bottoms[0], layer.scale, layer.shift, "power")
    if layer.power != 1:
        g.op("Pow", [x, g.scalar(layer.power, ctx.hint("exponent"))], ctx.hint("Pow"), ctx.tops[0])
    else:
        _finish(ctx, x, "power")


@emits("Exp")
def _exp(ctx):
    # Our layer (as Caffe's) computes outer_scale * exp(inner_scale * x), inner = scale * ln(base), outer = base^shift
    layer = ctx.layer
    x = _affine(ctx, ctx.bottoms[0], layer.inner_scale, 0, "exp")
    _scaled_op(ctx, "Exp", x, layer.outer_scale, "outer_scale")


def _scaled_op(ctx, op, x, factor, factor_name):
    """op(x) into the layer's top, times `factor` where it is not 1."""
    g = ctx.g
    if factor != 1:
        y = g.op(op, [x], ctx.hint(op))
        g.op("Mul", [y, g.scalar(factor, ctx.hint(factor_name))], ctx.hint("Mul"), ctx.tops[0])
    else:
        g.op(op, [x], ctx.hint(op), ctx.tops[0])


@emits("Log")
def _log(ctx):
    # log_base(shift + scale * x) = ln(shift + scale * x) / ln(base)
    layer = ctx.layer
    x = _affine(ctx, ctx.bottoms[0], layer.scale, layer.shift, "log")
    _scaled_op(ctx, "Log", x, layer.base_scale, "base_scale")


@emits("Threshold")
def _threshold(ctx):
    g = ctx.g
    above = g.op("Greater", [ctx.bottoms[0], g.scalar(ctx.layer.threshold, ctx.hint("threshold"))],
                 ctx.hint("above"))
    g.op("Cast", [above], ctx.hint("Cast"), ctx.tops[0], to=g.onnx.TensorProto.FLOAT)


@emits("Clip")
def _clip(ctx):
    g = ctx.g
    g.op("Clip", [ctx.bottoms[0], g.scalar(ctx.layer.min, ctx.hint("min")), g.scalar(ctx.layer.max, ctx.hint("max"))],
         ctx.hint("Clip"), ctx.tops[0])


@emits("Swish")
def _swish(ctx):
    g, x = ctx.g, ctx.bottoms[0]
    s = g.op("Sigmoid", [_affine(ctx, x, ctx.layer.beta, 0, "swish")], ctx.hint("Sigmoid"))
    g.op("Mul", [x, s], ctx.hint("Mul"), ctx.tops[0])


@emits("Eltwise")
def _eltwise(ctx):
    E = caffe_pb2.EltwiseParameter
    layer, g = ctx.layer, ctx.g
    if layer.op == E.PROD:
        y = ctx.bottoms[0]
        for i, b in enumerate(ctx.bottoms[1:], 1):
            y = g.op("Mul", [y, b], ctx.hint("Mul"), ctx.tops[0] if i == len(ctx.bottoms) - 1 else None)
    elif layer.op == E.SUM:
        terms = [b if c == 1 else g.op("Mul", [b, g.scalar(c, ctx.hint("coeff"))], ctx.hint("term"))
                 for b, c in zip(ctx.bottoms, layer.coeffs)]
        g.op("Sum", terms, ctx.hint("Sum"), ctx.tops[0])
    else:
        g.op("Max", list(ctx.bottoms), ctx.hint("Max"), ctx.tops[0])


def _operand_shape(blob_shape, axis, ndim):
    """A Scale / Bias operand covering axes [axis, axis + its ndim) of the bottom, as ONNX broadcasts it (from the
    trailing axes): its shape then ones to the end."""
    return tuple(blob_shape) + (1,) * (ndim - axis - len(blob_shape))


def _operand(ctx, source, axis, hint):
    """The operand's value: a learned blob (an initializer reshaped for broadcasting) or a bottom (reshaped)."""
    ndim = len(ctx.bottom_shapes[0])
    if isinstance(source, str):
        shape = ctx.bottom_shapes[1]
        wanted = _operand_shape(shape, axis, ndim)
        return source if wanted == tuple(shape) else ctx.g.reshape(source, wanted, ctx.hint(hint))
    return ctx.g.param(source, ctx.hint(hint), _operand_shape(source.shape, axis, ndim))


def _axis_of(shape, axis_param, operand_shape):
    return 0 if len(operand_shape) == 0 else canonical_axis(axis_param, len(shape))


@emits("Scale")
def _scale(ctx):
    layer, g, p = ctx.layer, ctx.g, ctx.layer.param.scale_param
    two = len(ctx.bottoms) > 1
    scale = ctx.bottoms[1] if two else layer.blobs[0]
    axis = _axis_of(ctx.bottom_shapes[0], p.axis, ctx.bottom_shapes[1] if two else scale.shape)
    y = g.op("Mul", [ctx.bottoms[0], _operand(ctx, scale, axis, "scale")], ctx.hint("Mul"),
             None if p.bias_term else ctx.tops[0])
    if p.bias_term:
        bias = layer.blobs[-1]
        bias_axis = _axis_of(ctx.bottom_shapes[0], p.axis, bias.shape)
        g.op("Add", [y, _operand(ctx, bias, bias_axis, "bias")], ctx.hint("Add"), ctx.tops[0])


@emits("Bias")
def _bias(ctx):
    layer, p = ctx.layer, ctx.layer.param.bias_param
    two = len(ctx.bottoms) > 1
    bias = ctx.bottoms[1] if two else layer.blobs[0]
    axis = _axis_of(ctx.bottom_shapes[0], p.axis, ctx.bottom_shapes[1] if two else bias.shape)
    ctx.g.op("Add", [ctx.bottoms[0], _operand(ctx, bias, axis, "bias")], ctx.hint("Add"), ctx.tops[0])


# --- convolution and inner products ---------------------------------------------------------------------------

def _conv_images(ctx, x, shape, channels, spatial, hint):
    """The (num, channels, *spatial) view ONNX convolves: Caffe convolves from any channel axis, and a bottom
    with no spatial axis as a 1-wide image."""
    want = (count(shape, 0, ctx.layer.channel_axis), channels) + spatial
    return x if tuple(shape) == want else ctx.g.reshape(x, want, ctx.hint(hint))


@emits("Convolution", "Deconvolution")
def _convolution(ctx):
    layer, g = ctx.layer, ctx.g
    spatial_axes = layer.num_spatial_axes
    geometry = (layer.kernel, layer.stride, layer.pad, layer.dilation) if spatial_axes else ((1,), (1,), (0,), (1,))
    kernel, stride, pad, dilation = (list(map(int, v)) for v in geometry)
    w = layer.blobs[0]
    weights = g.param(w, ctx.hint("weights"), tuple(w.shape[:2]) + tuple(kernel))
    inputs = [weights] + ([g.param(layer.blobs[1], ctx.hint("bias"))] if layer.bias_term else [])
    op_type = "ConvTranspose" if ctx.layer.type == "Deconvolution" else "Conv"
    for x, top, shape, top_shape in zip(ctx.bottoms, ctx.tops, ctx.bottom_shapes, ctx.top_shapes):
        axis = layer.channel_axis
        images = _conv_images(ctx, x, shape, shape[axis], tuple(shape[axis + 1:]) or (1,), "images")
        direct = images is x and len(top_shape) == axis + 1 + len(kernel) and axis == 1
        y = g.op(op_type, [images] + inputs, ctx.hint(op_type), top if direct else None, group=int(layer.group),
                 kernel_shape=kernel, strides=stride, pads=pad + pad, dilations=dilation)
        if not direct:
            g.reshape(y, top_shape, ctx.hint("top"), top)


@emits("Im2col")
def _im2col(ctx):
    # Caffe's column channel (c * kh + i) * kw + j holds input channel c at kernel offset (i, j): a grouped
    # convolution, one group per input channel, whose filters are the one-hot kernel positions. Each output is
    # one input value times 1 plus zeros: exact.
    layer, g = ctx.layer, ctx.g
    shape, axis = ctx.bottom_shapes[0], layer.channel_axis
    channels, kernel = shape[axis], tuple(int(k) for k in layer.kernel)
    positions = count(kernel)
    one_hot = np.eye(positions, dtype=np.float32).reshape((positions, 1) + kernel)
    weights = g.const(np.tile(one_hot, (channels, 1) + (1,) * len(kernel)), ctx.hint("one_hot"))
    images = _conv_images(ctx, ctx.bottoms[0], shape, channels, tuple(shape[axis + 1:]), "images")
    direct = axis == 1
    y = g.op("Conv", [images, weights], ctx.hint("Conv"), ctx.tops[0] if direct else None, group=int(channels),
             kernel_shape=list(kernel), strides=list(layer.stride), pads=list(layer.pad) * 2,
             dilations=list(layer.dilation))
    if not direct:
        g.reshape(y, ctx.top_shapes[0], ctx.hint("top"), ctx.tops[0])


@emits("InnerProduct")
def _inner_product(ctx):
    layer, g = ctx.layer, ctx.g
    shape = ctx.bottom_shapes[0]
    axis = canonical_axis(layer.param.inner_product_param.axis, len(shape))
    x = ctx.bottoms[0]
    if not (len(shape) == 2 and axis == 1):
        x = g.op("Flatten", [x], ctx.hint("rows"), axis=axis)      # (count before axis, K)
    inputs = [x, g.param(layer.blobs[0], ctx.hint("weights"))]
    if layer.bias_term:
        inputs.append(g.param(layer.blobs[1], ctx.hint("bias")))
    direct = len(ctx.top_shapes[0]) == 2
    y = g.op("Gemm", inputs, ctx.hint("Gemm"), ctx.tops[0] if direct else None, transB=int(not layer.transpose))
    if not direct:
        g.reshape(y, ctx.top_shapes[0], ctx.hint("top"), ctx.tops[0])


@emits("Embed")
def _embed(ctx):
    # Caffe's bottom holds the indices as floats; ONNX gathers rows by int64 indices.
    layer, g = ctx.layer, ctx.g
    index = g.op("Cast", [ctx.bottoms[0]], ctx.hint("index"), to=g.onnx.TensorProto.INT64)
    rows = g.op("Gather", [g.param(layer.blobs[0], ctx.hint("weights")), index], ctx.hint("Gather"),
                None if layer.bias_term else ctx.tops[0], axis=0)
    if layer.bias_term:
        g.op("Add", [rows, g.param(layer.blobs[1], ctx.hint("bias"))], ctx.hint("Add"), ctx.tops[0])


# --- pooling -------------------------------------------------------------------------------------------------

def _pool_nodes(ctx, method, x, shape, pooled, kernel, stride, pad, out, mask=None, hint="pool"):
    """Caffe's pooling of x (N, C, H, W) into `pooled` (its output size, from our net) as ONNX floor-mode pooling.

    The end of each axis is padded far enough for floor rounding to reach Caffe's size: (pooled - 1) * stride +
    kernel - size - pad, at least 0 and always less than the kernel, since Caffe's last window starts inside the
    image. MAX ignores padding (ONNX and Caffe alike). AVE pads with zeros explicitly first and excludes the
    ONNX end padding from its divisor: the divisor is then the window clipped to the padded input, as Caffe's."""
    g = ctx.g
    size = shape[2:]
    for n, o, s, p in zip(size, pooled, stride, pad):
        if o > 0 and (o - 1) * s - p >= n:
            ctx.refuse("its last pooling window lies wholly outside the input (input %s, kernel %s, stride %s)"
                       % (tuple(size), tuple(kernel), tuple(stride)))
    kernel, stride, pad = (list(map(int, v)) for v in (kernel, stride, pad))
    if method == PP.MAX:
        end = [max(0, (o - 1) * s + k - n - p) for n, o, s, p, k in zip(size, pooled, stride, pad, kernel)]
        outputs = [out] if mask is None else [out, g.fresh(ctx.hint(hint + "/indices"))]
        g.op("MaxPool", [x], ctx.hint(hint), outputs if mask is not None else out, outputs=len(outputs),
             kernel_shape=kernel, strides=stride, pads=pad + end)
        if mask is not None:
            # Caffe's mask top: the position h * W + w of each maximum in its plane, as a float. ONNX's indices
            # count over the whole (N, C, H, W) tensor.
            plane = g.const(np.int64(size[0] * size[1]), ctx.hint(hint + "/plane"), np.int64)
            position = g.op("Mod", [outputs[1], plane], ctx.hint(hint + "/position"))
            g.op("Cast", [position], ctx.hint(hint + "/mask"), mask, to=g.onnx.TensorProto.FLOAT)
        return
    padded = [n + 2 * p for n, p in zip(size, pad)]
    end = [max(0, (o - 1) * s + k - n) for n, o, s, k in zip(padded, pooled, stride, kernel)]
    if method == PP.AVE:
        if any(pad):
            pads = g.ints([0, 0] + pad + [0, 0] + pad, ctx.hint(hint + "/pads"))
            x = g.op("Pad", [x, pads, g.scalar(0, ctx.hint(hint + "/zero"))], ctx.hint(hint + "/padded"))
        g.op("AveragePool", [x], ctx.hint(hint), out, kernel_shape=kernel, strides=stride, pads=[0, 0] + end,
             count_include_pad=0)
        return
    # STOCHASTIC at TEST: sum(x^2) / sum(x) over each window (Caffe starts the sum at FLT_MIN, so a window of
    # zeros gives 0). The window sums are a grouped convolution with kernels of ones; Caffe pads nothing here.
    channels = shape[1]
    ones = g.const(np.ones((channels, 1) + tuple(kernel), np.float32), ctx.hint(hint + "/ones"))
    attrs = dict(group=int(channels), kernel_shape=kernel, strides=stride, pads=[0, 0] + end)
    squares = g.op("Mul", [x, x], ctx.hint(hint + "/squares"))
    num = g.op("Conv", [squares, ones], ctx.hint(hint + "/square_sums"), **attrs)
    den = g.op("Conv", [x, ones], ctx.hint(hint + "/sums"), **attrs)
    den = g.op("Add", [den, g.scalar(FLT_MIN, ctx.hint(hint + "/flt_min"))], ctx.hint(hint + "/sums_min"))
    g.op("Div", [num, den], ctx.hint(hint + "/Div"), out)


@emits("Pooling")
def _pooling(ctx):
    layer = ctx.layer
    method = layer.param.pooling_param.pool
    shape, pooled = ctx.bottom_shapes[0], ctx.top_shapes[0][2:]
    mask = ctx.tops[1] if len(ctx.tops) > 1 else None
    if layer.global_pooling and mask is None and method != PP.STOCHASTIC:
        ctx.unary("GlobalMaxPool" if method == PP.MAX else "GlobalAveragePool")
        return
    _pool_nodes(ctx, method, ctx.bottoms[0], shape, pooled, layer.kernel, layer.stride, layer.pad, ctx.tops[0],
                mask)


@emits("SPP")
def _spp(ctx):
    layer, g = ctx.layer, ctx.g
    method = layer.param.spp_param.pool
    if method == PP.STOCHASTIC:
        ctx.refuse("STOCHASTIC pyramid pooling samples at random, also at TEST (Caffe's inner Pooling layers are "
                   "built for TRAIN)")
    shape = ctx.bottom_shapes[0]
    if layer.pyramid_height == 1:
        kernel, stride, pad, pooled = layer.levels[0]
        _pool_nodes(ctx, method, ctx.bottoms[0], shape, pooled, kernel, stride, pad, ctx.tops[0])
        return
    flat = []
    for i, (kernel, stride, pad, pooled) in enumerate(layer.levels):
        y = g.fresh(ctx.hint("level%d" % i))
        _pool_nodes(ctx, method, ctx.bottoms[0], shape, pooled, kernel, stride, pad, y, hint="level%d" % i)
        flat.append(g.op("Flatten", [y], ctx.hint("level%d/flat" % i), axis=1))
    g.op("Concat", flat, ctx.hint("Concat"), ctx.tops[0], axis=1)


# --- normalization -------------------------------------------------------------------------------------------

@emits("LRN")
def _lrn(ctx):
    layer, g = ctx.layer, ctx.g
    if layer.across_channels:
        # ONNX's LRN is Caffe's: x / (k + alpha / size * sum of squares over the centred window) ^ beta
        ctx.unary("LRN", size=int(layer.size), alpha=float(layer.alpha), beta=float(layer.beta), bias=float(layer.k))
        return
    # WITHIN_CHANNEL, as Caffe's sub-net: x * (1 + alpha * mean of x^2 over the size x size window) ^ -beta, the
    # window zero-padded by (size - 1) / 2 and always divided by size^2 (k is not used).
    x, pre = ctx.bottoms[0], int(layer.pre_pad)
    squares = g.op("Mul", [x, x], ctx.hint("squares"))
    padded = g.op("Pad", [squares, g.ints([0, 0, pre, pre, 0, 0, pre, pre], ctx.hint("pads")),
                          g.scalar(0, ctx.hint("zero"))], ctx.hint("padded"))
    mean = g.op("AveragePool", [padded], ctx.hint("window_mean"), kernel_shape=[layer.size] * 2, strides=[1, 1])
    base = _affine(ctx, mean, layer.alpha, 1, "base")
    scale = g.op("Pow", [base, g.scalar(-layer.beta, ctx.hint("minus_beta"))], ctx.hint("Pow"))
    g.op("Mul", [x, scale], ctx.hint("Mul"), ctx.tops[0])


@emits("BatchNorm")
def _batch_norm(ctx):
    layer, g = ctx.layer, ctx.g
    shape = ctx.bottom_shapes[0]
    channels = shape[1]
    x = ctx.bottoms[0]
    if layer.use_global_stats:
        # The stored sums divided by the moving-average factor (0 if the factor is 0), as our forward and Caffe's.
        factor = np.float32(layer.blobs[2].data.reshape(-1)[0])
        factor = np.float32(0) if factor == 0 else np.float32(1) / factor
        mean = factor * np.asarray(layer.blobs[0].data, np.float32).reshape(-1)
        var = factor * np.asarray(layer.blobs[1].data, np.float32).reshape(-1)
        ones, zeros = np.ones(channels, np.float32), np.zeros(channels, np.float32)
        g.op("BatchNormalization", [x, g.const(ones, ctx.hint("gamma")), g.const(zeros, ctx.hint("beta")),
                                    g.const(mean, ctx.hint("mean")), g.const(var, ctx.hint("variance"))],
             ctx.hint("BatchNormalization"), ctx.tops[0], epsilon=float(layer.eps))
        return
    # use_global_stats false at TEST: the batch's own statistics (biased variance), over all but the channel axis.
    axes = [0] + list(range(2, len(shape)))
    mean = g.reduce("ReduceMean", x, axes, True, ctx.hint("mean"))
    centred = g.op("Sub", [x, mean], ctx.hint("centred"))
    var = g.reduce("ReduceMean", g.op("Mul", [centred, centred], ctx.hint("squares")), axes, True,
                   ctx.hint("variance"))
    std = g.op("Sqrt", [g.op("Add", [var, g.scalar(layer.eps, ctx.hint("eps"))], ctx.hint("var_eps"))],
               ctx.hint("std"))
    g.op("Div", [centred, std], ctx.hint("Div"), ctx.tops[0])


@emits("MVN")
def _mvn(ctx):
    layer, g = ctx.layer, ctx.g
    mp = layer.param.mvn_param
    shape = ctx.bottom_shapes[0]
    legacy = tuple(shape) + (1,) * (4 - len(shape))      # Caffe's num / channels / height / width
    rows = legacy[0] if mp.across_channels else legacy[0] * legacy[1]
    x = g.reshape(ctx.bottoms[0], (rows, -1), ctx.hint("rows"))
    y = g.op("Sub", [x, g.reduce("ReduceMean", x, [1], True, ctx.hint("mean"))], ctx.hint("centred"))
    if mp.normalize_variance:
        # Caffe adds eps to the standard deviation, not to the variance.
        var = g.reduce("ReduceMean", g.op("Mul", [y, y], ctx.hint("squares")), [1], True, ctx.hint("variance"))
        std = g.op("Add", [g.op("Sqrt", [var], ctx.hint("sqrt")), g.scalar(mp.eps, ctx.hint("eps"))], ctx.hint("std"))
        y = g.op("Div", [y, std], ctx.hint("normalized"))
    g.reshape(y, ctx.top_shapes[0], ctx.hint("top"), ctx.tops[0])


@emits("Softmax")
def _softmax(ctx):
    ctx.unary("Softmax", axis=int(ctx.layer.axis))     # opset >= 13: over that one axis, as Caffe's


# --- shapes and selection ------------------------------------------------------------------------------------

@emits("Flatten", "Reshape")
def _reshape(ctx):
    ctx.g.reshape(ctx.bottoms[0], ctx.top_shapes[0], ctx.hint("shape"), ctx.tops[0])


@emits("Concat")
def _concat(ctx):
    if len(ctx.bottoms) == 1:
        ctx.unary("Identity")
    else:
        ctx.g.op("Concat", list(ctx.bottoms), ctx.hint("Concat"), ctx.tops[0], axis=int(ctx.layer.axis))


@emits("Slice")
def _slice(ctx):
    layer, g = ctx.layer, ctx.g
    if len(ctx.tops) == 1:
        ctx.unary("Identity")
        return
    sizes = [b - a for a, b in zip(layer.starts, layer.starts[1:])]
    g.op("Split", [ctx.bottoms[0], g.ints(sizes, ctx.hint("sizes"))], ctx.hint("Split"), list(ctx.tops),
         outputs=len(ctx.tops), axis=int(layer.axis))


@emits("Crop")
def _crop(ctx):
    # Bottom 1 only gives the shape: the crop window is fixed (our net computed its offsets).
    g = ctx.g
    axes = [i for i, (a, b) in enumerate(zip(ctx.bottom_shapes[0], ctx.top_shapes[0])) if a != b]
    if not axes:
        ctx.unary("Identity")
        return
    starts = [ctx.layer.offsets[i] for i in axes]
    ends = [s + ctx.top_shapes[0][i] for s, i in zip(starts, axes)]
    g.op("Slice", [ctx.bottoms[0], g.ints(starts, ctx.hint("starts")), g.ints(ends, ctx.hint("ends")),
                   g.ints(axes, ctx.hint("axes"))], ctx.hint("Slice"), ctx.tops[0])


@emits("Tile")
def _tile(ctx):
    # Caffe repeats the block of axes [axis, end) `tiles` times: ONNX's Tile along that axis.
    shape = ctx.bottom_shapes[0]
    axis = canonical_axis(ctx.layer.param.tile_param.axis, len(shape))
    repeats = [1] * len(shape)
    repeats[axis] = int(ctx.layer.param.tile_param.tiles)
    ctx.g.op("Tile", [ctx.bottoms[0], ctx.g.ints(repeats, ctx.hint("repeats"))], ctx.hint("Tile"), ctx.tops[0])


@emits("BatchReindex")
def _batch_reindex(ctx):
    g = ctx.g
    index = g.op("Cast", [ctx.bottoms[1]], ctx.hint("index"), to=g.onnx.TensorProto.INT64)
    g.op("Gather", [ctx.bottoms[0], index], ctx.hint("Gather"), ctx.tops[0], axis=0)


@emits("Parameter")
def _parameter(ctx):
    ctx.g.op("Identity", [ctx.g.param(ctx.layer.blobs[0], ctx.hint("value"))], ctx.hint("Identity"), ctx.tops[0])


@emits("Silence")
def _silence(ctx):
    pass     # no tops: its bottoms just end there


@emits("Reduction")
def _reduction(ctx):
    R = caffe_pb2.ReductionParameter
    layer, g = ctx.layer, ctx.g
    outer = layer.dims[0]
    rows = g.reshape(ctx.bottoms[0], (outer, -1), ctx.hint("rows"))
    op_type = {R.SUM: "ReduceSum", R.MEAN: "ReduceSum", R.ASUM: "ReduceL1", R.SUMSQ: "ReduceSumSquare"}[layer.op]
    y = g.reduce(op_type, rows, [1], False, ctx.hint(op_type))
    if layer.scale != 1:     # coeff, divided by the count for MEAN (in float32, as our forward)
        y = g.op("Mul", [y, g.scalar(layer.scale, ctx.hint("coeff"))], ctx.hint("scaled"))
    g.reshape(y, ctx.top_shapes[0], ctx.hint("top"), ctx.tops[0])


@emits("ArgMax")
def _argmax(ctx):
    # Of equal values Caffe ranks the larger index first, ONNX's TopK the smaller: TopK runs on the axis reversed,
    # and the indices are mapped back (dim - 1 - i).
    layer, g = ctx.layer, ctx.g
    shape = ctx.bottom_shapes[0]
    if layer.axis is None:
        x = g.op("Flatten", [ctx.bottoms[0]], ctx.hint("rows"), axis=1)
        axis, dim = 1, count(shape, 1)
    else:
        x, axis, dim = ctx.bottoms[0], int(layer.axis), shape[layer.axis]
    reverse = g.op("Slice", [x, g.ints([-1], ctx.hint("start")), g.ints([-dim - 1], ctx.hint("end")),
                             g.ints([axis], ctx.hint("axis")), g.ints([-1], ctx.hint("step"))], ctx.hint("reversed"))
    values, index = g.op("TopK", [reverse, g.ints([layer.top_k], ctx.hint("k"))], ctx.hint("TopK"), outputs=2,
                         axis=axis, largest=1, sorted=1)
    index = g.op("Sub", [g.const(np.int64(dim - 1), ctx.hint("last"), np.int64), index], ctx.hint("index"))
    index = g.op("Cast", [index], ctx.hint("index_float"), to=g.onnx.TensorProto.FLOAT)
    top_shape = ctx.top_shapes[0]
    if layer.axis is not None:
        _finish(ctx, values if layer.out_max_val else index, "top")
        return
    if layer.out_max_val:      # (N, 2, top_k): the indices, then the values
        index = g.op("Concat", [g.reshape(index, (shape[0], 1, layer.top_k), ctx.hint("index3")),
                                g.reshape(values, (shape[0], 1, layer.top_k), ctx.hint("values3"))],
                     ctx.hint("Concat"), axis=1)
    g.reshape(index, top_shape, ctx.hint("top"), ctx.tops[0])


@emits("LSTMUnit")
def _lstm_unit(ctx):
    # c = cont * sigmoid(f) * c_prev + sigmoid(i) * tanh(g); h = sigmoid(o) * tanh(c); the gates are the four
    # quarters (i, f, o, g) of the last axis of bottom 1.
    g = ctx.g
    c_prev, x, cont = ctx.bottoms
    hidden = ctx.bottom_shapes[0][2]
    parts = g.op("Split", [x, g.ints([hidden] * 4, ctx.hint("sizes"))], ctx.hint("gates"), outputs=4, axis=2)
    i, f, o = (g.op("Sigmoid", [p], ctx.hint(n)) for p, n in zip(parts[:3], "ifo"))
    cell_in = g.op("Tanh", [parts[3]], ctx.hint("g"))
    cont3 = g.reshape(cont, tuple(ctx.bottom_shapes[2]) + (1,), ctx.hint("cont"))
    f = g.op("Mul", [f, cont3], ctx.hint("f_cont"))
    c = g.op("Add", [g.op("Mul", [f, c_prev], ctx.hint("kept")), g.op("Mul", [i, cell_in], ctx.hint("new"))],
             ctx.hint("c"), ctx.tops[0])
    g.op("Mul", [o, g.op("Tanh", [c], ctx.hint("tanh_c"))], ctx.hint("h"), ctx.tops[1])


# --- the net -------------------------------------------------------------------------------------------------

def value_names(net):
    """{(layer id, top index): ONNX value name} for every write of every blob (see the module docstring)."""
    writes = {}
    for layer_id, tops in enumerate(net.top_ids):
        for j, blob_id in enumerate(tops):
            writes.setdefault(blob_id, []).append((layer_id, j))
    names, later = {}, []
    for blob_id, ws in writes.items():
        base = net.blob_names[blob_id]
        if base == "(automatic)":        # an anonymous top (auto_top_blobs): named after its layer
            base = "%s/top%d" % (net.layer_names[ws[0][0]], ws[0][1])
        keep = 0 if net.layers[ws[0][0]].type == "Input" else len(ws) - 1
        for k, w in enumerate(ws):
            if k == keep:
                names[w] = base
            else:
                later.append((w, "%s/%s" % (base, net.layer_names[w[0]])))
    used = set(names.values())
    for w, name in later:
        unique, i = name, 1
        while unique in used:
            unique, i = "%s_%d" % (name, i), i + 1
        used.add(unique)
        names[w] = unique
    return names


def check_opset(opset):
    onnx, _, _ = _onnx()
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ExportError("opset %d is not supported: choose one from %d (Softmax over one axis, as Caffe's) to %d "
                          "(the newest this onnx package knows)" % (opset, MIN_OPSET, newest))


def build_model(net, opset=DEFAULT_OPSET):
    """The ModelProto of a built TEST-phase net (its current blob shapes, its weights)."""
    check_opset(opset)
    if net.phase != caffe_pb2.TEST:
        raise ExportError("net '%s': export needs a net built for the TEST phase (Dropout, BatchNorm and pooling "
                          "compute their TRAIN forms otherwise)" % net.name)
    names = value_names(net)
    graph = Graph(opset, reserved=names.values())
    helper, onnx = graph.helper, graph.onnx
    current, inputs = {}, []

    def info(name, shape):
        return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [int(d) for d in shape])

    for layer_id, layer in enumerate(net.layers):
        bottom_ids, top_ids = net.bottom_ids[layer_id], net.top_ids[layer_id]
        tops = [names[(layer_id, j)] for j in range(len(top_ids))]
        if layer.type == "Input":
            for name, blob_id in zip(tops, top_ids):
                inputs.append(info(name, net.blob_list[blob_id].shape))
        else:
            ctx = LayerContext(graph, layer, [current[b] for b in bottom_ids], tops,
                               [tuple(net.blob_list[b].shape) for b in bottom_ids],
                               [tuple(net.blob_list[t].shape) for t in top_ids])
            if layer.type in REFUSED:
                ctx.refuse(REFUSED[layer.type])
            emitter = EMITTERS.get(layer.type)
            if emitter is None:
                ctx.refuse("no ONNX form is known for this layer type")
            emitter(ctx)
        for name, blob_id in zip(tops, top_ids):
            current[blob_id] = name
    outputs = [info(current[b], net.blob_list[b].shape) for b in net.output_ids]
    if not outputs:
        raise ExportError("net '%s' has no output blob to export" % net.name)
    onnx_graph = helper.make_graph(graph.nodes, net.name or "net", inputs, outputs, graph.initializers,
                                   doc_string="Caffe net '%s', exported by pycaffe-dist" % net.name)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="pycaffe-dist",
                              producer_version=_version())
    # The oldest IR version that carries this opset: older runtimes load it too.
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


def _version():
    try:
        from importlib.metadata import version
        return version("pycaffe-dist")
    except Exception:      # not installed as a distribution (a source tree on sys.path)
        return ""


def load_net(model, weights=None, input_shapes=None):
    """Our TEST-phase Net of a prototxt (and .caffemodel), with `input_shapes` ({input blob: shape}) applied."""
    from ..io.caffemodel import load_weights
    from ..io.load import read_net
    from ..net.net import Net
    net = Net(read_net(os.fspath(model)), phase=caffe_pb2.TEST)
    if weights is not None:
        load_weights(net, os.fspath(weights))
    reshape_inputs(net, input_shapes)
    return net


def reshape_inputs(net, input_shapes):
    """Set the shapes of the net's input blobs ({name: shape}) and reshape the net after them."""
    if not input_shapes:
        return
    for name, shape in input_shapes.items():
        if name not in net.inputs:
            raise ExportError("net '%s' has no input blob '%s' (its inputs: %s)"
                              % (net.name, name, ", ".join(net.inputs) or "none"))
        shape = tuple(int(d) for d in shape)
        if any(d <= 0 for d in shape):
            raise ExportError("input '%s': shape %s must have positive dimensions" % (name, shape))
        net.blob_by_name(name).reshape(shape)
    net.reshape()


def to_onnx(net_or_paths, path, opset=DEFAULT_OPSET, input_shapes=None, check=True):
    """Write a net as an ONNX model at `path`; returns the ModelProto.

    net_or_paths: a built TEST-phase Net (ours or pycaffe's), a prototxt path, or (prototxt, caffemodel).
    input_shapes: {input blob name: shape} to export other shapes than the prototxt's (a Net given here is
    reshaped). check: run onnx's checker on the model first. Nothing is left at `path` when the export fails."""
    if isinstance(net_or_paths, (str, bytes, os.PathLike)):
        net = load_net(net_or_paths, None, input_shapes)
    elif isinstance(net_or_paths, (tuple, list)):
        net = load_net(*net_or_paths, input_shapes=input_shapes)
    else:
        net = net_or_paths
        reshape_inputs(net, input_shapes)
    model = build_model(net, opset)
    weight_bytes = sum(len(i.raw_data) for i in model.graph.initializer)
    if weight_bytes > PROTOBUF_LIMIT:
        raise ExportError("net '%s': its weights take %.2f GB, past the 2 GB a single ONNX file can hold (ONNX's "
                          "external data files are not written by this exporter)" % (net.name, weight_bytes / 1e9))
    onnx = _onnx()[0]
    if check:
        onnx.checker.check_model(model)
    data = model.SerializeToString()
    write_atomically(os.fspath(path), data)
    return model


def write_atomically(path, data):
    """Write to a temporary file beside `path`, then rename it there: a reader never sees a partial model."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            # mkstemp's file is the owner's alone; the model gets the mode any new file of the user's gets
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
