"""Softmax over one axis (Caffe's softmax_layer.cpp); SoftmaxWithLoss and InfogainLoss use the same kernel."""
from ..net.blob import canonical_axis
from .base import Layer
from .registry import register

SOFTMAX_FLOPS_PER_ELEMENT = 5   # max, subtract, exp, sum, divide


@register("Softmax")
class SoftmaxLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        self.axis = canonical_axis(self.param.softmax_param.axis, len(bottom[0].shape), "softmax axis")
        top[0].reshape(bottom[0].shape)

    def flops(self, bottom, top):
        return SOFTMAX_FLOPS_PER_ELEMENT * bottom[0].count
