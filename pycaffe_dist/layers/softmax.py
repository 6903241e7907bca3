"""Softmax over one axis (Caffe's softmax_layer.cpp); SoftmaxWithLoss and InfogainLoss use the same kernel.
The GPU code (csrc/cuda/softmax.cu) follows softmax_layer.cu; its forward pass, gpu_helpers.gpu_softmax, is
SoftmaxWithLoss's too."""
from ..backend import select, softmax
from . import cudnn_engine
from .base import Layer, checked_axis
from .gpu_helpers import SOFTMAX_FLOPS_PER_ELEMENT, gpu_softmax
from .registry import register


@register("Softmax")
class SoftmaxLayer(Layer):
    """y = exp(x - max) / sum(exp(x - max)) over softmax_param.axis; in place allowed, as in Caffe."""
    reshape_from_shapes = True
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

    def _dims(self, blob):
        return blob.count_range(0, self.axis), blob.shape[self.axis], blob.count_range(self.axis + 1)

    def forward_gpu(self, bottom, top):
        if cudnn_engine.softmax_forward(self, bottom, top):     # engine CUDNN (layers/cudnn_engine.py)
            return
        outer, channels, inner = self._dims(bottom[0])
        gpu_softmax(bottom[0].gpu_data, top[0].mutable_gpu_data, outer, channels, inner,
                    self.buffer("scale", outer * inner, device=True))

    def backward_gpu(self, top, propagate_down, bottom):
        if cudnn_engine.softmax_backward(self, top, propagate_down, bottom) or not propagate_down[0]:
            return
        outer, channels, inner = self._dims(top[0])
        dot = self.buffer("scale", outer * inner, device=True)
        dev = select.current()
        # softmax_layer.cu: dot = sum over channels of dy * y; dx = (dy - dot) * y (subtract and multiply fused).
        dev.launch("softmax_channel_dot", outer * inner, channels, inner, top[0].gpu_diff, top[0].gpu_data, dot)
        dev.launch("softmax_backward_diff", top[0].count, channels, inner, dot, top[0].gpu_data, top[0].gpu_diff,
                   bottom[0].mutable_gpu_diff)

    def flops(self, bottom, top):
        return SOFTMAX_FLOPS_PER_ELEMENT * bottom[0].count

