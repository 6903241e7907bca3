"""Convolution, Deconvolution and Im2col (im2col/col2im kernels in csrc/im2col.pyx, GEMMs in backend/conv.py).

Parameter parsing and shapes follow Caffe's src/caffe/layers/base_conv_layer.cpp (LayerSetUp, Reshape),
conv_layer.cpp / deconv_layer.cpp (compute_output_shape, Forward_cpu, Backward_cpu) and im2col_layer.cpp.
"""
import numpy as np

from ..backend.conv import ConvEngine
from .._kernels import im2col as _k
from ..net.blob import count
from .base import Layer, c_div, check_param_shapes, checked_axis
from .registry import register


def parse_conv_geometry(layer, cp, num_spatial_axes):
    """kernel, stride, pad, dilation (one tuple entry per spatial axis) from a ConvolutionParameter, with the
    CHECKs of BaseConvolutionLayer::LayerSetUp (the same in Im2colLayer::LayerSetUp)."""
    n = num_spatial_axes

    def per_axis(name, values, default):
        # A repeated field: once for all axes, once per axis, or (where there is a default) not at all.
        values = list(values)
        layer.check(len(values) in ((1, n) if default is None else (0, 1, n)),
                    "%s must be specified once, or once per spatial dimension (%s specified %d times; "
                    "%d spatial dims)." % (name, name, len(values), n))
        if not values:
            return (default,) * n
        return tuple(values[0] if len(values) == 1 else values[i] for i in range(n))

    def hw(name, repeated_name, h_field, w_field, default):
        if cp.HasField(h_field) or cp.HasField(w_field):
            layer.check(n == 2, "%s & %s can only be used for 2D convolution." % (h_field, w_field))
            layer.check(len(getattr(cp, repeated_name)) == 0,
                        "Either %s or %s/w should be specified; not both." % (repeated_name, name + "_h"))
            return (getattr(cp, h_field), getattr(cp, w_field))
        return per_axis(repeated_name, getattr(cp, repeated_name), default)

    kernel = hw("kernel", "kernel_size", "kernel_h", "kernel_w", None)
    layer.check(all(k > 0 for k in kernel), "Filter dimensions must be nonzero.")
    stride = hw("stride", "stride", "stride_h", "stride_w", 1)
    layer.check(all(s > 0 for s in stride), "Stride dimensions must be nonzero.")
    pad = hw("pad", "pad", "pad_h", "pad_w", 0)
    dilation = per_axis("dilation", cp.dilation, 1)
    return kernel, stride, pad, dilation


def setup_geometry(layer, cp, shape):
    """The layer's channel axis, spatial axis count, kernel/stride/pad/dilation and force_nd_im2col, for a bottom
    of `shape` (Convolution, Deconvolution and Im2col read them alike)."""
    layer.force_nd_im2col = cp.force_nd_im2col
    layer.channel_axis = checked_axis(layer, cp.axis, len(shape))
    layer.num_spatial_axes = len(shape) - layer.channel_axis - 1
    layer.kernel, layer.stride, layer.pad, layer.dilation = parse_conv_geometry(layer, cp, layer.num_spatial_axes)


def conv_out_dim(size, kernel, stride, pad, dilation):
    """ConvolutionLayer::compute_output_shape (and Im2colLayer::Reshape), with C's truncating division."""
    return c_div(size + 2 * pad - (dilation * (kernel - 1) + 1), stride) + 1


def deconv_out_dim(size, kernel, stride, pad, dilation):
    """DeconvolutionLayer::compute_output_shape."""
    return stride * (size - 1) + (dilation * (kernel - 1) + 1) - 2 * pad


# --- layers -------------------------------------------------------------------------------------------------

class _BaseConvolution(Layer):
    """Caffe's BaseConvolutionLayer: N spatial axes after `axis`, weights (out, in / group, *kernel)."""
    min_bottom = 1
    min_top = 1
    equal_num_bottom_top = True
    reverse_dimensions = False   # True for Deconvolution: the weights map num_output -> channels

    def layer_setup(self, bottom, top):
        cp = self.param.convolution_param
        shape = bottom[0].shape
        setup_geometry(self, cp, shape)
        self.channels = shape[self.channel_axis]
        self.num_output = cp.num_output
        self.check(self.num_output > 0, "num_output must be positive")
        self.group = cp.group
        self.check(self.group > 0, "group must be positive")
        self.check(self.channels % self.group == 0, "the number of input channels (%d) must be a multiple of "
                   "group (%d)" % (self.channels, self.group))
        self.check(self.num_output % self.group == 0, "Number of output should be multiples of group "
                   "(num_output %d, group %d)." % (self.num_output, self.group))
        if self.reverse_dimensions:
            conv_out, conv_in = self.channels, self.num_output
        else:
            conv_out, conv_in = self.num_output, self.channels
        self.bias_term = cp.bias_term
        expected = [(conv_out, conv_in // self.group) + self.kernel]
        if self.bias_term:
            expected.append((self.num_output,))
        if self.blobs:
            check_param_shapes(self, expected)          # "Skipping parameter initialization"
        else:
            self.blobs = [self.make_param(expected[0], cp.weight_filler)]
            if self.bias_term:
                self.blobs.append(self.make_param(expected[1], cp.bias_filler))

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.check(len(shape) == self.channel_axis + 1 + self.num_spatial_axes, "bottom num_axes may not change.")
        self.check(shape[self.channel_axis] == self.channels, "Input size incompatible with convolution kernel.")
        for i, b in enumerate(bottom[1:], 1):
            self.check(b.shape == shape, "shape mismatch - bottom[0]: %s vs. bottom[%d]: %s" % (shape, i, b.shape))
        self.input_spatial = shape[self.channel_axis + 1:]
        self.output_spatial = tuple(self.out_dim(*a) for a in zip(self.input_spatial, self.kernel, self.stride,
                                                                  self.pad, self.dilation))
        self.check(all(d >= 0 for d in self.output_spatial),
                   "the kernel does not fit the input: input %s, kernel %s, stride %s, pad %s, dilation %s give "
                   "output %s" % (self.input_spatial, self.kernel, self.stride, self.pad, self.dilation,
                                  self.output_spatial))
        top_shape = shape[:self.channel_axis] + (self.num_output,) + self.output_spatial
        for t in top:
            t.reshape(top_shape)
        self.num = count(shape, 0, self.channel_axis)
        # The engine unrolls the side im2col reads: the bottom of a convolution, the top of a deconvolution.
        if self.reverse_dimensions:
            im_shape, out_channels = (self.num_output,) + self.output_spatial, self.channels
        else:
            im_shape, out_channels = (self.channels,) + self.input_spatial, self.num_output
        key = (im_shape, out_channels)
        if getattr(self, "_engine_key", None) != key:
            self._engine_key = key
            self.engine = ConvEngine(im_shape, self.kernel, self.pad, self.stride, self.dilation, self.group,
                                     out_channels, self.force_nd_im2col)

    def _images(self, array, channels):
        return array.reshape((self.num, channels) + array.shape[self.channel_axis + 1:])

    def _bias(self):
        return self.blobs[1].data if self.bias_term else None

    def forward(self, bottom, top):
        w, c_in, c_out = self.blobs[0].data, self.channels, self.num_output
        for b, t in zip(bottom, top):
            x, y = self._images(b.data, c_in), self._images(t.data, c_out)
            if self.reverse_dimensions:
                self.engine.output_to_image(w, x, ims_out=y)
                if self.bias_term:
                    y.reshape(self.num, c_out, count(self.output_spatial))[...] += self._bias()[:, None]
            else:
                self.engine.image_to_output(w, x, out=y, bias=self._bias())

    def backward(self, top, propagate_down, bottom):
        w, c_in, c_out = self.blobs[0].data, self.channels, self.num_output
        want_w = self.param_propagate_down[0]
        want_b = self.bias_term and self.param_propagate_down[1]
        dw = self.blobs[0].diff if want_w else None
        for i, (t, b) in enumerate(zip(top, bottom)):
            dy = self._images(t.diff, c_out)
            if want_b:
                self.blobs[1].diff[...] += dy.reshape(self.num, c_out, count(self.output_spatial)).sum(axis=(0, 2))
            dx = self._images(b.diff, c_in) if propagate_down[i] else None
            if dw is None and dx is None:
                continue
            x = self._images(b.data, c_in)
            if self.reverse_dimensions:
                # Deconvolution: its backward is a convolution of the top diff (Caffe's weight_cpu_gemm with
                # the roles swapped, then forward_cpu_gemm).
                self.engine.image_to_output(w, dy, out=dx, dw=dw, y=x)
            else:
                self.engine.output_to_image(w, dy, ims_out=dx, dw=dw, ims_in=x)

    def flops(self, bottom, top):
        # Per image: a GEMM of (conv_out / g) x (kernel_dim) x (conv spatial size) per group, 2 ops per MAC,
        # plus one add per output element for the bias.
        num = count(bottom[0].shape, 0, self.channel_axis)
        kernel = count(self.kernel)
        if self.reverse_dimensions:   # the GEMM runs over the deconv's input positions
            macs = self.channels * (self.num_output // self.group) * kernel * count(self.input_spatial)
        else:
            macs = self.num_output * (self.channels // self.group) * kernel * count(self.output_spatial)
        bias = self.num_output * count(self.output_spatial) if self.bias_term else 0
        return len(bottom) * num * (2 * macs + bias)


@register("Convolution")
class ConvolutionLayer(_BaseConvolution):
    out_dim = staticmethod(conv_out_dim)


@register("Deconvolution")
class DeconvolutionLayer(_BaseConvolution):
    reverse_dimensions = True
    out_dim = staticmethod(deconv_out_dim)


@register("Im2col")
class Im2colLayer(Layer):
    """Caffe's Im2colLayer: top (..., channels * prod(kernel), *out) with channel (c * kh + i) * kw + j."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        shape = bottom[0].shape
        self.check(len(shape) - checked_axis(self, self.param.convolution_param.axis, len(shape)) >= 2,
                   "Im2col needs at least one spatial axis after the channel axis")
        setup_geometry(self, self.param.convolution_param, shape)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.check(len(shape) == self.channel_axis + 1 + self.num_spatial_axes, "bottom num_axes may not change.")
        out = tuple(conv_out_dim(*a) for a in zip(shape[self.channel_axis + 1:], self.kernel, self.stride,
                                                  self.pad, self.dilation))
        self.check(all(d >= 0 for d in out), "the kernel does not fit the input %s" % (shape,))
        top_shape = shape[:self.channel_axis] + (shape[self.channel_axis] * count(self.kernel),) + out
        top[0].reshape(top_shape)
        self.num = count(shape, 0, self.channel_axis)
        self.im_shape = shape[self.channel_axis:]

    def _run(self, src, dst, kernel_function):
        # All images in one call, each written as its own (rows, *out) buffer (not the GEMM batch layout).
        kernel_function(src.reshape(-1), dst.reshape(-1), self.im_shape, self.kernel, self.pad, self.stride,
                        self.dilation, self.force_nd_im2col, self.num, False)

    def forward(self, bottom, top):
        self._run(np.ascontiguousarray(bottom[0].data), top[0].data, _k.im2col)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self._run(np.ascontiguousarray(top[0].diff), bottom[0].diff, _k.col2im)

    def flops(self, bottom, top):
        return 0   # data movement only
