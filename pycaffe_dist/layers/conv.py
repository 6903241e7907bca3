"""Convolution, Deconvolution and Im2col (im2col/col2im kernels in csrc/im2col.pyx, GEMMs in backend/conv.py;
on the GPU csrc/cuda/im2col.cu and cuBLAS, through GpuConvEngine below).

Parameter parsing and shapes follow Caffe's src/caffe/layers/base_conv_layer.cpp (LayerSetUp, Reshape),
conv_layer.cpp / deconv_layer.cpp (compute_output_shape, Forward_cpu, Backward_cpu) and im2col_layer.cpp; the
GPU code base_conv_layer.cpp's *_gpu_gemm / *_gpu_bias, conv_layer.cu, deconv_layer.cu and im2col_layer.cu.
"""
import numpy as np

from ..backend import select
from ..backend.conv import ConvEngine
from .._kernels import im2col as _k
from ..blob.blob import count
from . import cudnn_engine
from .base import Layer, c_div, check_param_shapes, checked_axis
from .gpu_helpers import gpu_ones
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


# --- the GPU path ---------------------------------------------------------------------------------------------

GPU_BUFFER_BYTES = 32 << 20   # bound of the GPU column buffer (and of the per-image weight-diff scratch)


def gpu_add_bias(layer, dev, bias, out, num, channels, spatial):
    """out (num, channels, spatial) += bias[c]: Caffe's forward_gpu_bias (a rank-1 GEMM with a ones vector), for
    all images in one strided-batched GEMM."""
    dev.gemm_batched(False, False, channels, spatial, 1, 1.0, bias, 0, gpu_ones(layer, spatial), 0, 1.0, out,
                     channels * spatial, num)


def gpu_bias_diff(layer, dev, dy, bias_diff, num, channels, spatial):
    """bias_diff += the sum of dy (num, channels, spatial) over images and positions: Caffe's backward_gpu_bias
    (a GEMV with ones per image), as two GEMVs: per (image, channel) sums, then their sum over images."""
    if num * channels * spatial == 0:
        return
    sums = layer.buffer("bias_sums", num * channels, device=True, at_least=True)
    ones = gpu_ones(layer, max(spatial, num))
    dev.gemv(False, num * channels, spatial, 1.0, dy, ones, 0.0, sums)
    dev.gemv(True, num, channels, 1.0, sums, ones, 1.0, bias_diff)


class GpuUnroll:
    """im2col / col2im of `num` images of shape (channels, *spatial) to and from the batched column layout
    (num, rows, *out), each image's part Caffe's (csrc/cuda/im2col.cu). Two spatial axes take the 2-D kernels
    unless force_nd (or a zero dilation, which Caffe's 2-D col2im cannot take); others the N-d ones, their shapes
    in a small int device array (Caffe's im2col_nd_gpu)."""

    def __init__(self, im_shape, kernel, pad, stride, dilation, force_nd=False):
        self.im_shape = tuple(int(d) for d in im_shape)
        self.geometry = (tuple(kernel), tuple(pad), tuple(stride), tuple(dilation))
        self.num_axes = len(self.im_shape) - 1
        self.out_spatial = tuple(conv_out_dim(size, k, s, p, d) for size, k, p, s, d
                                 in zip(self.im_shape[1:], *self.geometry))
        self.rows = self.im_shape[0] * count(kernel)
        self.positions = count(self.out_spatial)
        self.im_count = count(self.im_shape)
        self.col_count = self.rows * self.positions
        self.nd = self.num_axes != 2 or force_nd or 0 in tuple(dilation)
        self._shapes = None

    def _shape_array(self, dev):
        if self._shapes is None or self._shapes[0] is not dev:
            host = np.array(self.im_shape + (self.rows,) + self.out_spatial + sum(self.geometry, ()), np.int32)
            self._shapes = (dev, dev.to_device(host))
        return self._shapes[1]

    def _args_2d(self):
        (kh, kw), (ph, pw), (sh, sw), (dh, dw) = self.geometry
        return self.im_shape + (kh, kw, ph, pw, sh, sw, dh, dw) + self.out_spatial

    def im2col(self, dev, im, col, num):
        if self.nd:
            dev.launch("im2col_nd", num * self.col_count, im, self.num_axes, self._shape_array(dev), col)
        else:
            dev.launch("im2col_2d", num * self.im_shape[0] * self.positions, im, *self._args_2d(), col)

    def col2im(self, dev, col, im, num):
        """Overwrites the images."""
        if self.nd:
            dev.launch("col2im_nd", num * self.im_count, col, self.num_axes, self._shape_array(dev), im)
        else:
            dev.launch("col2im_2d", num * self.im_count, col, *self._args_2d(), im)


class GpuConvEngine:
    """ConvEngine's operations on the GPU, in its names (the image side is what im2col reads, W is
    (out_channels, in_channels / group, *kernel), the output side (N, out_channels, P)).

    Caffe runs im2col and one GEMM per group per image. Here a chunk of images (the column buffer bounded by
    GPU_BUFFER_BYTES) is unrolled at once into (n, rows, P), and each group multiplies the whole chunk in one
    strided-batched GEMM whose W has stride 0: out_i = W col_i (forward), col_i = W^T dY_i (then col2im). Where
    there are more groups than images (depthwise convolutions), the batch runs over the groups instead, one GEMM
    per image: whichever launches fewer.
    The weight diff dW += sum_i dY_i col_i^T cannot be batched over images into one dW (the batch's products
    would race on it): it is one strided-batched GEMM per group into a per-image scratch (n, |W|), then one GEMV
    with ones that adds its rows to dW: 1 + group launches per chunk instead of Caffe's n * group GEMMs with
    beta = 1, at the price of the scratch (bounded like the column buffer). Batched over the groups, or where
    one image's |W| fills the bound already, the GEMMs add into dW with beta = 1, image after image, as Caffe's.
    A 1x1 convolution (kernel 1, stride 1, pad 0: Caffe's is_1x1_) multiplies the images themselves, without
    a column buffer.
    The buffers (columns, the weight-diff scratch, ones) are the layer's, which the calls name (`layer`), as Caffe's
    col_buffer_ is: they outlive an engine that a reshape replaces, and only grow."""

    def __init__(self, im_shape, kernel, pad, stride, dilation, group, out_channels, force_nd=False):
        self.unroll = u = GpuUnroll(im_shape, kernel, pad, stride, dilation, force_nd)
        self.group, self.out_channels = int(group), int(out_channels)
        self.is_1x1 = all(k == 1 for k in kernel) and all(s == 1 for s in stride) and all(p == 0 for p in pad)
        self.rows_g = u.rows // self.group                       # Caffe's kernel_dim_
        self.out_g = self.out_channels // self.group             # conv_out_channels_ / group_
        self.weight_g = self.out_g * self.rows_g                 # Caffe's weight_offset_
        self.weight_count = self.weight_g * self.group
        self.out_count = self.out_channels * u.positions         # one image's output side
        self.chunk_limit = max(1, GPU_BUFFER_BYTES // max(4, 4 * u.col_count))
        self.dw_chunk_limit = max(1, GPU_BUFFER_BYTES // (4 * max(1, self.weight_count)))

    def _chunks(self, num):
        step = num if self.is_1x1 else self.chunk_limit
        for start in range(0, num, max(1, step)):
            yield start, min(step, num - start)

    def _columns(self, layer, dev, ims, start, m):
        """The chunk's column buffer, unrolled from ims (for a 1x1 convolution: the images themselves)."""
        u = self.unroll
        if self.is_1x1:
            return ims.at(start * u.im_count, m * u.im_count)
        col = layer.buffer("columns", m * u.col_count, device=True, at_least=True)
        u.im2col(dev, ims.at(start * u.im_count, m * u.im_count), col, m)
        return col

    def _gemms(self, dev, trans_a, trans_b, m, n, k, a, b, beta, c, images, by_groups=None):
        """C_ig = op(A_ig) op(B_ig) + beta C_ig for every image i < images and group g. a, b and c are
        (array, image stride, group stride); one strided-batched GEMM per group (batched over the images) or,
        where by_groups (default: more groups than images), one per image (batched over the groups)."""
        (a, a_image, a_group), (b, b_image, b_group), (c, c_image, c_group) = a, b, c
        if by_groups is None:
            by_groups = self.group > images
        if by_groups:
            for i in range(images):
                dev.gemm_batched(trans_a, trans_b, m, n, k, 1.0, a.at(i * a_image), a_group, b.at(i * b_image),
                                 b_group, beta, c.at(i * c_image), c_group, self.group)
        else:
            for g in range(self.group):
                dev.gemm_batched(trans_a, trans_b, m, n, k, 1.0, a.at(g * a_group), a_image, b.at(g * b_group),
                                 b_image, beta, c.at(g * c_group), c_image, images)

    def _forward_gemm(self, dev, w, col, out, m):
        """out_i = W col_i, group by group."""
        P = self.unroll.positions
        self._gemms(dev, False, False, self.out_g, P, self.rows_g, (w, 0, self.weight_g),
                    (col, self.unroll.col_count, self.rows_g * P), 0.0, (out, self.out_count, self.out_g * P), m)

    def _backward_gemm(self, dev, w, y, col, m):
        """col_i = W^T y_i, group by group."""
        P = self.unroll.positions
        self._gemms(dev, True, False, self.rows_g, P, self.out_g, (w, 0, self.weight_g),
                    (y, self.out_count, self.out_g * P), 0.0, (col, self.unroll.col_count, self.rows_g * P), m)

    def _weight_gemm(self, layer, dev, y, col, dw, m):
        """dW += sum over the m images of y_i col_i^T, group by group."""
        P, col_count = self.unroll.positions, self.unroll.col_count
        if self.group > 1 and (self.group > m or self.dw_chunk_limit == 1):
            # batched over the groups, image after image, straight into dW
            self._gemms(dev, False, True, self.out_g, self.rows_g, P, (y, self.out_count, self.out_g * P),
                        (col, col_count, self.rows_g * P), 1.0, (dw, 0, self.weight_g), m, by_groups=True)
            return
        for s in range(0, m, self.dw_chunk_limit):
            b = min(self.dw_chunk_limit, m - s)
            ys, cs = y.at(s * self.out_count), col.at(s * col_count)
            if b == 1:   # one image: its groups' products go straight into dW
                self._gemms(dev, False, True, self.out_g, self.rows_g, P, (ys, 0, self.out_g * P),
                            (cs, 0, self.rows_g * P), 1.0, (dw, 0, self.weight_g), 1, by_groups=True)
                continue
            scratch = layer.buffer("weight_diffs", b * self.weight_count, device=True, at_least=True)
            self._gemms(dev, False, True, self.out_g, self.rows_g, P, (ys, self.out_count, self.out_g * P),
                        (cs, col_count, self.rows_g * P), 0.0, (scratch, self.weight_count, self.weight_g), b,
                        by_groups=False)
            dev.gemv(True, b, self.weight_count, 1.0, scratch, gpu_ones(layer, b), 1.0, dw)

    def image_to_output(self, layer, dev, w, ims, num, out=None, dw=None, y=None):
        """col = im2col(ims); out = W col, and/or dW += y col^T (device arrays of num images); `layer` keeps the
        buffers. Convolution forward (out) and a deconvolution's backward (out = bottom diff, dW with y = its
        bottom)."""
        for start, m in self._chunks(num):
            col = self._columns(layer, dev, ims, start, m)
            if dw is not None:
                self._weight_gemm(layer, dev, y.at(start * self.out_count), col, dw, m)
            if out is not None:
                self._forward_gemm(dev, w, col, out.at(start * self.out_count, m * self.out_count), m)

    def output_to_image(self, layer, dev, w, y, num, ims_out=None, dw=None, ims_in=None):
        """ims_out = col2im(W^T y), and/or dW += y im2col(ims_in)^T; `layer` keeps the buffers.
        Convolution backward (bottom diff, weight diff) and a deconvolution's forward (ims_out = its top)."""
        u = self.unroll
        for start, m in self._chunks(num):
            ys = y.at(start * self.out_count, m * self.out_count)
            if dw is not None:
                self._weight_gemm(layer, dev, ys, self._columns(layer, dev, ims_in, start, m), dw, m)
            if ims_out is not None:
                chunk_out = ims_out.at(start * u.im_count, m * u.im_count)
                if self.is_1x1:
                    self._backward_gemm(dev, w, ys, chunk_out, m)
                else:
                    col = layer.buffer("columns", m * u.col_count, device=True, at_least=True)
                    self._backward_gemm(dev, w, ys, col, m)
                    u.col2im(dev, col, chunk_out, m)


# --- layers -------------------------------------------------------------------------------------------------

class _BaseConvolution(Layer):
    """Caffe's BaseConvolutionLayer: N spatial axes after `axis`, weights (out, in / group, *kernel)."""
    reshape_from_shapes = True
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
            self.engine = ConvEngine(*self._engine_geometry(im_shape), self.group, out_channels,
                                     self.force_nd_im2col)

    def _engine_geometry(self, im_shape):
        """(image shape, kernel, pad, stride, dilation) for the engines. Caffe also takes a bottom with no
        spatial axis (a per-group inner product over the channels): for the engines, one position of a 1-wide
        kernel."""
        if self.num_spatial_axes:
            return im_shape, self.kernel, self.pad, self.stride, self.dilation
        return im_shape + (1,), (1,), (0,), (1,), (1,)

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
                # Caffe's per-image GEMV with a ones vector, the images then summed in order: one BLAS call,
                # several times faster than numpy's sum over two axes
                ones = self.buffer("ones", count(self.output_spatial), dy.dtype, fill=1.0)
                self.blobs[1].diff[...] += (dy.reshape(self.num, c_out, ones.shape[0]) @ ones).sum(axis=0)
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

    def gpu_engine(self):
        """The device engine for the current shapes (the CPU's is self.engine), made again when they change."""
        if getattr(self, "_gpu_engine_key", None) != self._engine_key:
            self._gpu_engine_key = self._engine_key
            im_shape, out_channels = self._engine_key
            self._gpu = GpuConvEngine(*self._engine_geometry(im_shape), self.group, out_channels,
                                      self.force_nd_im2col)
        return self._gpu

    def forward_gpu(self, bottom, top, bias=True):
        """bias=False leaves the bias out (net/gpu_fusion.ConvolutionReLU adds it with the ReLU after)."""
        if cudnn_engine.convolution_forward(self, bottom, top, bias):     # engine CUDNN (layers/cudnn_engine.py)
            return
        dev, engine = select.current(), self.gpu_engine()
        w, spatial = self.blobs[0].gpu_data, count(self.output_spatial)
        for b, t in zip(bottom, top):
            x, y = b.gpu_data, t.mutable_gpu_data
            if self.reverse_dimensions:
                engine.output_to_image(self, dev, w, x, self.num, ims_out=y)
            else:
                engine.image_to_output(self, dev, w, x, self.num, out=y)
            if self.bias_term and bias:
                gpu_add_bias(self, dev, self.blobs[1].gpu_data, y, self.num, self.num_output, spatial)

    def backward_gpu(self, top, propagate_down, bottom):
        if cudnn_engine.convolution_backward(self, top, propagate_down, bottom):
            return
        dev, engine = select.current(), self.gpu_engine()
        w = self.blobs[0].gpu_data
        want_w = self.param_propagate_down[0]
        want_b = self.bias_term and self.param_propagate_down[1]
        dw = self.blobs[0].mutable_gpu_diff if want_w else None
        for i, (t, b) in enumerate(zip(top, bottom)):
            dy = t.gpu_diff
            if want_b:
                gpu_bias_diff(self, dev, dy, self.blobs[1].mutable_gpu_diff, self.num, self.num_output,
                              count(self.output_spatial))
            dx = b.mutable_gpu_diff if propagate_down[i] else None
            if dw is None and dx is None:
                continue
            x = b.gpu_data
            if self.reverse_dimensions:
                engine.image_to_output(self, dev, w, dy, self.num, out=dx, dw=dw, y=x)
            else:
                engine.output_to_image(self, dev, w, dy, self.num, ims_out=dx, dw=dw, ims_in=x)

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

    def _gpu_unroll(self):
        key = (self.im_shape, self.kernel, self.pad, self.stride, self.dilation, self.force_nd_im2col)
        if getattr(self, "_gpu_unroll_key", None) != key:
            self._gpu_unroll_key = key
            self._gpu = GpuUnroll(*key)
        return self._gpu

    def forward_gpu(self, bottom, top):
        # Caffe's im2col_layer.cu loops over images; the batched kernel unrolls them all in one launch.
        self._gpu_unroll().im2col(select.current(), bottom[0].gpu_data, top[0].mutable_gpu_data, self.num)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self._gpu_unroll().col2im(select.current(), top[0].gpu_diff, bottom[0].mutable_gpu_diff, self.num)

    def flops(self, bottom, top):
        return 0   # data movement only
