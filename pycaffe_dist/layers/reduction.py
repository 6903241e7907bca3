"""Layers that reduce the values of a blob along its axes: Reduction (SUM, ASUM, SUMSQ or MEAN over the axes from
one on) and ArgMax (the top k values, or their positions, along an axis or per item).

Reduction has GPU code (csrc/cuda/reduction.cu, after Caffe's reduction_layer.cu); ArgMax has none, as in Caffe: the
Net runs its CPU code on the host copies on the GPU path."""
import numpy as np

from ..backend import select
from ..proto import caffe_pb2
from .base import Layer, checked_axis
from .registry import register


@register("ArgMax")
class ArgMaxLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1
    has_backward = False     # argmax_layer.hpp: Backward_cpu is NOT_IMPLEMENTED

    def layer_setup(self, bottom, top):
        # argmax_layer.cpp LayerSetUp
        p = self.param.argmax_param
        self.out_max_val = p.out_max_val
        self.top_k = p.top_k
        self.check(self.top_k >= 1, "top k must not be less than 1.")
        if p.HasField("axis"):
            self.axis = checked_axis(self, p.axis, len(bottom[0].shape), "argmax axis")
            self.check(self.top_k <= bottom[0].shape[self.axis], "top_k must be less than or equal to the dimension "
                       "of the axis (top_k %d, axis %d of %s)" % (self.top_k, self.axis, bottom[0].shape))
        else:
            self.axis = None
            self.check(self.top_k <= bottom[0].count_range(1), "top_k must be less than or equal to the dimension "
                       "of the flattened bottom blob per instance (top_k %d, bottom %s)"
                       % (self.top_k, bottom[0].shape))

    def reshape(self, bottom, top):
        if self.axis is not None:
            shape = list(bottom[0].shape)       # max_ind or max_val along the axis
            shape[self.axis] = self.top_k
        else:
            # (N, 1 or 2, top_k), padded with 1s to the bottom's number of axes
            shape = [1] * max(3, len(bottom[0].shape))
            shape[0] = bottom[0].shape[0]
            shape[2] = self.top_k
            if self.out_max_val:
                shape[1] = 2                    # max_ind and max_val
        top[0].reshape(shape)

    def forward(self, bottom, top):
        x = bottom[0].data
        values = x.reshape(x.shape[0], bottom[0].count_range(1)) if self.axis is None else np.moveaxis(x, self.axis, -1)
        dim = values.shape[-1]
        # Caffe partially sorts (value, index) pairs with std::greater: of equal values the larger index comes
        # first. Searching the reversed axis (first maximum, stable sort) picks it.
        reverse = values[..., ::-1]
        if self.top_k == 1:
            index = dim - 1 - np.argmax(reverse, axis=-1)[..., None]
        else:
            index = dim - 1 - np.argsort(-reverse, axis=-1, kind="stable")[..., :self.top_k]
        best = np.take_along_axis(values, index, axis=-1)
        if self.axis is not None:
            top[0].data[...] = np.moveaxis(best if self.out_max_val else index, -1, self.axis)
        elif self.out_max_val:
            out = top[0].data.reshape(index.shape[0], 2, self.top_k)
            out[:, 0] = index
            out[:, 1] = best
        else:
            top[0].data.reshape(index.shape)[...] = index

    def backward(self, top, propagate_down, bottom):
        raise self.error("ArgMax has no backward pass (Caffe: NOT_IMPLEMENTED)")

    def flops(self, bottom, top):
        return bottom[0].count * self.top_k     # partial sort: about one comparison per value and per k


# Values one thread of reduction_sum_parts adds up per pass: slices longer than this are cut into strided parts, summed
# by one thread each, and those sums summed again, so that a long slice (axis 0: the whole blob) is reduced by many
# threads at once and in a fixed order.
REDUCTION_PART = 256


@register("Reduction")
class ReductionLayer(Layer):
    """SUM, ASUM, SUMSQ or MEAN over all axes from reduction_param.axis on; top shape = bottom shape up to the
    axis (a 0-axis scalar for axis 0) (reduction_layer.cpp)."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.reduction_param
        self.op, self.coeff = p.operation, p.coeff

    def reshape(self, bottom, top):
        self.axis = checked_axis(self, self.param.reduction_param.axis, len(bottom[0].shape), "reduction axis")
        top[0].reshape(bottom[0].shape[:self.axis])
        self.dims = (bottom[0].count_range(0, self.axis), bottom[0].count_range(self.axis))
        # reduction_layer.cpp: MEAN scales by coeff / dim, computed once in the blob's precision
        real = bottom[0].dtype.type
        self.scale = real(self.coeff) / real(self.dims[1]) if self.op == caffe_pb2.ReductionParameter.MEAN \
            else real(self.coeff)

    def forward(self, bottom, top):
        R = caffe_pb2.ReductionParameter
        x = bottom[0].data.reshape(self.dims)
        if self.op == R.ASUM:
            r = np.abs(x).sum(axis=1)
        elif self.op == R.SUMSQ:
            r = np.einsum("ij,ij->i", x, x)
        else:
            r = x.sum(axis=1)
        if self.scale != 1:
            r *= self.scale
        top[0].data[...] = r.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        R = caffe_pb2.ReductionParameter
        coeff = top[0].diff.reshape(-1, 1) * self.scale      # one factor per reduced row
        x, diff = bottom[0].data.reshape(self.dims), bottom[0].diff.reshape(self.dims)
        if self.op == R.ASUM:
            np.multiply(np.sign(x), coeff, out=diff)
        elif self.op == R.SUMSQ:
            np.multiply(x, 2 * coeff, out=diff)
        else:
            diff[...] = coeff

    def forward_gpu(self, bottom, top):
        dev = select.current()
        num, dim = self.dims
        x, op, scratch = bottom[0].gpu_data, self.op, 0
        while True:
            parts = -(-dim // REDUCTION_PART)
            if parts <= 1:       # the last pass: whole slices, times coeff (/ dim for MEAN), into the top
                dev.launch("reduction_sum_parts", num, dim, 1, op, float(self.scale), x, top[0].mutable_gpu_data)
                return
            # the slices' parts into one of two scratch arrays (a pass reads the other): one slice of `parts` sums
            # per slice, the input of the next pass, which adds them as they are (SUM)
            y = self.buffer("parts %d" % scratch, num * parts, device=True, at_least=True)
            dev.launch("reduction_sum_parts", num * parts, dim, parts, op, 1.0, x, y)
            x, dim, op, scratch = y, parts, caffe_pb2.ReductionParameter.SUM, 1 - scratch

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        # reduction_layer.cu sets, signs or scales one slice at a time; one thread per bottom value here
        select.current().launch("reduction_backward", bottom[0].count, self.dims[1], self.op, float(self.scale),
                                bottom[0].gpu_data, top[0].gpu_diff, bottom[0].mutable_gpu_diff)

    def flops(self, bottom, top):
        R = caffe_pb2.ReductionParameter
        per = 2 if self.op in (R.ASUM, R.SUMSQ) else 1      # abs + add, or multiply-add
        scale = top[0].count if (self.coeff != 1 or self.op == R.MEAN) else 0
        return per * bottom[0].count + scale
