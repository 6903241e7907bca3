"""Convolution, Deconvolution and Im2col (im2col/col2im kernels in csrc/im2col.pyx)."""
