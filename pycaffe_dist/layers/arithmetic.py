"""Element-wise arithmetic on blobs: Eltwise (the sum, product or maximum of its bottoms), and Bias and Scale (a blob
added to or multiplying bottom 0, broadcast from an axis), with the broadcast helpers Bias and Scale share.

GPU code mirrors Caffe's eltwise_layer.cu, bias_layer.cu and scale_layer.cu with the kernels of csrc/cuda/shape.cu
and math.cu and the device's BLAS."""
import numpy as np

from ..backend import select
from ..proto import caffe_pb2
from . import channel_sums
from .base import Layer, checked_axis
from .registry import register


@register("Eltwise")
class EltwiseLayer(Layer):
    reshape_from_shapes = True
    min_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        # eltwise_layer.cpp LayerSetUp
        p = self.param.eltwise_param
        self.op = p.operation
        self.check(len(p.coeff) in (0, len(bottom)), "Eltwise Layer takes one coefficient per bottom blob "
                   "(%d bottoms, %d coeffs)" % (len(bottom), len(p.coeff)))
        self.check(not (self.op == caffe_pb2.EltwiseParameter.PROD and len(p.coeff)),
                   "Eltwise layer only takes coefficients for summation.")
        self.coeffs = list(p.coeff) or [1.0] * len(bottom)
        self.stable_prod_grad = p.stable_prod_grad

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], 1):
            self.check(b.shape == bottom[0].shape, "all bottoms must have the same shape (bottom[0]: %s, "
                       "bottom[%d]: %s)" % (bottom[0].shape, i, b.shape))
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        E = caffe_pb2.EltwiseParameter
        y = top[0].data
        if self.op == E.PROD:
            np.multiply(bottom[0].data, bottom[1].data, out=y)
            for b in bottom[2:]:
                y *= b.data
        elif self.op == E.SUM:
            real = y.dtype.type
            np.multiply(bottom[0].data, real(self.coeffs[0]), out=y)
            for b, c in zip(bottom[1:], self.coeffs[1:]):
                y += b.data if c == 1 else real(c) * b.data
        else:
            # eltwise_layer.cpp: bottom 1 wins ties with bottom 0, later bottoms must be strictly greater
            first = bottom[0].data > bottom[1].data
            y[...] = np.where(first, bottom[0].data, bottom[1].data)
            self.max_idx = np.where(first, 0, 1)
            for i, b in enumerate(bottom[2:], 2):
                greater = b.data > y
                np.copyto(y, b.data, where=greater)
                self.max_idx[greater] = i

    def backward(self, top, propagate_down, bottom):
        E = caffe_pb2.EltwiseParameter
        top_diff = top[0].diff
        for i, (b, down) in enumerate(zip(bottom, propagate_down)):
            if not down:
                continue
            diff = b.diff
            if self.op == E.PROD:
                if self.stable_prod_grad:     # the product of the other bottoms, recomputed
                    others = [o.data for j, o in enumerate(bottom) if j != i]
                    diff[...] = others[0]
                    for o in others[1:]:
                        diff *= o
                else:                         # top / bottom: inf or nan where the bottom is 0, as Caffe
                    np.divide(top[0].data, b.data, out=diff)
                diff *= top_diff
            elif self.op == E.SUM:
                np.multiply(top_diff, diff.dtype.type(self.coeffs[i]), out=diff)
            else:
                np.copyto(diff, np.where(self.max_idx == i, top_diff, 0))

    def forward_gpu(self, bottom, top):
        # eltwise_layer.cu Forward_gpu, in the CPU code's order
        E = caffe_pb2.EltwiseParameter
        dev = select.current()
        n = top[0].count
        data = [b.gpu_data for b in bottom]
        y = top[0].mutable_gpu_data
        if self.op == E.PROD:
            dev.launch("gpu_mul", n, data[0], data[1], y)
            for d in data[2:]:
                dev.launch("gpu_mul", n, y, d, y)
        elif self.op == E.SUM:
            dev.launch("gpu_scale", n, self.coeffs[0], data[0], y)
            for d, c in zip(data[1:], self.coeffs[1:]):
                dev.axpy(n, c, d, y)
        else:
            mask = self.buffer("max_idx", n, np.int32, device=True)      # Caffe's max_idx_
            dev.launch("eltwise_max_forward", n, data[0], data[1], 0, y, mask)
            for i, d in enumerate(data[2:], 2):
                dev.launch("eltwise_max_forward", n, y, d, i, y, mask)

    def backward_gpu(self, top, propagate_down, bottom):
        E = caffe_pb2.EltwiseParameter
        dev = select.current()
        n = top[0].count
        top_diff = top[0].gpu_diff
        for i, (b, down) in enumerate(zip(bottom, propagate_down)):
            if not down:
                continue
            diff = b.mutable_gpu_diff
            if self.op == E.PROD:
                if self.stable_prod_grad:     # the product of the other bottoms, recomputed
                    others = [o.gpu_data for j, o in enumerate(bottom) if j != i]
                    dev.copy(diff, others[0])
                    for o in others[1:]:
                        dev.launch("gpu_mul", n, diff, o, diff)
                else:                         # top / bottom: inf or nan where the bottom is 0, as Caffe
                    dev.launch("gpu_div", n, top[0].gpu_data, b.gpu_data, diff)
                dev.launch("gpu_mul", n, diff, top_diff, diff)
            elif self.op == E.SUM:
                dev.launch("gpu_scale", n, self.coeffs[i], top_diff, diff)
            else:
                mask = self.buffer("max_idx", n, np.int32, device=True)
                dev.launch("eltwise_max_backward", n, top_diff, mask, i, diff)

    def flops(self, bottom, top):
        n = bottom[0].count * (len(bottom) - 1)     # one add / multiply / compare per extra bottom
        if self.op == caffe_pb2.EltwiseParameter.SUM and any(c != 1 for c in self.coeffs):
            n += bottom[0].count * len(bottom)      # the coefficients make each add a multiply-add
        return n


def _check_broadcast(layer, bottom0, param_blob, axis_param, what):
    """Scale/Bias Reshape: the scale/bias blob's shape must equal bottom 0's shape from the axis on
    (scale_layer.cpp, bias_layer.cpp). Returns the canonical axis (0 for a scalar blob, as Caffe)."""
    pshape = param_blob.shape
    axis = 0 if len(pshape) == 0 else checked_axis(layer, axis_param, len(bottom0.shape), "%s axis" % what)
    layer.check(len(bottom0.shape) >= axis + len(pshape), "%s blob's shape extends past bottom[0]'s shape when "
                "applied starting with bottom[0] axis = %d (%s blob %s, bottom %s)"
                % (what, axis, what, pshape, bottom0.shape))
    for i, d in enumerate(pshape):
        layer.check(bottom0.shape[axis + i] == d, "dimension mismatch between bottom[0]->shape(%d) and "
                    "%s->shape(%d) (bottom %s, %s %s)" % (axis + i, what, i, bottom0.shape, what, pshape))
    return axis


def _broadcast_dims(bottom0, blob, axis):
    """(outer, blob count, inner): bottom 0 seen as blocks that the blob's values multiply or shift."""
    return (bottom0.count_range(0, axis), blob.count, bottom0.count_range(axis + len(blob.shape)))


def _add_bias(y, bias, dims):
    """y (viewed as dims) += the bias broadcast over the outer and inner dimensions."""
    y3 = y.reshape(dims)
    y3 += bias.reshape(1, dims[1], 1)


def _bias_gradient(top_diff, dims, shape):
    """The bias's gradient: the top diff summed over the outer and inner dimensions."""
    return top_diff.reshape(dims).sum(axis=(0, 2)).reshape(shape)


def _learned_shape(layer, bottom0, axis_param, num_axes, what):
    """Shape of a learned scale/bias blob: bottom 0's axes [axis, axis + num_axes), num_axes -1 = to the end."""
    axis = checked_axis(layer, axis_param, len(bottom0.shape), "%s axis" % what)
    layer.check(num_axes >= -1, "num_axes must be non-negative, or -1 to extend to the end of bottom[0]")
    if num_axes >= 0:
        layer.check(len(bottom0.shape) >= axis + num_axes, "%s blob's shape extends past bottom[0]'s shape when "
                    "applied starting with bottom[0] axis = %d (num_axes %d, bottom %s)"
                    % (what, axis, num_axes, bottom0.shape))
    return bottom0.shape[axis:] if num_axes == -1 else bottom0.shape[axis:axis + num_axes]


@register("Bias")
class BiasLayer(Layer):
    """top = bottom0 + bias, the bias (bottom 1 or a learned blob) broadcast from bias_param.axis (bias_layer.cpp)."""
    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.bias_param
        if len(bottom) == 1 and not self.blobs:
            shape = _learned_shape(self, bottom[0], p.axis, p.num_axes, "bias")
            self.blobs = [self.make_param(shape, p.filler)]    # FillerParameter default: constant 0

    def reshape(self, bottom, top):
        bias = bottom[1] if len(bottom) > 1 else self.blobs[0]
        self.axis = _check_broadcast(self, bottom[0], bias, self.param.bias_param.axis, "bias")
        self.dims = _broadcast_dims(bottom[0], bias, self.axis)
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        bias = bottom[1] if len(bottom) > 1 else self.blobs[0]
        if top[0] is not bottom[0]:
            top[0].data[...] = bottom[0].data
        _add_bias(top[0].data, bias.data, self.dims)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0] and top[0] is not bottom[0]:     # in place, the top diff already is the bottom diff
            bottom[0].diff[...] = top[0].diff
        if len(bottom) > 1:
            if propagate_down[1]:
                bottom[1].diff[...] = _bias_gradient(top[0].diff, self.dims, bottom[1].shape)
        elif self.param_propagate_down[0]:
            self.blobs[0].diff += _bias_gradient(top[0].diff, self.dims, self.blobs[0].shape)

    def forward_gpu(self, bottom, top):
        bias = bottom[1] if len(bottom) > 1 else self.blobs[0]
        _, dim, inner = self.dims
        select.current().launch("bias_forward", top[0].count, bottom[0].gpu_data, bias.gpu_data, dim, inner,
                                top[0].mutable_gpu_data)

    def backward_gpu(self, top, propagate_down, bottom):
        dev = select.current()
        top_diff = top[0].gpu_diff
        if propagate_down[0] and top[0] is not bottom[0]:
            dev.copy(bottom[0].mutable_gpu_diff, top_diff)
        if len(bottom) > 1:
            if propagate_down[1]:
                channel_sums.sums(self, top_diff, top_diff, self.dims, out_a=bottom[1].mutable_gpu_diff)
        elif self.param_propagate_down[0]:
            channel_sums.sums(self, top_diff, top_diff, self.dims, out_a=self.blobs[0].mutable_gpu_diff, beta_a=1.0)

    def flops(self, bottom, top):
        return bottom[0].count


@register("Scale")
class ScaleLayer(Layer):
    """top = bottom0 * scale (+ bias), the scale (bottom 1 or a learned blob) broadcast from scale_param.axis
    (scale_layer.cpp). With bias_term the bias is the last blob, shaped as Caffe's internal Bias layer makes it."""
    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.scale_param
        expected = (1 if len(bottom) == 1 else 0) + (1 if p.bias_term else 0)
        if self.blobs:
            # "Skipping parameter initialization": the blobs came with the LayerParameter.
            self.check(len(self.blobs) == expected, "expected %d parameter blob(s) (scale%s), got %d"
                       % (expected, " + bias" if p.bias_term else "", len(self.blobs)))
            return
        if len(bottom) == 1:
            shape = _learned_shape(self, bottom[0], p.axis, p.num_axes, "scale")
            if p.HasField("filler"):
                filler = p.filler
            else:
                filler = caffe_pb2.FillerParameter(type="constant", value=1)   # identity by default
            self.blobs.append(self.make_param(shape, filler))
        if p.bias_term:
            # Caffe sets up a Bias layer on bottom 0 with num_axes = bottom 1's axes (two bottoms) or scale's.
            num_axes = len(bottom[1].shape) if len(bottom) > 1 else p.num_axes
            shape = _learned_shape(self, bottom[0], p.axis, num_axes, "bias")
            self.blobs.append(self.make_param(shape, p.bias_filler))   # default: constant 0

    def reshape(self, bottom, top):
        p = self.param.scale_param
        scale = bottom[1] if len(bottom) > 1 else self.blobs[0]
        self.axis = _check_broadcast(self, bottom[0], scale, p.axis, "scale")
        self.dims = _broadcast_dims(bottom[0], scale, self.axis)
        if p.bias_term:
            bias = self.blobs[-1]
            self.bias_dims = _broadcast_dims(bottom[0], bias, _check_broadcast(self, bottom[0], bias, p.axis, "bias"))
        top[0].reshape(bottom[0].shape)

    def assigns_scale_diff(self, two_bottoms):
        """Whether the scale's gradient is written over its diff rather than added to it: scale_layer.cpp writes its
        GEMV / eltwise result straight into the scale diff when outer_dim is 1 (unless a scalar scales inner_dim > 1
        values), so a learned scale's gradient is not accumulated there; a scale bottom's always is written."""
        outer, dim, inner = self.dims
        return two_bottoms or (outer == 1 and not (dim == 1 and inner > 1))

    def forward(self, bottom, top):
        scale = bottom[1] if len(bottom) > 1 else self.blobs[0]
        x = bottom[0].data
        if top[0] is bottom[0]:
            self.saved = x.copy()      # in place: the scale's gradient needs the input (Caffe's temp_)
        np.multiply(x.reshape(self.dims), scale.data.reshape(1, -1, 1), out=top[0].data.reshape(self.dims))
        if self.param.scale_param.bias_term:
            _add_bias(top[0].data, self.blobs[-1].data, self.bias_dims)

    def backward(self, top, propagate_down, bottom):
        two = len(bottom) > 1
        scale = bottom[1] if two else self.blobs[0]
        top_diff = top[0].diff
        if self.param.scale_param.bias_term and self.param_propagate_down[-1]:
            bias = self.blobs[-1]
            bias.diff += _bias_gradient(top_diff, self.bias_dims, bias.shape)
        dim = self.dims[1]
        if (two and propagate_down[1]) or (not two and self.param_propagate_down[0]):
            x = self.saved if top[0] is bottom[0] else bottom[0].data
            grad = (top_diff.reshape(self.dims) * x.reshape(self.dims)).sum(axis=(0, 2)).reshape(scale.shape)
            if self.assigns_scale_diff(two):
                scale.diff[...] = grad
            else:
                scale.diff += grad
        if propagate_down[0]:
            np.multiply(top_diff.reshape(self.dims), scale.data.reshape(1, dim, 1),
                        out=bottom[0].diff.reshape(self.dims))

    def forward_gpu(self, bottom, top):
        dev = select.current()
        scale = bottom[1] if len(bottom) > 1 else self.blobs[0]
        x, n = bottom[0].gpu_data, bottom[0].count
        y = top[0].mutable_gpu_data
        _, dim, inner = self.dims
        bias_term = self.param.scale_param.bias_term
        fused_bias = bias_term and self.bias_dims == self.dims
        if top[0] is bottom[0]:
            # In place, the scale's gradient needs the input (Caffe's temp_): kept in the same pass that scales it
            # (x * scale + bias in one pass, as ScaleBiasForward, where the bias is broadcast as the scale).
            bias = self.blobs[-1].gpu_data if fused_bias else scale.gpu_data
            dev.launch("scale_bias_forward_keeping", n, x, scale.gpu_data, bias, int(fused_bias), dim, inner,
                       self.buffer("saved", n, device=True), y)
        elif fused_bias:
            # scale_layer.cu's ScaleBiasForward: x * scale + bias in one pass (rounded twice, as the CPU's multiply
            # then add, in the host build; nvcc contracts it to an FMA as in Caffe)
            dev.launch("scale_bias_forward", n, x, scale.gpu_data, self.blobs[-1].gpu_data, dim, inner, y)
        else:
            dev.launch("scale_forward", n, x, scale.gpu_data, dim, inner, y)
        if bias_term and not fused_bias:
            _, bias_dim, bias_inner = self.bias_dims
            dev.launch("bias_forward", n, y, self.blobs[-1].gpu_data, bias_dim, bias_inner, y)

    def backward_gpu(self, top, propagate_down, bottom):
        # the CPU backward's sums and where they accumulate (its comments say where Caffe does); the bias's and the
        # scale's gradients come from one read of the top diff and the input (layers/channel_sums.py)
        two = len(bottom) > 1
        scale = bottom[1] if two else self.blobs[0]
        top_diff, n = top[0].gpu_diff, top[0].count
        _, dim, inner = self.dims
        want_bias = self.param.scale_param.bias_term and self.param_propagate_down[-1]
        want_scale = (two and propagate_down[1]) or (not two and self.param_propagate_down[0])
        bias_diff = None
        if want_bias and self.bias_dims != self.dims:
            channel_sums.sums(self, top_diff, top_diff, self.bias_dims, out_a=self.blobs[-1].mutable_gpu_diff,
                              beta_a=1.0)
        elif want_bias:
            bias_diff = self.blobs[-1].mutable_gpu_diff
        if want_scale:
            x = self.buffer("saved", n, device=True) if top[0] is bottom[0] else bottom[0].gpu_data
            assign = self.assigns_scale_diff(two)
            channel_sums.sums(self, top_diff, x, self.dims, out_a=bias_diff, beta_a=1.0,
                              out_ab=scale.mutable_gpu_diff, beta_ab=0.0 if assign else 1.0)
        elif bias_diff is not None:
            channel_sums.sums(self, top_diff, top_diff, self.dims, out_a=bias_diff, beta_a=1.0)
        if propagate_down[0]:
            select.current().launch("scale_forward", n, top_diff, scale.gpu_data, dim, inner,
                                    bottom[0].mutable_gpu_diff)

    def flops(self, bottom, top):
        return bottom[0].count * (2 if self.param.scale_param.bias_term else 1)
