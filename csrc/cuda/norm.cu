// BatchNorm and MVN helpers (src/caffe/layers/batch_norm_layer.cu, mvn_layer.cu). Caffe broadcasts its per-group
// statistics with rank-1 GEMMs against vectors of ones; these kernels do the broadcast and the element-wise step
// in one pass instead. Element i belongs to group (i / inner) % groups: BatchNorm's channels (inner = the spatial
// size), or MVN's rows (groups = rows, inner = the row length). The sums themselves stay GEMVs with ones vectors.
#include "common.cuh"

// y = x - value[group]; y may be x.
PCD_KERNEL void norm_subtract_group(const int n, const float* x, const float* value, const int groups,
                                    const int inner, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] - value[(i / inner) % groups]; }
}

// y = x / value[group]; y may be x.
PCD_KERNEL void norm_divide_group(const int n, const float* x, const float* value, const int groups,
                                  const int inner, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] / value[(i / inner) % groups]; }
}

// The backward of y = (x - mean) / std through the batch statistics, with the CPU path's operation order:
// dx = (dy + neg_inv_m * (y * sum_dyy[group] + sum_dy[group])) / std[group], neg_inv_m = -1 / (elements per group).
// dx may be dy.
PCD_KERNEL void norm_backward(const int n, const float* top_diff, const float* top_data, const float* sum_dyy,
                              const float* sum_dy, const float* std_dev, const int groups, const int inner,
                              const float neg_inv_m, float* bottom_diff) {
  CUDA_KERNEL_LOOP(i, n) {
    const int g = (i / inner) % groups;
    const float t = top_data[i] * sum_dyy[g] + sum_dy[g];
    bottom_diff[i] = (top_diff[i] + neg_inv_m * t) / std_dev[g];
  }
}
