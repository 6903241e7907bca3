"""LRN, MVN and BatchNorm, after Caffe's src/caffe/layers/lrn_layer.cpp, mvn_layer.cpp and batch_norm_layer.cpp."""
from ..proto import caffe_pb2
from .base import Layer
from .registry import register

LEGACY_4D = "Input must have 4 axes, corresponding to (num, channels, height, width)"


@register("LRN")
class LRNLayer(Layer):
    """Local response normalization; top shaped like the 4-axis bottom."""
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

    def flops(self, bottom, top):
        # TRAIN: mean (1), subtract (1), square + sum for the variance (2), divide (1); with the stored
        # statistics only subtract and divide.
        return bottom[0].count * (2 if self.use_global_stats else 5)
