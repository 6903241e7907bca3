// Element-wise helpers of Caffe's util/math_functions.cu that layers and solvers call directly, named as Caffe's
// caffe_gpu_* functions (a plain name like `div` would clash with the C library in the host build).
#include "common.cuh"

PCD_KERNEL void gpu_set(const int n, const float value, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = value; }
}

PCD_KERNEL void gpu_scale(const int n, const float alpha, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = alpha * x[i]; }
}

PCD_KERNEL void gpu_add_scalar(const int n, const float alpha, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] += alpha; }
}

PCD_KERNEL void gpu_add(const int n, const float* a, const float* b, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] + b[i]; }
}

PCD_KERNEL void gpu_sub(const int n, const float* a, const float* b, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] - b[i]; }
}

PCD_KERNEL void gpu_mul(const int n, const float* a, const float* b, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] * b[i]; }
}

PCD_KERNEL void gpu_div(const int n, const float* a, const float* b, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] / b[i]; }
}

PCD_KERNEL void gpu_powx(const int n, const float* a, const float alpha, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = pow(a[i], alpha); }
}

PCD_KERNEL void gpu_sqr(const int n, const float* a, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] * a[i]; }
}

PCD_KERNEL void gpu_sqrt(const int n, const float* a, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = sqrt(a[i]); }
}

PCD_KERNEL void gpu_abs(const int n, const float* a, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = fabs(a[i]); }
}

PCD_KERNEL void gpu_exp(const int n, const float* a, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = exp(a[i]); }
}

PCD_KERNEL void gpu_log(const int n, const float* a, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = log(a[i]); }
}

PCD_KERNEL void gpu_sign(const int n, const float* a, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = (0.0f < a[i]) - (a[i] < 0.0f); }
}

// Copy rows of `width` elements between strided layouts (Concat, Slice, Crop of the last axes): y[r * y_stride +
// y_offset + j] = x[r * x_stride + x_offset + j] for r < n / width.
PCD_KERNEL void gpu_copy_rows(const int n, const int width, const float* x, const int x_stride, const int x_offset,
                          float* y, const int y_stride, const int y_offset) {
  CUDA_KERNEL_LOOP(i, n) {
    const int r = i / width, j = i % width;
    y[r * y_stride + y_offset + j] = x[r * x_stride + x_offset + j];
  }
}

// x *= numerator / denominator[0]: cuBLAS's scal by a quotient whose denominator is on the device (a loss's
// normalizer), the quotient rounded to float32 first as the host's np.float32 division before its scal.
PCD_KERNEL void gpu_scale_by_quotient(const int n, const float numerator, const float* denominator, float* x) {
  CUDA_KERNEL_LOOP(i, n) { x[i] = (numerator / denominator[0]) * x[i]; }
}
