"""Softmax over one axis (Caffe's softmax_layer.cpp); SoftmaxWithLoss and InfogainLoss use the same kernel."""
from ..backend import softmax
from .base import Layer, checked_axis
from .registry import register

SOFTMAX_FLOPS_PER_ELEMENT = 5   # max, subtract, exp, sum, divide


@register("Softmax")
class SoftmaxLayer(Layer):
    """y = exp(x - max) / sum(exp(x - max)) over softmax_param.axis; in place allowed, as in Caffe."""
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        self.axis = checked_axis(self, self.param.softmax_param.axis, len(bottom[0].shape), "softmax axis")
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        softmax.forward(bottom[0].data, top[0].data, self.axis)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            softmax.backward(top[0].data, top[0].diff, bottom[0].diff, self.axis)

    def flops(self, bottom, top):
        return SOFTMAX_FLOPS_PER_ELEMENT * bottom[0].count
