"""Pooling and SPP, after Caffe's src/caffe/layers/pooling_layer.cpp and spp_layer.cpp; on the GPU
pooling_layer.cu (kernels in csrc/cuda/pooling.cu)."""
import math

import numpy as np

from ..backend import pooling, select
from ..proto import caffe_pb2
from ..random_stream import RandomStream
from . import cudnn_engine
from .base import Layer
from .registry import register

PP = caffe_pb2.PoolingParameter
LEGACY_4D = "Input must have 4 axes, corresponding to (num, channels, height, width)"


def pooled_dim(size, kernel, stride, pad, ceil_mode=True, clip=None):
    """Caffe's PoolingLayer::Reshape output size along one axis.

    CEIL (the default) or FLOOR of (size + 2 pad - kernel) / stride, plus 1; then, when the layer pads (clip;
    by default this axis's pad), the last window must start strictly inside the image (not in the padding),
    otherwise it is clipped. Caffe clips both axes when either is padded: use pooled_shape."""
    rounded = (math.ceil if ceil_mode else math.floor)((size + 2 * pad - kernel) / float(stride))
    out = int(rounded) + 1
    if (pad if clip is None else clip) and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def pooled_shape(sizes, kernel, stride, pad, ceil_mode=True):
    """pooled_dim over (height, width), clipping both when either axis is padded (`if (pad_h_ || pad_w_)`)."""
    return tuple(pooled_dim(s, k, st, p, ceil_mode, clip=any(pad))
                 for s, k, st, p in zip(sizes, kernel, stride, pad))


def pool_forward(pool, train, x, y, index, kernel, stride, pad, random_stream=None):
    """Pool x into y; MAX and STOCHASTIC (TRAIN) also write each window's chosen position into `index`.
    random_stream: the layer's RandomStream, which STOCHASTIC TRAIN draws from."""
    if pool == PP.MAX:
        pooling.max_forward(x, y, index, kernel, stride, pad)
    elif pool == PP.AVE:
        pooling.ave_forward(x, y, kernel, stride, pad)
    elif train:
        # Caffe's GPU StoPoolForwardTrain: one uniform draw per output (its CPU aborts "Not Implemented Yet"). The
        # draws are float32, as on the device, also for double blobs.
        uniform = random_stream.uniform(np.empty(y.shape, np.float32))
        pooling.stochastic_forward(x, y, index, kernel, stride, uniform.astype(x.dtype, copy=False))
    else:
        pooling.stochastic_forward_test(x, y, kernel, stride)


def pool_backward(pool, train, x, dy, index, dx, kernel, stride, pad, accumulate=False, index_in_windows=True):
    """The input diff dx of pool_forward from the output diff dy; overwrites dx unless accumulate.
    index_in_windows: `index` is what pool_forward wrote, every position in its own window (a mask top that the
    user may have changed is not), which lets whole 2x2 windows take a faster kernel."""
    if pool == PP.AVE:
        pooling.ave_backward(dy, dx, kernel, stride, pad, accumulate)
    elif pool == PP.STOCHASTIC and not train:
        pooling.stochastic_test_backward(x, dy, dx, kernel, stride, accumulate)
    elif pool == PP.MAX and index_in_windows:
        pooling.mask_backward(dy, index, dx, accumulate, kernel, stride, pad)
    else:
        pooling.mask_backward(dy, index, dx, accumulate)


def _gpu_geometry(shape, pooled, kernel, stride):
    return (shape[2], shape[3]) + tuple(pooled) + tuple(kernel) + tuple(stride)


def gpu_pool_forward(layer, dev, pool, train, x, y, index, shape, pooled, kernel, stride, pad):
    """pool_forward on device arrays: x (N, C, H, W) of `shape` into y (N, C, *pooled); MAX and STOCHASTIC TRAIN
    write the chosen positions into `index` (an int32 device array shaped like y); `layer` keeps the draws and
    owns their stream (random_stream)."""
    n = shape[0] * shape[1] * pooled[0] * pooled[1]
    geometry = _gpu_geometry(shape, pooled, kernel, stride)
    if pool == PP.MAX:
        dev.launch("pool_max_forward", n, x, *geometry, *pad, y, index)
    elif pool == PP.AVE:
        dev.launch("pool_ave_forward", n, x, *geometry, *pad, y)
    elif train:
        # Caffe draws with curand; we draw the CPU path's numbers (the layer's stream) on the device, so that GPU
        # and CPU pick the same inputs for the same seed with nothing uploaded.
        draws = layer.buffer("uniform", n, device=True, at_least=True)
        layer.random_stream.uniform_gpu(dev, draws, n)
        dev.launch("pool_stochastic_forward_train", n, x, draws, *geometry, y, index)
    else:
        dev.launch("pool_stochastic_forward_test", n, x, *geometry, y)


def gpu_pool_backward(dev, pool, train, x, dy, index, dx, shape, pooled, kernel, stride, pad, accumulate=False,
                      top_mask=None):
    """pool_backward on device arrays; `top_mask` (Caffe's MAX mask top, floats) replaces `index` when given."""
    n = shape[0] * shape[1] * shape[2] * shape[3]
    geometry = _gpu_geometry(shape, pooled, kernel, stride)
    if pool == PP.AVE:
        dev.launch("pool_ave_backward", n, dy, *geometry, *pad, int(accumulate), dx)
    elif pool == PP.STOCHASTIC and not train:
        dev.launch("pool_stochastic_test_backward", n, x, dy, *geometry, int(accumulate), dx)
    elif top_mask is not None:
        dev.launch("pool_top_mask_backward", n, dy, top_mask, *geometry, *pad, int(accumulate), dx)
    else:
        dev.launch("pool_mask_backward", n, dy, index, *geometry, *pad, int(accumulate), dx)


@register("Pooling")
class PoolingLayer(Layer):
    """MAX, AVE and STOCHASTIC pooling. Caffe's CPU aborts on STOCHASTIC; we run its GPU kernels' rule on the
    CPU too (TRAIN: sample one input per window in proportion to it; TEST: sum(x^2) / sum(x) per window)."""
    reshape_from_shapes = True
    exact_num_bottom = 1
    min_top = 1
    index = None   # the windows' chosen positions (MAX with one top, STOCHASTIC TRAIN), shaped like top[0]

    @property
    def max_top(self):
        # MAX pooling may output its argmax mask as a second top (Caffe's MaxTopBlobs).
        return 2 if self.param.pooling_param.pool == PP.MAX else 1

    def layer_setup(self, bottom, top):
        pp = self.param.pooling_param
        has = pp.HasField
        self.random_stream = RandomStream(self.name)   # STOCHASTIC TRAIN's draws (keyed at the first one)
        self.global_pooling = pp.global_pooling
        self.ceil_mode = pp.round_mode == PP.CEIL
        if self.global_pooling:
            self.check(not (has("kernel_size") or has("kernel_h") or has("kernel_w")),
                       "With Global_pooling: true Filter size cannot specified")
        else:
            # Caffe: CHECK(!has_kernel_size() != !(has_kernel_h() && has_kernel_w())), which also fires when
            # no size is given at all; we say which of the two went wrong.
            if has("kernel_size") == (has("kernel_h") and has("kernel_w")):
                raise self.error("Filter size is kernel_size OR kernel_h and kernel_w; not both" if has("kernel_size")
                                 else "kernel_size must be specified (For non-square filters both kernel_h and "
                                 "kernel_w are required.)")
        self.check((not has("pad") and has("pad_h") and has("pad_w")) or (not has("pad_h") and not has("pad_w")),
                   "pad is pad OR pad_h and pad_w are required.")
        self.check((not has("stride") and has("stride_h") and has("stride_w"))
                   or (not has("stride_h") and not has("stride_w")),
                   "Stride is stride OR stride_h and stride_w are required.")
        if self.global_pooling:
            self.check(len(bottom[0].shape) <= 4, LEGACY_4D)
            self.kernel = (bottom[0].height, bottom[0].width)
        elif has("kernel_size"):
            self.kernel = (pp.kernel_size, pp.kernel_size)
        else:
            self.kernel = (pp.kernel_h, pp.kernel_w)
        self.check(all(k > 0 for k in self.kernel), "Filter dimensions cannot be zero.")
        self.pad = (pp.pad_h, pp.pad_w) if has("pad_h") else (pp.pad, pp.pad)
        self.stride = (pp.stride_h, pp.stride_w) if has("stride_h") else (pp.stride, pp.stride)
        # (Caffe does not check the stride; a zero stride would divide by zero in Reshape.)
        self.check(all(s > 0 for s in self.stride), "Stride dimensions cannot be zero.")
        if self.global_pooling:
            self.check(self.pad == (0, 0) and self.stride == (1, 1),
                       "With Global_pooling: true; only pad = 0 and stride = 1")
        if any(self.pad):
            self.check(pp.pool in (PP.AVE, PP.MAX), "Padding implemented only for average and max pooling.")
            self.check(self.pad[0] < self.kernel[0] and self.pad[1] < self.kernel[1],
                       "pad (%d, %d) must be smaller than the kernel (%d, %d)" % (self.pad + self.kernel))
        # STOCHASTIC is accepted here, as in Caffe; its CPU forward is "Not Implemented Yet" in Caffe.

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.check(len(shape) == 4, LEGACY_4D)
        if self.global_pooling:
            self.kernel = shape[2:]
        self.pooled = pooled_shape(shape[2:], self.kernel, self.stride, self.pad, self.ceil_mode)
        if any(self.pad):
            self.check(all((o - 1) * st < s + p for o, st, s, p in zip(self.pooled, self.stride, shape[2:], self.pad)),
                       "the last pooling window starts in the padding")
        self.check(all(o >= 0 for o in self.pooled), "the kernel %s does not fit the input %s" % (self.kernel, shape))
        for t in top:   # top[1], the MAX mask, is shaped like top[0]
            t.reshape(shape[:2] + self.pooled)
        if self.param.pooling_param.pool != PP.AVE:
            self.index = self.buffer("index", top[0].shape, np.int32)

    def forward(self, bottom, top):
        pool = self.param.pooling_param.pool
        pool_forward(pool, self.phase == caffe_pb2.TRAIN, bottom[0].data, top[0].data, self.index, self.kernel,
                     self.stride, self.pad, self.random_stream)
        if len(top) > 1:
            top[1].data[...] = self.index   # Caffe's mask top: the positions as floats

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        # With a mask top, Caffe reads the positions back from it (static_cast to int).
        index = top[1].data.astype(np.int32) if len(top) > 1 else self.index
        pool_backward(self.param.pooling_param.pool, self.phase == caffe_pb2.TRAIN, bottom[0].data, top[0].diff,
                      index, bottom[0].diff, self.kernel, self.stride, self.pad, index_in_windows=len(top) == 1)

    def forward_gpu(self, bottom, top):
        if cudnn_engine.pooling_forward(self, bottom, top):     # engine CUDNN (layers/cudnn_engine.py)
            return
        dev, pool = select.current(), self.param.pooling_param.pool
        index = self.buffer("index", top[0].count, np.int32, device=True, at_least=True) if pool != PP.AVE else None
        gpu_pool_forward(self, dev, pool, self.phase == caffe_pb2.TRAIN, bottom[0].gpu_data, top[0].mutable_gpu_data,
                         index, bottom[0].shape, self.pooled, self.kernel, self.stride, self.pad)
        if len(top) > 1:
            dev.launch("pool_mask_to_float", top[0].count, index, top[1].mutable_gpu_data)

    def backward_gpu(self, top, propagate_down, bottom):
        if cudnn_engine.pooling_backward(self, top, propagate_down, bottom) or not propagate_down[0]:
            return
        dev, pool = select.current(), self.param.pooling_param.pool
        # With a mask top, Caffe reads the positions back from it.
        top_mask = top[1].gpu_data if len(top) > 1 else None
        index = self.buffer("index", top[0].count, np.int32, device=True, at_least=True) \
            if pool != PP.AVE and top_mask is None else None
        gpu_pool_backward(dev, pool, self.phase == caffe_pb2.TRAIN, bottom[0].gpu_data, top[0].gpu_diff, index,
                          bottom[0].mutable_gpu_diff, bottom[0].shape, self.pooled, self.kernel, self.stride,
                          self.pad, top_mask=top_mask)

    def flops(self, bottom, top):
        # One compare (MAX) or add (AVE, STOCHASTIC) per window element, plus the AVE division per output.
        outputs = top[0].count
        per_output = self.kernel[0] * self.kernel[1]
        if self.param.pooling_param.pool != PP.MAX:
            per_output += 1
        return outputs * per_output


def spp_level_geometry(height, width, level):
    """SPPLayer::GetPoolingParam: kernel, stride and pad of pyramid level `level` (2^level bins per axis)."""
    bins = 2 ** level
    kernel, pad = [], []
    for size in (height, width):
        k = int(math.ceil(size / float(bins)))
        kernel.append(k)
        pad.append((k * bins - size + 1) // 2)   # remainder is >= 0: C and Python division agree
    return tuple(kernel), tuple(kernel), tuple(pad)   # the stride is the kernel


@register("SPP")
class SPPLayer(Layer):
    """Spatial pyramid pooling: level i pools into 2^i x 2^i bins; the flattened levels are concatenated.

    Caffe builds it from internal Split, Pooling, Flatten and Concat layers; we pool each level into a buffer
    and copy it into its slice of the top, and sum the levels' input diffs in Caffe's Split order."""
    exact_num_bottom = 1
    exact_num_top = 1
    # Caffe's internal Pooling layers get a fresh LayerParameter, whose phase is TRAIN: STOCHASTIC always samples.
    train = True
    level_outputs = ()   # per level: its pooled output (None with one level: that is the top), its chosen positions

    def layer_setup(self, bottom, top):
        sp = self.param.spp_param
        self.pyramid_height = sp.pyramid_height
        self.random_stream = RandomStream(self.name)   # STOCHASTIC's draws, level after level
        # Caffe concatenates the levels; with no level its Concat layer has no bottom and fails.
        self.check(self.pyramid_height >= 1, "pyramid_height must be at least 1")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.check(len(shape) == 4, LEGACY_4D)
        num, channels, height, width = shape
        self.check(height > 0 and width > 0, "Input dimensions cannot be zero.")
        pool = self.param.spp_param.pool   # SPPParameter.PoolMethod has the same values as PoolingParameter's
        self.levels = []
        for level in range(self.pyramid_height):
            kernel, stride, pad = spp_level_geometry(height, width, level)
            # The internal Pooling layer's checks (pooling_layer.cpp LayerSetUp / Reshape).
            if any(pad):
                self.check(pool in (PP.AVE, PP.MAX), "Padding implemented only for average and max pooling.")
                self.check(pad[0] < kernel[0] and pad[1] < kernel[1],
                           "pyramid level %d: pad %s must be smaller than the kernel %s (input %dx%d too small for "
                           "%d bins)" % (level, pad, kernel, height, width, 2 ** level))
            pooled = pooled_shape((height, width), kernel, stride, pad)
            self.levels.append((kernel, stride, pad, pooled))
        self.level_outputs = []
        for i, (_, _, _, pooled) in enumerate(self.levels):
            level_shape = (num, channels) + pooled
            self.level_outputs.append(
                (self.buffer("level%d" % i, level_shape, bottom[0].dtype) if self.pyramid_height > 1 else None,
                 self.buffer("index%d" % i, level_shape, np.int32) if pool != PP.AVE else None))
        if self.pyramid_height == 1:
            # Caffe runs the single Pooling layer straight into the top: no flatten, a 4-axis top.
            top[0].reshape((num, channels) + self.levels[0][3])
        else:
            top[0].reshape((num, sum(channels * p[0] * p[1] for _, _, _, p in self.levels)))

    def forward(self, bottom, top):
        pool, x = self.param.spp_param.pool, bottom[0].data
        if self.pyramid_height == 1:
            kernel, stride, pad, _ = self.levels[0]
            pool_forward(pool, self.train, x, top[0].data, self.level_outputs[0][1], kernel, stride, pad,
                         self.random_stream)
            return
        offset = 0
        for (kernel, stride, pad, _), (y, index) in zip(self.levels, self.level_outputs):
            pool_forward(pool, self.train, x, y, index, kernel, stride, pad, self.random_stream)
            size = y.shape[1] * y.shape[2] * y.shape[3]
            top[0].data[:, offset:offset + size] = y.reshape(y.shape[0], size)
            offset += size

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        pool, x, dx = self.param.spp_param.pool, bottom[0].data, bottom[0].diff
        if self.pyramid_height == 1:
            kernel, stride, pad, _ = self.levels[0]
            pool_backward(pool, self.train, x, top[0].diff, self.level_outputs[0][1], dx, kernel, stride, pad)
            return
        # A level's windows do not overlap (stride = kernel), so accumulating level after level into dx adds
        # the same terms in the same order as Caffe's Split backward ((level0 + level1) + level2 ...).
        dx[...] = 0
        offset = 0
        for (kernel, stride, pad, _), (y, index) in zip(self.levels, self.level_outputs):
            size = y.shape[1] * y.shape[2] * y.shape[3]
            dy = np.ascontiguousarray(top[0].diff[:, offset:offset + size]).reshape(y.shape)
            pool_backward(pool, self.train, x, dy, index, dx, kernel, stride, pad, accumulate=True)
            offset += size

    def _gpu_levels(self, dev, shape):
        """Per level: its device output buffer (None with one level: the top) and chosen positions."""
        pool, out = self.param.spp_param.pool, []
        for i, (_, _, _, pooled) in enumerate(self.levels):
            size = shape[0] * shape[1] * pooled[0] * pooled[1]
            y = self.buffer("level%d" % i, size, device=True, at_least=True).at(0, size) \
                if self.pyramid_height > 1 else None
            index = self.buffer("index%d" % i, size, np.int32, device=True, at_least=True) if pool != PP.AVE else None
            out.append((y, index))
        return out

    def forward_gpu(self, bottom, top):
        dev, pool, shape = select.current(), self.param.spp_param.pool, bottom[0].shape
        x, out = bottom[0].gpu_data, top[0].mutable_gpu_data
        if self.pyramid_height == 1:
            kernel, stride, pad, pooled = self.levels[0]
            gpu_pool_forward(self, dev, pool, self.train, x, out, self._gpu_levels(dev, shape)[0][1], shape, pooled,
                             kernel, stride, pad)
            return
        offset, width = 0, top[0].shape[1]
        for (kernel, stride, pad, pooled), (y, index) in zip(self.levels, self._gpu_levels(dev, shape)):
            gpu_pool_forward(self, dev, pool, self.train, x, y, index, shape, pooled, kernel, stride, pad)
            size = shape[1] * pooled[0] * pooled[1]
            # the level's (N, size) rows into columns offset..offset + size of the top (Caffe's Flatten + Concat)
            dev.launch("gpu_copy_rows", y.size, size, y, size, 0, out, width, offset)
            offset += size

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dev, pool, shape = select.current(), self.param.spp_param.pool, bottom[0].shape
        x, dy, dx = bottom[0].gpu_data, top[0].gpu_diff, bottom[0].mutable_gpu_diff
        levels = self._gpu_levels(dev, shape)
        if self.pyramid_height == 1:
            kernel, stride, pad, pooled = self.levels[0]
            gpu_pool_backward(dev, pool, self.train, x, dy, levels[0][1], dx, shape, pooled, kernel, stride, pad)
            return
        # Level after level onto dx, as the CPU code (the first level overwrites: the CPU's zeros plus its terms).
        offset, width = 0, top[0].shape[1]
        for level, ((kernel, stride, pad, pooled), (y, index)) in enumerate(zip(self.levels, levels)):
            size = shape[1] * pooled[0] * pooled[1]
            dev.launch("gpu_copy_rows", y.size, size, dy, width, offset, y, size, 0)   # y now holds the level's dy
            gpu_pool_backward(dev, pool, self.train, x, y, index, dx, shape, pooled, kernel, stride, pad,
                              accumulate=level > 0)
            offset += size

    def flops(self, bottom, top):
        num, channels = bottom[0].shape[:2]
        extra = 0 if self.param.spp_param.pool == PP.MAX else 1
        return sum(num * channels * p[0] * p[1] * (k[0] * k[1] + extra) for k, _, _, p in self.levels)
