// Reduction (pycaffe_dist/layers/reduction.py), after Caffe's src/caffe/layers/reduction_layer.cu. Caffe reduces
// one slice at a time (a cuBLAS dot or asum per slice, each result read back by the host); here every slice is
// reduced at once, and without atomics: each pass sums fixed strided parts of the slices, one thread per part, and
// the layer repeats passes until one part per slice is left, so the sum is the same at every run.
// `op` is ReductionParameter's ReductionOp: SUM = 1, ASUM = 2, SUMSQ = 3, MEAN = 4.
#include "common.cuh"

// The value that op adds up for x: x (SUM, MEAN), |x| (ASUM) or x * x (SUMSQ).
PCD_DEVICE float reduction_term(const int op, const float x) {
  return op == 2 ? fabsf(x) : (op == 3 ? x * x : x);
}

// x viewed as (slices, dim): thread (s, p) (n = slices * parts) adds the terms of slice s at p, p + parts,
// p + 2 parts, ... (neighbouring threads read neighbouring values) and writes the sum times scale to
// y[s * parts + p]. With parts = 1 that is the whole slice.
PCD_KERNEL void reduction_sum_parts(const int n, const int dim, const int parts, const int op, const float scale,
                                    const float* x, float* y) {
  CUDA_KERNEL_LOOP(index, n) {
    const int s = index / parts, p = index % parts;
    const float* row = x + static_cast<long long>(s) * dim;
    float sum = 0;
    for (int k = p; k < dim; k += parts) sum += reduction_term(op, row[k]);
    y[index] = sum * scale;
  }
}

// dx = dy[slice] * scale times 1 (SUM, MEAN), sign(x) (ASUM) or 2 x (SUMSQ), n = the bottom's count; scale is
// coeff, divided by dim for MEAN (reduction_layer.cu's Backward_gpu, for all slices in one launch).
PCD_KERNEL void reduction_backward(const int n, const int dim, const int op, const float scale, const float* x,
                                   const float* dy, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float c = dy[i / dim] * scale;
    const float v = x[i];
    if (op == 2) {
      dx[i] = ((0.0f < v) - (v < 0.0f)) * c;
    } else if (op == 3) {
      dx[i] = v * (2.0f * c);
    } else {
      dx[i] = c;
    }
  }
}
