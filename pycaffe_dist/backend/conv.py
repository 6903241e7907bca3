"""Batched convolution GEMMs on the CPU, for Convolution and Deconvolution (the kernels: csrc/conv_im2col.pyx, and
for float32 2-D geometries on CPUs with AVX2 and FMA csrc/conv_fused.pyx).

Caffe runs im2col and three small GEMMs per image. Here a chunk of images is unrolled at once into the batch
column layout (rows, n, P), so each group does ONE GEMM over n * P columns: far better BLAS efficiency on small
maps (LeNet's 8x8 maps make 64-column GEMMs in Caffe). Chunks are sized so that the column buffer stays in
cache between im2col and the GEMM that reads it, and OpenMP threads take whole chunks, each calling a
single-threaded BLAS: the threads split the batch instead of contending inside every small GEMM.

Names are those of convolution: the "image side" is what im2col reads (a convolution's bottom, a
deconvolution's top), W is (out_channels, in_channels / group, *kernel), the "output side" is
(N, out_channels, P). A deconvolution's forward is a convolution's backward, and vice versa.
"""
import math

import numpy as np

from .. import common
from . import blas
from .._kernels import conv_fused as _fused
from .._kernels import im2col as _k

COL_CHUNK_BYTES = 512 << 10   # column buffer per chunk: about L2-sized, so the GEMM reads what im2col wrote from L2
# The fused path (conv_fused) unrolls no columns for the forward and dW, so its chunk need not fit L2: chunks of at
# least this many output positions, where the batch allows. A chunk is one GEMM's columns (forward) or depth (dW):
# at one image of ResNet-18's 7 x 7 maps (49 columns) its forward streamed all 9 MB of packed weights, and its dW
# read and wrote all 9 MB of the weight gradient, for each image; 16 images do that once.
FUSED_CHUNK_POSITIONS = 1024
# float32 2-D convolutions multiply straight from the images (csrc/conv_fused.pyx, csrc/sgemm.h) where the build has
# AVX2 and FMA; False sends them through BLAS and unrolled columns too (the tests compare the two). None: decided
# at the first convolution, by what the build has.
use_sgemm = None


def sgemm_enabled():
    global use_sgemm
    if use_sgemm is None:
        use_sgemm = bool(_fused.fused_available())
    return use_sgemm


def _flat(array, dtype, writable=False):
    if array is None:
        return np.empty(0, dtype=dtype)
    if writable and not (array.flags.c_contiguous and array.dtype == dtype):
        raise ValueError("convolution output must be a C-contiguous %s array" % np.dtype(dtype))
    return np.ascontiguousarray(array, dtype=dtype).reshape(-1)


class ConvEngine:
    def __init__(self, im_shape, kernel, pad, stride, dilation, group, out_channels, force_nd=False):
        self.im_shape = tuple(int(d) for d in im_shape)              # (C, *spatial) of one image
        # Caffe's output size truncates towards zero, so a window wider than the padded input still gives one
        # output, whose taps run past the padded copy the 2-D paths read; Caffe's N-d loops test every tap.
        spatial = self.im_shape[1:]
        overhang = any(d + 2 * p < dl * (k - 1) + 1 for d, k, p, dl in zip(spatial, kernel, pad, dilation))
        self.force_nd = bool(force_nd) or overhang
        self.geometry = (self.im_shape, tuple(kernel), tuple(pad), tuple(stride), tuple(dilation))
        col_shape = _k.col_shape(*self.geometry)
        self.rows = col_shape[0]                                      # C * prod(kernel)
        self.out_spatial = tuple(col_shape[1:])
        self.positions = math.prod(self.out_spatial)                  # P
        self.group = int(group)
        self.out_channels = int(out_channels)
        self._scratch = {}
        # 2-D images are unrolled from a zero-padded copy (one per thread, in the scratch buffer).
        self.rows2d = len(spatial) == 2 and not self.force_nd
        self.padded_count = 0
        if self.rows2d:
            self.padded_count = self.im_shape[0] * math.prod(d + 2 * p for d, p in zip(spatial, pad))

    def _chunk(self, num, itemsize, threads, fused=False):
        per_image = max(1, self.rows * self.positions * itemsize)
        by_cache = max(1, COL_CHUNK_BYTES // per_image)
        if fused:
            by_cache = max(by_cache, -(-FUSED_CHUNK_POSITIONS // max(1, self.positions)))
        return max(1, min(by_cache, -(-num // threads)))              # every thread gets a chunk if it can

    def _run(self, w, num, im_in=None, y_in=None, bias=None, out=None, im_out=None, dw=None):
        dtype = w.dtype
        threads = max(1, common.num_threads())
        fused = dtype == np.float32 and self.rows2d and sgemm_enabled()
        chunk = self._chunk(num, dtype.itemsize, threads, fused)
        # Per thread: columns, output-side buffer, then a padded image.
        size = threads * ((self.rows + self.out_channels) * chunk * self.positions + self.padded_count)
        scratch = self._scratch.get(dtype)
        if scratch is None or scratch.size < size:
            scratch = self._scratch[dtype] = np.empty(size, dtype=dtype)
        # The weight gradient: one partial sum per thread, or with one thread at work dW itself (beta = 1 adds).
        direct = dw is not None and (threads == 1 or num <= chunk) and dw.dtype == dtype and dw.flags.c_contiguous
        if direct:
            partials = dw.reshape(-1)
        else:
            partials = np.zeros(threads * w.size, dtype=dtype) if dw is not None else np.empty(0, dtype=dtype)
        # Several chunks: our threads take them, each with a one-thread BLAS. One chunk: they split its GEMMs.
        arrays = (_flat(im_in, dtype), _flat(y_in, dtype), _flat(w, dtype), _flat(bias, dtype), _flat(out, dtype, True),
                  _flat(im_out, dtype, True), partials, scratch, num) + self.geometry
        if fused:
            _fused.run(*arrays, self.group, self.out_channels, chunk, threads)
        else:
            blas.kernel("conv_im2col").run(*arrays, self.force_nd, self.group, self.out_channels, chunk, threads)
        if dw is not None and not direct:
            dw += partials.reshape((threads,) + dw.shape).sum(axis=0)

    def kernel_path(self, dtype=np.float32):
        """Which kernels this geometry's passes take, in words (bench/nets.py prints it per convolution): the
        fused path's GEMM ("AVX-512" or "AVX2" micro-kernel, see conv_fused.set_simd) with, per pass, the GEMM or
        conv_direct.h's direct sums, and the input diff's correlation, fold8.h or row-by-row col2im; or the
        BLAS path (unrolled columns, im2col)."""
        if np.dtype(dtype) == np.float32 and self.rows2d and sgemm_enabled():
            plan = _fused.plan(*self.geometry, self.group, self.out_channels)
            return "%s fwd %s, dW %s, dX %s" % ({"avx512": "AVX-512", "avx2": "AVX2"}[_fused.simd()],
                                                 plan["forward"], plan["dW"], plan["dX"])
        return "BLAS im2col%s" % (" (N-d)" if self.force_nd else "")

    def image_to_output(self, w, ims, out=None, bias=None, dw=None, y=None):
        """col = im2col(ims); out = W col (+ bias), and/or dW += y col^T.
        Convolution forward (out) and a deconvolution's backward (out = bottom diff, dW with y = its bottom)."""
        self._run(w, ims.shape[0], im_in=ims, y_in=y if dw is not None else None, bias=bias, out=out, dw=dw)

    def output_to_image(self, w, y, ims_out=None, dw=None, ims_in=None):
        """ims_out = col2im(W^T y), and/or dW += y im2col(ims_in)^T.
        Convolution backward (bottom diff, weight diff) and a deconvolution's forward (ims_out = its top)."""
        self._run(w, y.shape[0], im_in=ims_in if dw is not None else None, y_in=y, im_out=ims_out, dw=dw)
