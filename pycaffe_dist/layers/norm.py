"""LRN, MVN and BatchNorm, after Caffe's src/caffe/layers/lrn_layer.cpp, mvn_layer.cpp and batch_norm_layer.cpp.

Their GPU code follows lrn_layer.cu, mvn_layer.cu and batch_norm_layer.cu (kernels in csrc/cuda/lrn.cu and
norm.cu): sums over groups are GEMVs against vectors of ones, as Caffe's; the broadcasts back are kernels.
"""
import numpy as np

from ..backend import select
from ..backend import lrn as lrn_kernels
from ..proto import caffe_pb2
from . import channel_sums, cudnn_engine
from .base import Layer
from .registry import register

LEGACY_4D = "Input must have 4 axes, corresponding to (num, channels, height, width)"


@register("LRN")
class LRNLayer(Layer):
    """Local response normalization; top shaped like the 4-axis bottom."""
    reshape_from_shapes = True
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        lp = self.param.lrn_param
        self.size = lp.local_size
        # Caffe checks this for both regions (WITHIN_CHANNEL pools size x size windows padded by (size - 1) / 2).
        self.check(self.size % 2 == 1, "LRN only supports odd values for local_size (got %d)" % self.size)
        self.pre_pad = (self.size - 1) // 2
        self.alpha, self.beta, self.k = lp.alpha, lp.beta, lp.k
        self.across_channels = lp.norm_region == caffe_pb2.LRNParameter.ACROSS_CHANNELS

    def reshape(self, bottom, top):
        self.check(len(bottom[0].shape) == 4, LEGACY_4D)
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        x = bottom[0].data
        if self.across_channels:
            self.scale = np.empty_like(x)   # Caffe's scale_, kept for the backward
            lrn_kernels.cross_channel_forward(x, self.scale, top[0].data, self.size, self.alpha, self.beta, self.k)
        else:
            top[0].data[...] = x * self._within_channel_forward(x)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.across_channels:
            lrn_kernels.cross_channel_backward(bottom[0].data, top[0].data, self.scale, top[0].diff,
                                               bottom[0].diff, self.size, self.alpha, self.beta)
        else:
            self._within_channel_backward(bottom[0].data, top[0].diff, bottom[0].diff)

    # WITHIN_CHANNEL: Caffe wires Split -> Power (x^2) -> AVE Pooling (size x size, pad (size - 1) / 2, stride 1)
    # -> Power (1 + alpha * pooled)^-beta -> Eltwise PROD with x. The pooling window never reaches past the padding
    # here, so its divisor is always size^2; and the sub-net's Power layer uses shift 1: k is ignored.

    def _within_channel_forward(self, x):
        """The Power layer's output (1 + alpha * window mean of x^2)^-beta; keeps what the backward needs."""
        dt = x.dtype.type
        self.pooled = lrn_kernels.window_sum(x * x, self.size) / dt(self.size * self.size)
        self.power = np.power(dt(self.alpha) * self.pooled + dt(1), dt(-self.beta))
        return self.power

    def _within_channel_backward(self, x, top_diff, bottom_diff):
        dt = x.dtype.type
        # Power layer backward (power -beta, scale alpha, shift 1): dy/dp = y / (1 + alpha * p) * (-beta * alpha);
        # its top diff is the product's diff for the power input, x * top_diff.
        pooled_diff = (x * top_diff) * (self.power / (dt(self.alpha) * self.pooled + dt(1))
                                        * (dt(-self.beta) * dt(self.alpha)))
        # AVE pooling backward spreads diff / size^2 over the same symmetric window (stride 1); the square's
        # backward multiplies by 2x; Split adds the product's own diff, power * top_diff.
        square_diff = lrn_kernels.window_sum(pooled_diff / dt(self.size * self.size), self.size)
        bottom_diff[...] = self.power * top_diff + square_diff * (dt(2) * x)

    # --- GPU: ACROSS_CHANNELS as lrn_layer.cu (LRNFillScale, LRNComputeOutput, LRNComputeDiff); WITHIN_CHANNEL as
    # the CPU code above (our layer computes Caffe's sub-net itself, so it runs on the device here too).

    def forward_gpu(self, bottom, top):
        if cudnn_engine.lrn_forward(self, bottom, top):     # engine CUDNN (layers/cudnn_engine.py)
            return
        dev = select.current()
        num, channels, height, width = bottom[0].shape
        count, pixels = bottom[0].count, height * width
        f32 = np.float32
        x, y = bottom[0].gpu_data, top[0].mutable_gpu_data
        if self.across_channels:
            scale = self.buffer("scale", count, device=True)
            alpha_over_size = f32(self.alpha) / f32(self.size)    # as lrn.pyx: in the blob's precision
            dev.launch("lrn_fill_scale", num * pixels, x, channels, pixels, self.size, float(alpha_over_size),
                       self.k, scale)
            dev.launch("lrn_compute_output", count, x, scale, -self.beta, y)
        else:
            square = self.buffer("square", count, device=True)
            pooled = self.buffer("pooled", count, device=True)
            dev.launch("gpu_sqr", count, x, square)
            dev.launch("lrn_within_pool", count, square, height, width, self.size, self.size * self.size, pooled)
            dev.launch("lrn_within_output", count, x, pooled, self.alpha, -self.beta,
                       self.buffer("power", count, device=True), y)

    def backward_gpu(self, top, propagate_down, bottom):
        if cudnn_engine.lrn_backward(self, top, propagate_down, bottom) or not propagate_down[0]:
            return
        dev = select.current()
        num, channels, height, width = bottom[0].shape
        count, pixels = bottom[0].count, height * width
        x, dy = bottom[0].gpu_data, top[0].gpu_diff
        if self.across_channels:
            neg_cache_ratio = -(2.0 * self.alpha * self.beta / self.size)   # computed in double, as Caffe's
            dev.launch("lrn_compute_diff", num * pixels, x, top[0].gpu_data, self.buffer("scale", count, device=True),
                       dy, channels, pixels, self.size, -self.beta, neg_cache_ratio, bottom[0].mutable_gpu_diff)
        else:
            pooled, power = self.buffer("pooled", count, device=True), self.buffer("power", count, device=True)
            pooled_diff = self.buffer("square", count, device=True)
            square_diff = self.buffer("square_diff", count, device=True)
            power_scale = np.float32(-self.beta) * np.float32(self.alpha)
            dev.launch("lrn_within_power_diff", count, x, dy, pooled, power, self.alpha, float(power_scale),
                       self.size * self.size, pooled_diff)
            dev.launch("lrn_within_pool", count, pooled_diff, height, width, self.size, 1.0, square_diff)
            dev.launch("lrn_within_diff", count, x, dy, power, square_diff, bottom[0].mutable_gpu_diff)

    def flops(self, bottom, top):
        # Per element: a window of squares summed (2 per element of the window), scale = k + alpha/n * sum (2),
        # the power (counted 1) and the product (1).
        window = self.size if self.across_channels else self.size * self.size
        return bottom[0].count * (2 * window + 4)


@register("MVN")
class MVNLayer(Layer):
    """Mean-variance normalization over (H, W) per channel, or over (C, H, W) with across_channels."""
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        # Caffe: top[0]->Reshape(num(), channels(), height(), width()), the legacy 4-axis shape: a (N, C) bottom
        # gives a (N, C, 1, 1) top, and a bottom of more than 4 axes is refused.
        b = bottom[0]
        self.check(len(b.shape) <= 4, "Cannot use legacy accessors on Blobs with > 4 axes (bottom %s)." % (b.shape,))
        top[0].reshape((b.num, b.channels, b.height, b.width))

    def _rows(self, blob):
        """Rows of the (rows, dim) view normalized row by row: images (across_channels) or images x channels."""
        return blob.num if self.param.mvn_param.across_channels else blob.num * blob.channels

    def forward(self, bottom, top):
        if not bottom[0].count:    # nothing to normalize (docs/differences.md, empty blobs)
            return
        mp = self.param.mvn_param
        rows = self._rows(bottom[0])
        x = bottom[0].data.reshape(rows, -1)
        y = x - x.mean(axis=1, keepdims=True)
        if mp.normalize_variance:
            # Caffe adds eps to the standard deviation, not to the variance.
            self.std = np.sqrt(np.mean(y * y, axis=1, keepdims=True)) + x.dtype.type(mp.eps)
            y /= self.std
        top[0].data.reshape(rows, -1)[...] = y

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0] or not bottom[0].count:
            return
        rows = self._rows(bottom[0])
        dy = top[0].diff.reshape(rows, -1)
        # dx is built in new arrays: in place (top diff = bottom diff) Caffe's first caffe_mul overwrites the top
        # diff it reads later, a wrong gradient we do not copy (docs/differences.md)
        if self.param.mvn_param.normalize_variance:
            # dx = (dy - mean(dy) - y * mean(dy * y)) / std, with Caffe's operation order.
            y = top[0].data.reshape(rows, -1)
            dt = y.dtype.type
            dx = y * np.sum(dy * y, axis=1, keepdims=True) + np.sum(dy, axis=1, keepdims=True)
            dx = (dy + dt(-1.0 / y.shape[1]) * dx) / self.std
        else:
            dx = dy - dy.mean(axis=1, keepdims=True)
        bottom[0].diff.reshape(rows, -1)[...] = dx

    # --- GPU, as mvn_layer.cu: row sums are GEMVs against ones; std = sqrt(mean of squares) + eps (the CPU's
    # sqrt where Caffe writes powx(0.5)).

    def forward_gpu(self, bottom, top):
        dev = select.current()
        rows = self._rows(bottom[0])
        count = bottom[0].count
        if not count:
            return
        dim = count // rows
        ones = self.buffer("ones", dim, fill=1.0, device=True)
        mean = self.buffer("mean", rows, device=True)
        y = top[0].mutable_gpu_data
        dev.gemv(False, rows, dim, 1.0 / dim, bottom[0].gpu_data, ones, 0.0, mean)
        dev.launch("norm_subtract_group", count, bottom[0].gpu_data, mean, rows, dim, y)
        if self.param.mvn_param.normalize_variance:
            square = self.buffer("square", count, device=True)
            std = self.buffer("std", rows, device=True)
            dev.launch("gpu_sqr", count, y, square)
            dev.gemv(False, rows, dim, 1.0 / dim, square, ones, 0.0, std)
            dev.launch("gpu_sqrt", rows, std, std)
            dev.launch("gpu_add_scalar", rows, self.param.mvn_param.eps, std)   # eps on the std, as Caffe
            dev.launch("norm_divide_group", count, y, std, rows, dim, y)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0] or not bottom[0].count:
            return
        dev = select.current()
        rows = self._rows(bottom[0])
        count = bottom[0].count
        dim = count // rows
        ones = self.buffer("ones", dim, fill=1.0, device=True)
        dy = top[0].gpu_diff
        sum_dy = self.buffer("mean", rows, device=True)
        if self.param.mvn_param.normalize_variance:
            y = top[0].gpu_data
            product = self.buffer("square", count, device=True)
            sum_dyy = self.buffer("sum_dyy", rows, device=True)
            dev.launch("gpu_mul", count, dy, y, product)
            dev.gemv(False, rows, dim, 1.0, product, ones, 0.0, sum_dyy)
            dev.gemv(False, rows, dim, 1.0, dy, ones, 0.0, sum_dy)
            dev.launch("norm_backward", count, dy, y, sum_dyy, sum_dy, self.buffer("std", rows, device=True), rows, dim,
                       -1.0 / dim, bottom[0].mutable_gpu_diff)
        else:
            dev.gemv(False, rows, dim, 1.0 / dim, dy, ones, 0.0, sum_dy)     # the mean of dy
            dev.launch("norm_subtract_group", count, dy, sum_dy, rows, dim, bottom[0].mutable_gpu_diff)

    def flops(self, bottom, top):
        # mean (1 add) and subtraction (1) per element; with variance: square + add (2), divide (1), plus sqrt per
        # group (ignored).
        per = 2 + (3 if self.param.mvn_param.normalize_variance else 0)
        return bottom[0].count * per


@register("BatchNorm")
class BatchNormLayer(Layer):
    """Normalizes each channel (axis 1) by batch statistics (TRAIN) or the stored ones (TEST / use_global_stats).

    Blobs: mean (C), variance (C), moving-average factor (1), all zero at first. They are statistics, not
    learned: Caffe appends a ParamSpec with lr_mult 0 for each blob lacking one, and refuses a spec with
    another lr_mult. We do the same on this layer's own copy of the LayerParameter (self.param); the Net must
    read the ParamSpecs from there (Caffe's Net::AppendParam reads layer->layer_param()) for them to take effect.
    """
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        bp = self.param.batch_norm_param
        self.moving_average_fraction = bp.moving_average_fraction
        self.use_global_stats = bp.use_global_stats if bp.HasField("use_global_stats") \
            else self.phase == caffe_pb2.TEST
        self.eps = bp.eps
        shape = bottom[0].shape
        self.channels = 1 if len(shape) == 1 else shape[1]
        expected = [(self.channels,), (self.channels,), (1,)]
        if self.blobs:
            # Older models may store the statistics in legacy 4-axis form: compare element counts.
            self.check(len(self.blobs) == 3, "BatchNorm needs 3 blobs (mean, variance, factor), got %d"
                       % len(self.blobs))
            for i, (blob, want) in enumerate(zip(self.blobs, expected)):
                self.check(blob.count == want[0], "BatchNorm blob %d has shape %s; expected %s"
                           % (i, blob.shape, want))
        else:
            self.blobs = [self.make_param(s) for s in expected]   # zero-filled (Blob memory starts at zero)
        # batch_norm_layer.cpp: "Mask statistics from optimization by setting local learning rates for mean,
        # variance, and the bias correction to zero."
        for i in range(len(self.blobs)):
            if len(self.param.param) == i:
                self.param.param.add().lr_mult = 0.0
            else:
                self.check(self.param.param[i].lr_mult == 0.0,
                           "Cannot configure batch normalization statistics as layer parameters.")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        # Caffe: if (num_axes() >= 1) CHECK_EQ(shape(1), channels_) -- shape(1) itself needs 2 axes.
        self.check(len(shape) >= 2, "BatchNorm needs a bottom with a channel axis (axis 1), got shape %s" % (shape,))
        self.check(shape[1] == self.channels, "BatchNorm was set up for %d channels, bottom %s has %d"
                   % (self.channels, shape, shape[1]))
        top[0].reshape(shape)

    def forward(self, bottom, top):
        # No elements: no batch statistics, so the moving averages stay as they were (docs/differences.md,
        # empty blobs).
        if not bottom[0].count:
            return
        n = bottom[0].shape[0]
        x = bottom[0].data.reshape(n, self.channels, -1)   # (num, channels, spatial)
        dt = x.dtype.type
        if self.use_global_stats:
            # The stored sums are divided by the moving-average factor; a zero factor gives zero statistics.
            factor = self.blobs[2].data.reshape(-1)[0]
            factor = dt(0) if factor == 0 else dt(1) / dt(factor)
            mean = factor * self.blobs[0].data.reshape(-1)
        else:
            mean = x.mean(axis=(0, 2))
        centred = x - mean[:, None]
        if self.use_global_stats:
            variance = factor * self.blobs[1].data.reshape(-1)
        else:
            variance = np.mean(centred * centred, axis=(0, 2))
            self._update_moving_averages(mean, variance, x.size // self.channels)
        self.std = np.sqrt(variance + dt(self.eps))[:, None]    # Caffe's temp_ (broadcast) for the backward
        # Caffe's x_norm_: later in-place layers may overwrite the top, the TRAIN backward needs it.
        self.x_norm = centred / self.std
        top[0].data.reshape(n, self.channels, -1)[...] = self.x_norm

    def _update_moving_averages(self, mean, variance, m):
        """blobs: mean and variance sums decayed by moving_average_fraction, and their weight s = s * maf + 1."""
        maf = self.moving_average_fraction
        factor = self.blobs[2].data.reshape(-1)
        factor[0] = factor[0] * maf + 1
        mean_sum, variance_sum = self.blobs[0].data.reshape(-1), self.blobs[1].data.reshape(-1)
        mean_sum[...] = mean + maf * mean_sum
        correction = m / (m - 1) if m > 1 else 1.0   # the stored variance is the unbiased estimate
        variance_sum[...] = correction * variance + maf * variance_sum

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0] or not bottom[0].count:
            return
        n = bottom[0].shape[0]
        # dx is built in new arrays before it is written: in place, the bottom's diff is the top's.
        dy = top[0].diff.reshape(n, self.channels, -1)
        if self.use_global_stats:
            dx = dy / self.std
        else:
            # dx = (dy - mean(dy) - mean(dy * y) * y) / std, y = x_norm, means over the num and spatial axes.
            y = self.x_norm
            dt = y.dtype.type
            dx = y * np.sum(dy * y, axis=(0, 2), keepdims=True) + np.sum(dy, axis=(0, 2), keepdims=True)
            dx = (dy + dt(-1.0 / (y.size // self.channels)) * dx) / self.std
        bottom[0].diff.reshape(n, self.channels, -1)[...] = dx

    # --- GPU: Caffe's arithmetic (batch_norm_layer.cu) in fewer passes over the tensor. The TRAIN forward reads x
    # once for the statistics (layers/channel_sums.py: per-part Welford moments, combined in order) and once to
    # normalise, writing y and the kept x_norm together: 4 passes where Caffe's GEMVs and element-wise steps made
    # 10. The backward sums dy and dy * y in one read and computes dx in another: 5 passes where Caffe made 8. The
    # statistics' weight blobs[2] stays on the device (Caffe reads and writes it on the host, which waits for the
    # GPU once per layer and iteration).

    def gpu_dims(self, bottom):
        """(num, channels, spatial) of the bottom, as the kernels see it."""
        num, count, c = bottom[0].shape[0], bottom[0].count, self.channels
        return num, c, (count // (num * c) if num * c else 0)

    def gpu_statistics(self, bottom):
        """The device buffers (mean, std) to normalise with, std = sqrt(variance + eps): the stored statistics
        (use_global_stats), or the batch's, with the moving averages updated. net/gpu_fusion.py uses it too."""
        dev = select.current()
        dims = self.gpu_dims(bottom)
        c, count = self.channels, bottom[0].count
        mean = self.buffer("mean", c, device=True)
        std = self.buffer("std", c, device=True)          # kept for the backward
        if self.use_global_stats:
            dev.launch("batch_norm_global_statistics", c, self.blobs[0].gpu_data, self.blobs[1].gpu_data,
                       self.blobs[2].gpu_data, self.eps, mean, std)
            return mean, std
        x = bottom[0].gpu_data
        moments, parts = channel_sums.moments(self, x, dims)
        m = count // c
        correction = m / (m - 1) if m > 1 else 1.0
        dev.launch("batch_norm_statistics", c, x, max(dims[2], 1), *moments, m, parts, self.moving_average_fraction,
                   correction, self.eps, mean, std, self.blobs[0].mutable_gpu_data, self.blobs[1].mutable_gpu_data,
                   self.blobs[2].mutable_gpu_data)
        return mean, std

    def forward_gpu(self, bottom, top):
        if not bottom[0].count:     # as forward: the moving averages stay
            return
        mean, std = self.gpu_statistics(bottom)
        count, inner = bottom[0].count, max(self.gpu_dims(bottom)[2], 1)
        x, y = bottom[0].gpu_data, top[0].mutable_gpu_data
        # Caffe's x_norm_: later in-place layers may overwrite the top, the TRAIN backward needs it.
        x_norm = y if self.use_global_stats else self.buffer("x_norm", count, device=True)
        select.current().launch("batch_norm_normalize", count, x, mean, std, self.channels, inner, y, x_norm)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0] or not bottom[0].count:
            return
        dev = select.current()
        dims = self.gpu_dims(bottom)
        c, count = self.channels, bottom[0].count
        std = self.buffer("std", c, device=True)
        dy = top[0].gpu_diff
        if self.use_global_stats:
            dev.launch("norm_divide_group", count, dy, std, c, max(dims[2], 1), bottom[0].mutable_gpu_diff)
            return
        # dx = (dy - mean(dy) - mean(dy * y) * y) / std, y = x_norm, in the CPU path's operation order.
        y = self.buffer("x_norm", count, device=True)
        sum_dy, sum_dyy = self.buffer("sum_dy", c, device=True), self.buffer("sum_dyy", c, device=True)
        channel_sums.sums(self, dy, y, dims, sum_dy, sum_dyy)
        dev.launch("norm_backward", count, dy, y, sum_dyy, sum_dy, std, c, max(dims[2], 1), -1.0 / (count // c),
                   bottom[0].mutable_gpu_diff)

    def flops(self, bottom, top):
        # TRAIN: mean (1), subtract (1), square + sum for the variance (2), divide (1); with the stored
        # statistics only subtract and divide.
        return bottom[0].count * (2 if self.use_global_stats else 5)
