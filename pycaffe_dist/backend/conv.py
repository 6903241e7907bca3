"""Batched convolution GEMMs on the CPU, for Convolution and Deconvolution.

Caffe runs im2col and three small GEMMs per image. Here a chunk of images is unrolled at once into the batch
column layout of csrc/im2col.pyx, (rows, n, P), so each group does ONE GEMM over n * P columns: far better BLAS
efficiency on small images (LeNet's 8x8 maps make 64-column GEMMs in Caffe). Chunks are sized so that the
column buffer stays in cache between im2col and the GEMM that reads it.

Names are those of convolution: the "image side" is what im2col reads (a convolution's bottom, a
deconvolution's top), W is (out_channels, in_channels / group, *kernel) seen as (group, Mg, Kg), the "output
side" is (N, out_channels, P). A deconvolution's forward is a convolution's backward, and vice versa.
"""
import numpy as np

from .._kernels import im2col as _k

COL_CHUNK_BYTES = 4 << 20   # column buffer per chunk: about an L2/L3-sized working set


def _count(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


class ConvEngine:
    def __init__(self, im_shape, kernel, pad, stride, dilation, group, out_channels, force_nd=False):
        self.im_shape = tuple(int(d) for d in im_shape)              # (C, *spatial) of one image
        self.geometry = (self.im_shape, tuple(kernel), tuple(pad), tuple(stride), tuple(dilation))
        self.force_nd = bool(force_nd)
        col_shape = _k.col_shape(*self.geometry)
        self.rows = col_shape[0]                                      # C * prod(kernel)
        self.out_spatial = tuple(col_shape[1:])
        self.positions = _count(self.out_spatial)                     # P
        self.group = int(group)
        self.out_channels = int(out_channels)
        self.mg = self.out_channels // self.group
        self.kg = self.rows // self.group
        # Caffe's is_1x1_: the image is its own column buffer (per image), so no im2col is needed.
        self.is_1x1 = all(k == 1 for k in kernel) and all(s == 1 for s in stride) and all(p == 0 for p in pad)
        self._buffers = {}

    def _buffer(self, name, size, dtype):
        key = (name, np.dtype(dtype))
        buf = self._buffers.get(key)
        if buf is None or buf.size < size:
            buf = self._buffers[key] = np.empty(size, dtype=dtype)
        return buf[:size]

    def _chunks(self, num, itemsize):
        per_image = max(1, self.rows * self.positions * itemsize)
        step = max(1, min(num, COL_CHUNK_BYTES // per_image))
        return [(n0, min(num, n0 + step)) for n0 in range(0, num, step)]

    def _im2col(self, ims, n):
        """Column buffer (group, Kg, n * P) of n images (n, C, *spatial)."""
        col = self._buffer("col", self.rows * n * self.positions, ims.dtype)
        _k.im2col(ims.reshape(-1), col, *self.geometry, force_nd=self.force_nd, num=n)
        return col.reshape(self.group, self.kg, n * self.positions)

    def _to_group_major(self, y, n, name):
        """(n, out_channels, P) -> (group, Mg, n * P): the output side in column layout."""
        buf = self._buffer(name, self.out_channels * n * self.positions, y.dtype)
        buf = buf.reshape(self.out_channels, n, self.positions)
        np.copyto(buf, y.reshape(n, self.out_channels, self.positions).transpose(1, 0, 2))
        return buf.reshape(self.group, self.mg, n * self.positions)

    def _weights(self, w):
        return w.reshape(self.group, self.mg, self.kg)

    def _accumulate_weight_grad(self, dw, yt, col):
        # dW (group, Mg, Kg) += y (group, Mg, nP) x col^T: numpy passes the transposed view to BLAS as is.
        dw.reshape(self.group, self.mg, self.kg)[...] += np.matmul(yt, col.transpose(0, 2, 1))

    def image_to_output(self, w, ims, out=None, bias=None, dw=None, y=None):
        """Per chunk: col = im2col(ims); out = W col (+ bias), and/or dW += y col^T.
        Convolution forward (out) and a deconvolution's backward (out = bottom diff, dW with y = its bottom)."""
        num = ims.shape[0]
        ims = np.ascontiguousarray(ims)
        wg = self._weights(w)
        for n0, n1 in self._chunks(num, ims.dtype.itemsize):
            n = n1 - n0
            if out is not None and dw is None and self.is_1x1:
                # The images are their own columns: one GEMM per image writes the output in place.
                np.matmul(wg, ims[n0:n1].reshape(n, self.group, self.kg, self.positions),
                          out=out[n0:n1].reshape(n, self.group, self.mg, self.positions))
                if bias is not None:
                    out[n0:n1].reshape(n, self.out_channels, self.positions)[...] += bias[:, None]
                continue
            col = self._im2col(ims[n0:n1], n)
            if dw is not None:
                self._accumulate_weight_grad(dw, self._to_group_major(y[n0:n1], n, "y"), col)
            if out is not None:
                prod = self._buffer("prod", self.out_channels * n * self.positions, ims.dtype)
                np.matmul(wg, col, out=prod.reshape(self.group, self.mg, n * self.positions))
                target = out[n0:n1].reshape(n, self.out_channels, self.positions)
                prod = prod.reshape(self.out_channels, n, self.positions).transpose(1, 0, 2)
                if bias is None:
                    np.copyto(target, prod)
                else:
                    np.add(prod, bias[None, :, None], out=target)

    def output_to_image(self, w, y, ims_out=None, dw=None, ims_in=None):
        """Per chunk: yt = y in column layout; ims_out = col2im(W^T yt), and/or dW += yt im2col(ims_in)^T.
        Convolution backward (bottom diff, weight diff) and a deconvolution's forward (ims_out = its top)."""
        num = y.shape[0]
        y = np.ascontiguousarray(y)
        wg = self._weights(w)
        if ims_in is not None:
            ims_in = np.ascontiguousarray(ims_in)
        for n0, n1 in self._chunks(num, y.dtype.itemsize):
            n = n1 - n0
            if ims_out is not None and dw is None and self.is_1x1:
                np.matmul(wg.transpose(0, 2, 1), y[n0:n1].reshape(n, self.group, self.mg, self.positions),
                          out=ims_out[n0:n1].reshape(n, self.group, self.kg, self.positions))
                continue
            yt = self._to_group_major(y[n0:n1], n, "y")
            if dw is not None:
                self._accumulate_weight_grad(dw, yt, self._im2col(ims_in[n0:n1], n))
            if ims_out is not None:
                col = self._buffer("col", self.rows * n * self.positions, y.dtype)
                np.matmul(wg.transpose(0, 2, 1), yt, out=col.reshape(self.group, self.kg, n * self.positions))
                _k.col2im(col, ims_out[n0:n1].reshape(-1), *self.geometry, force_nd=self.force_nd, num=n)
