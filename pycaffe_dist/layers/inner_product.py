"""InnerProduct and Embed, after Caffe's src/caffe/layers/inner_product_layer.cpp and embed_layer.cpp; on the GPU
inner_product_layer.cu (cuBLAS) and embed_layer.cu (kernels in csrc/cuda/im2col.cu)."""
import numpy as np

from ..backend import blas, select
from ..blob.blob import count
from .base import Layer, check_param_shapes, checked_axis
from .gpu_helpers import gpu_ones
from .registry import register


@register("InnerProduct")
class InnerProductLayer(Layer):
    """top = bottom (flattened from `axis` into K) x W^T + b; top shape = bottom.shape[:axis] + (num_output,).
    Weights (num_output, K), or (K, num_output) with transpose."""
    reshape_from_shapes = True
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        ip = self.param.inner_product_param
        self.num_output = ip.num_output
        self.bias_term = ip.bias_term
        self.transpose = ip.transpose
        # (Caffe has no CHECK on num_output here; a 0 would make an empty top.)
        axis = checked_axis(self, ip.axis, len(bottom[0].shape))
        self.K = bottom[0].count_range(axis)
        expected = [(self.K, self.num_output) if self.transpose else (self.num_output, self.K)]
        if self.bias_term:
            expected.append((self.num_output,))
        if self.blobs:
            check_param_shapes(self, expected)   # Caffe only logs "Skipping parameter initialization"
        else:
            self.blobs = [self.make_param(expected[0], ip.weight_filler)]
            if self.bias_term:
                self.blobs.append(self.make_param(expected[1], ip.bias_filler))

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        axis = checked_axis(self, self.param.inner_product_param.axis, len(shape))
        self.check(count(shape, axis) == self.K, "Input size incompatible with inner product parameters "
                   "(%d inputs from axis %d of %s, the weights take %d)." % (count(shape, axis), axis, shape, self.K))
        self.M = count(shape, 0, axis)
        top[0].reshape(shape[:axis] + (self.num_output,))

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.M, self.K)
        w = self.blobs[0].data
        y = top[0].data.reshape(self.M, self.num_output)
        blas.gemm(False, not self.transpose, 1.0, x, w, 0.0, y)
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(self.M, self.num_output)
        x = bottom[0].data.reshape(self.M, self.K)
        if self.param_propagate_down[0]:
            # Caffe accumulates: its GEMM has beta = 1.
            dw = self.blobs[0].diff
            if self.transpose:
                blas.gemm(True, False, 1.0, x, dy, 1.0, dw)
            else:
                blas.gemm(True, False, 1.0, dy, x, 1.0, dw)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff[...] += dy.sum(axis=0)
        if propagate_down[0]:
            blas.gemm(False, self.transpose, 1.0, dy, self.blobs[0].data, 0.0, bottom[0].diff.reshape(self.M, self.K))

    def forward_gpu(self, bottom, top):
        # Caffe's inner_product_layer.cu: a GEMV for one row (with the weights' layout honoured, which Caffe's
        # M == 1 branch forgets under `transpose`), else a GEMM; the bias as a rank-1 GEMM with ones.
        dev, M, N, K = select.current(), self.M, self.num_output, self.K
        x, w, y = bottom[0].gpu_data, self.blobs[0].gpu_data, top[0].mutable_gpu_data
        if M == 1:
            if self.transpose:
                dev.gemv(True, K, N, 1.0, w, x, 0.0, y)
            else:
                dev.gemv(False, N, K, 1.0, w, x, 0.0, y)
            if self.bias_term:
                dev.axpy(N, 1.0, self.blobs[1].gpu_data, y)
            return
        dev.gemm(False, not self.transpose, M, N, K, 1.0, x, w, 0.0, y)
        if self.bias_term:
            dev.gemm(False, False, M, N, 1, 1.0, gpu_ones(self, M), self.blobs[1].gpu_data, 1.0, y)

    def backward_gpu(self, top, propagate_down, bottom):
        dev, M, N, K = select.current(), self.M, self.num_output, self.K
        dy, x = top[0].gpu_diff, bottom[0].gpu_data
        if self.param_propagate_down[0]:
            dw = self.blobs[0].mutable_gpu_diff      # Caffe accumulates: beta = 1
            if self.transpose:
                dev.gemm(True, False, K, N, M, 1.0, x, dy, 1.0, dw)
            else:
                dev.gemm(True, False, N, K, M, 1.0, dy, x, 1.0, dw)
        if self.bias_term and self.param_propagate_down[1]:
            dev.gemv(True, M, N, 1.0, dy, gpu_ones(self, M), 1.0, self.blobs[1].mutable_gpu_diff)
        if propagate_down[0]:
            dev.gemm(False, self.transpose, M, K, N, 1.0, dy, self.blobs[0].gpu_data, 0.0,
                     bottom[0].mutable_gpu_diff)

    def flops(self, bottom, top):
        return self.M * self.num_output * (2 * self.K + (1 if self.bias_term else 0))


@register("Embed")
class EmbedLayer(Layer):
    """A lookup table: each bottom value (an index in [0, input_dim)) becomes a row of W (input_dim, num_output),
    plus the bias; top shape = bottom.shape + (num_output,)."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        ep = self.param.embed_param
        self.num_output = ep.num_output
        self.check(self.num_output > 0, "EmbedLayer num_output must be positive.")
        self.input_dim = ep.input_dim
        self.check(self.input_dim > 0, "EmbedLayer input_dim must be positive.")
        self.bias_term = ep.bias_term
        expected = [(self.input_dim, self.num_output)]
        if self.bias_term:
            expected.append((self.num_output,))
        if self.blobs:
            check_param_shapes(self, expected)
        else:
            self.blobs = [self.make_param(expected[0], ep.weight_filler)]
            if self.bias_term:
                self.blobs.append(self.make_param(expected[1], ep.bias_filler))

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape + (self.num_output,))

    def _indices(self, bottom):
        values = bottom[0].cpu_data.reshape(-1)   # read only: a device copy stays current
        index = values.astype(np.int64)
        bad = (index < 0) | (index >= self.input_dim) | (index != values)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise self.error("input %d is %r: expected an integer index in [0, %d) (input_dim)"
                             % (i, float(values[i]), self.input_dim))
        return index

    def forward(self, bottom, top):
        y = top[0].data.reshape(-1, self.num_output)
        np.take(self.blobs[0].data, self._indices(bottom), axis=0, out=y)
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        self.check(not propagate_down[0], "Can't backpropagate to EmbedLayer input.")
        dy = top[0].diff.reshape(-1, self.num_output)
        if self.param_propagate_down[0]:
            np.add.at(self.blobs[0].diff, self._indices(bottom), dy)   # repeated indices add up
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff[...] += dy.sum(axis=0)

    def forward_gpu(self, bottom, top):
        # Caffe's embed_layer.cu gathers rows of W by the indices. The indices are checked on the host first, as
        # the CPU code does (Caffe's GPU does not check them): they are few, one per top row.
        dev = select.current()
        index = self._indices(bottom).astype(np.int32)
        rows = index.size
        if rows == 0:
            return
        gpu_index = self.buffer("index", rows, np.int32, device=True, at_least=True)
        dev.upload(gpu_index.at(0, rows), index)
        y = top[0].mutable_gpu_data
        dev.launch("embed_forward", rows * self.num_output, gpu_index, self.blobs[0].gpu_data, self.num_output, y)
        if self.bias_term:
            dev.gemm(False, False, rows, self.num_output, 1, 1.0, gpu_ones(self, rows), self.blobs[1].gpu_data,
                     1.0, y)

    def backward_gpu(self, top, propagate_down, bottom):
        self.check(not propagate_down[0], "Can't backpropagate to EmbedLayer input.")
        dev = select.current()
        dy = top[0].gpu_diff
        rows = count(bottom[0].shape)
        if rows == 0:
            return
        if self.param_propagate_down[0]:
            # Caffe's EmbedBackward adds with atomics; we group the positions of each index on the host (stable, so
            # in position order, as np.add.at adds them) and let one thread per weight entry sum its own.
            index = self._indices(bottom)
            positions = np.argsort(index, kind="stable").astype(np.int32)
            starts = np.searchsorted(index[positions], np.arange(self.input_dim + 1)).astype(np.int32)
            table = self.buffer("table", rows + self.input_dim + 1, np.int32, device=True, at_least=True)
            dev.upload(table.at(0, rows), positions)
            dev.upload(table.at(rows, self.input_dim + 1), starts)
            dev.launch("embed_backward", self.input_dim * self.num_output, dy, table.at(0, rows),
                       table.at(rows, self.input_dim + 1), self.num_output, self.blobs[0].mutable_gpu_diff)
        if self.bias_term and self.param_propagate_down[1]:
            dev.gemv(True, rows, self.num_output, 1.0, dy, gpu_ones(self, rows), 1.0,
                     self.blobs[1].mutable_gpu_diff)

    def allow_force_backward(self, bottom_index):
        # Caffe's Embed backward CHECKs "Can't backpropagate to EmbedLayer input." and does not override
        # AllowForceBackward, so force_backward crashes it. Deliberate difference: we refuse force_backward to the
        # indices instead, so such a net runs (the indices get no gradient, as they never can).
        return bottom_index != 0

    def flops(self, bottom, top):
        return top[0].count if self.bias_term else 0   # the lookup is a copy; the bias adds
