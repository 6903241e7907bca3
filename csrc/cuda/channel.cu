// Per-channel sums over a tensor viewed as (outer, channels, inner): BatchNorm's batch statistics and gradient sums,
// Scale's and Bias's parameter gradients (pycaffe_dist/layers/channel_sums.py launches them); and the BatchNorm
// kernels that use them (layers/norm.py), alone and with the Scale after it (net/gpu_fusion.py).
//
// Caffe sums these with GEMVs against vectors of ones, two per sum, after an element-wise pass that writes the
// product (dy * x) or the square ((x - mean)^2) to a scratch tensor of the bottom's size: BatchNorm's forward read
// and wrote its tensor ten times, its backward eight. Here one pass reads the tensor (or the two) once and sums both
// quantities together, and no scratch tensor exists.
//
// Deterministic without atomics or shared memory (common.cuh): thread (c, p) of n = channels * parts sums the
// elements k = p, p + parts, ... of channel c's m = outer * inner (element k is image k / inner, position
// k % inner, so the 32 threads of a warp read neighbouring addresses); "fold" kernels combine groups of `width`
// consecutive parts in order, as often as it takes to leave a few, and a last kernel, one thread per channel,
// combines those. The partition depends on the shape only, so every run gives the same bits.
#include "common.cuh"

// A product rounded on its own, never contracted into an FMA with the addition after it (nvcc contracts by default):
// the statistics' weight must equal the CPU path's float32 factor * maf + 1 bit for bit.
#ifdef __CUDACC__
#define PCD_MUL_ROUNDED(a, b) __fmul_rn(a, b)
#else
#define PCD_MUL_ROUNDED(a, b) ((a) * (b))
#endif

// Thread (c, p)'s walk over channel c's elements k = p, p + parts, ...: the element's offset in the tensor, and the
// step to the next without a division: (image, position) advance by (parts / inner, parts % inner), one carry.
struct ChannelWalk {
  long long image_stride, base;
  int step_image, step_position, inner, image, position;
};

PCD_DEVICE ChannelWalk channel_walk(const int c, const int p, const int channels, const int inner, const int parts) {
  ChannelWalk w;
  w.image_stride = static_cast<long long>(channels) * inner;
  w.base = static_cast<long long>(c) * inner;
  w.step_image = parts / inner;
  w.step_position = parts % inner;
  w.inner = inner;
  w.image = p / inner;
  w.position = p % inner;
  return w;
}

PCD_DEVICE long long walk_offset(const ChannelWalk& w) { return w.image * w.image_stride + w.base + w.position; }

PCD_DEVICE void walk_next(ChannelWalk& w) {
  w.image += w.step_image;
  w.position += w.step_position;
  if (w.position >= w.inner) {
    w.position -= w.inner;
    w.image += 1;
  }
}

// The Scale's output for x_norm v in channel c: v * scale[c] (+ bias[c] where has_bias). The fused backward
// recomputes it from the kept x_norm to know where the ReLU let the gradient through: the same float operations on
// the same values, so the same bits as the forward's.
PCD_DEVICE float scaled_value(const float v, const float* scale, const float* bias, const int has_bias, const int c) {
  return has_bias ? v * scale[c] + bias[c] : v * scale[c];
}

// The ReLU's backward inside the fused backward: dy where the Scale's output was positive, else dy * 0
// (relu_backward's arithmetic: a NaN gradient stays NaN).
PCD_DEVICE float relu_gradient(const float dy, const float v, const float* scale, const float* bias,
                               const int has_bias, const int c) {
  return dy * (scaled_value(v, scale, bias, has_bias, c) > 0.0f ? 1.0f : 0.0f);
}

// part_a[c * parts + p] = the sum of a over thread (c, p)'s elements, part_ab[...] = the sum of a * b (b may be a).
// Where relu, a is a ReLU's top diff over b, the x_norm of the fused BatchNorm + Scale + ReLU under it
// (net/gpu_fusion.py), and is taken through the ReLU first: the ReLU's bottom diff is summed, and times x_norm.
PCD_KERNEL void channel_sums_parts(const int n, const float* a, const float* b, const float* scale, const float* bias,
                                   const int has_bias, const int relu, const int channels, const int inner,
                                   const int m, const int parts, float* part_a, float* part_ab) {
  CUDA_KERNEL_LOOP(index, n) {
    const int c = index / parts, p = index % parts;
    ChannelWalk w = channel_walk(c, p, channels, inner, parts);
    float sum_a = 0, sum_ab = 0;
    for (int k = p; k < m; k += parts, walk_next(w)) {
      const long long at = walk_offset(w);
      const float vb = b[at];
      const float va = relu ? relu_gradient(a[at], vb, scale, bias, has_bias, c) : a[at];
      sum_a += va;
      sum_ab += va * vb;
    }
    part_a[index] = sum_a;
    part_ab[index] = sum_ab;
  }
}

// Thread (c, g) of n = channels * groups (groups = ceil(parts / width)) adds parts g * width ... (g + 1) * width - 1
// of channel c, in order, into fold_a[c * groups + g] (fold_ab likewise).
PCD_KERNEL void channel_sums_fold(const int n, const int parts, const int width, const float* part_a,
                                  const float* part_ab, float* fold_a, float* fold_ab) {
  CUDA_KERNEL_LOOP(index, n) {
    const int groups = (parts + width - 1) / width;
    const int c = index / groups, from = (index % groups) * width, to = min(from + width, parts);
    float sum_a = 0, sum_ab = 0;
    for (int p = from; p < to; ++p) {
      sum_a += part_a[c * parts + p];
      sum_ab += part_ab[c * parts + p];
    }
    fold_a[index] = sum_a;
    fold_ab[index] = sum_ab;
  }
}

// out_a[c] = beta_a * out_a[c] + the parts of c in order (out_a is not read where beta_a is 0); out_ab likewise.
PCD_KERNEL void channel_sums_merge(const int n, const float* part_a, const float* part_ab, const int parts,
                                   const float beta_a, const float beta_ab, float* out_a, float* out_ab) {
  CUDA_KERNEL_LOOP(c, n) {
    float sum_a = 0, sum_ab = 0;
    for (int p = 0; p < parts; ++p) {
      sum_a += part_a[c * parts + p];
      sum_ab += part_ab[c * parts + p];
    }
    out_a[c] = beta_a == 0.0f ? sum_a : beta_a * out_a[c] + sum_a;
    out_ab[c] = beta_ab == 0.0f ? sum_ab : beta_ab * out_ab[c] + sum_ab;
  }
}

// Thread (c, p)'s elements' count, mean and sum of squared deviations, for the batch statistics: Welford's update
// over x - shift, shift = the channel's first element (image 0, position 0). Welford's update has no cancellation
// whatever the spread, and the shift keeps the means small, so that a mean large against the spread (10^4 times
// it, say) costs the variance no accuracy in float32; part_mean is relative to the shift.
PCD_KERNEL void channel_moments_parts(const int n, const float* x, const int channels, const int inner, const int m,
                                      const int parts, float* part_count, float* part_mean, float* part_m2) {
  CUDA_KERNEL_LOOP(index, n) {
    const int c = index / parts, p = index % parts;
    ChannelWalk w = channel_walk(c, p, channels, inner, parts);
    const float shift = m > 0 ? x[w.base] : 0.0f;
    float mean = 0, m2 = 0, seen = 0;
    for (int k = p; k < m; k += parts, walk_next(w)) {
      const float v = x[walk_offset(w)] - shift;
      seen += 1;
      const float delta = v - mean;
      mean += delta / seen;
      m2 += delta * (v - mean);
    }
    part_count[index] = seen;
    part_mean[index] = mean;
    part_m2[index] = m2;
  }
}

// (count, mean, m2) += a part's (seen, part_mean, part_m2): Chan, Golub and LeVeque's pairwise combination.
PCD_DEVICE void combine_moments(float& count, float& mean, float& m2, const float seen, const float part_mean,
                                const float part_m2) {
  if (seen == 0.0f) return;
  const float total = count + seen;
  const float delta = part_mean - mean;
  mean += delta * (seen / total);
  m2 += part_m2 + delta * delta * (count * seen / total);
  count = total;
}

// The moments' fold (as channel_sums_fold): groups of `width` consecutive parts combined in order.
PCD_KERNEL void channel_moments_fold(const int n, const int parts, const int width, const float* part_count,
                                     const float* part_mean, const float* part_m2, float* fold_count,
                                     float* fold_mean, float* fold_m2) {
  CUDA_KERNEL_LOOP(index, n) {
    const int groups = (parts + width - 1) / width;
    const int c = index / groups, from = (index % groups) * width, to = min(from + width, parts);
    float count = 0, mean = 0, m2 = 0;
    for (int p = from; p < to; ++p) {
      combine_moments(count, mean, m2, part_count[c * parts + p], part_mean[c * parts + p], part_m2[c * parts + p]);
    }
    fold_count[index] = count;
    fold_mean[index] = mean;
    fold_m2[index] = m2;
  }
}

// BatchNorm's batch statistics from the parts (combined in order; x gives the parts' shift back): mean[c], and
// std[c] = sqrt(variance + eps) with the biased variance (M2 / m), as batch_norm_layer.cu normalises; then the
// moving sums, mean_sum = mean + maf * mean_sum and variance_sum = correction * variance + maf * variance_sum
// (correction = m / (m - 1): the unbiased estimate), and thread 0 the statistics' weight, factor = factor * maf + 1,
// on the device, where Caffe reads and writes it on the host.
PCD_KERNEL void batch_norm_statistics(const int n, const float* x, const int inner, const float* part_count,
                                      const float* part_mean, const float* part_m2, const int m, const int parts,
                                      const float maf, const float correction, const float eps, float* mean,
                                      float* std_dev, float* mean_sum, float* variance_sum, float* factor) {
  CUDA_KERNEL_LOOP(c, n) {
    float count = 0, mu = 0, m2 = 0;
    for (int p = 0; p < parts; ++p) {
      combine_moments(count, mu, m2, part_count[c * parts + p], part_mean[c * parts + p], part_m2[c * parts + p]);
    }
    const float variance = m > 0 ? m2 / static_cast<float>(m) : 0.0f;
    const float average = m > 0 ? x[static_cast<long long>(c) * inner] + mu : 0.0f;
    mean[c] = average;
    std_dev[c] = sqrtf(variance + eps);
    mean_sum[c] = average + maf * mean_sum[c];
    variance_sum[c] = correction * variance + maf * variance_sum[c];
    if (c == 0) factor[0] = PCD_MUL_ROUNDED(factor[0], maf) + 1.0f;
  }
}

// The stored statistics (use_global_stats): the sums divided by their weight (zero statistics where it is 0),
// mean[c] and std[c] = sqrt(variance + eps), with the factor read on the device.
PCD_KERNEL void batch_norm_global_statistics(const int n, const float* mean_sum, const float* variance_sum,
                                             const float* factor, const float eps, float* mean, float* std_dev) {
  CUDA_KERNEL_LOOP(c, n) {
    const float scale = factor[0] == 0.0f ? 0.0f : 1.0f / factor[0];
    mean[c] = scale * mean_sum[c];
    std_dev[c] = sqrtf(scale * variance_sum[c] + eps);
  }
}

// y = (x - mean[c]) / std[c], kept in x_norm too (the backward needs it; a later in-place layer may overwrite y).
// y may be x; x_norm may be y (nothing to keep).
PCD_KERNEL void batch_norm_normalize(const int n, const float* x, const float* mean, const float* std_dev,
                                     const int channels, const int inner, float* y, float* x_norm) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / inner) % channels;
    const float v = (x[i] - mean[c]) / std_dev[c];
    y[i] = v;
    x_norm[i] = v;
  }
}

// BatchNorm and the in-place Scale after it (and the in-place ReLU after that, where relu) in one pass
// (net/gpu_fusion.py): x_norm = (x - mean[c]) / std[c] (kept: the backward's, and the Scale's input), then
// y = x_norm * scale[c] (+ bias[c]), through the ReLU where relu. y may be x; x_norm may be y (nothing to keep): it
// is written first.
PCD_KERNEL void batch_norm_scale_normalize(const int n, const float* x, const float* mean, const float* std_dev,
                                           const float* scale, const float* bias, const int has_bias, const int relu,
                                           const int channels, const int inner, float* x_norm, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / inner) % channels;
    const float v = (x[i] - mean[c]) / std_dev[c];
    x_norm[i] = v;
    const float t = scaled_value(v, scale, bias, has_bias, c);
    y[i] = relu ? relu_value(t, 0.0f) : t;
  }
}

// The pair's dx from the Scale's sums of dy and dy * x_norm (sum_dy, sum_dyy; dy through the ReLU where relu):
// the BatchNorm's backward of the Scale's bottom diff dy * scale, whose sums are scale times these, in
// norm_backward's operation order: dx = (dy * s + neg_inv_m * (y * (s * sum_dyy) + s * sum_dy)) / std; with the
// stored statistics dx = dy * s / std. dx may be dy.
PCD_KERNEL void batch_norm_scale_backward(const int n, const float* top_diff, const float* x_norm,
                                          const float* sum_dyy, const float* sum_dy, const float* scale,
                                          const float* bias, const int has_bias, const int relu,
                                          const float* std_dev, const int global_stats, const int channels,
                                          const int inner, const float neg_inv_m, float* bottom_diff) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / inner) % channels;
    const float s = scale[c];
    const float v = x_norm[i];
    const float dy = relu ? relu_gradient(top_diff[i], v, scale, bias, has_bias, c) : top_diff[i];
    const float scaled = dy * s;
    if (global_stats) {
      bottom_diff[i] = scaled / std_dev[c];
    } else {
      const float t = v * (s * sum_dyy[c]) + s * sum_dy[c];
      bottom_diff[i] = (scaled + neg_inv_m * t) / std_dev[c];
    }
  }
}

// The Scale's parameter gradients from the pair's sums: bias_diff += sum_dy where want_bias; scale_diff =
// scale_beta * scale_diff + sum_dyy where want_scale (scale_beta 0 assigns, as the Scale does where outer is 1).
PCD_KERNEL void batch_norm_scale_parameter_diffs(const int n, const float* sum_dy, const float* sum_dyy,
                                                 const int want_bias, const int want_scale, const float scale_beta,
                                                 float* bias_diff, float* scale_diff) {
  CUDA_KERNEL_LOOP(c, n) {
    if (want_bias) bias_diff[c] += sum_dy[c];
    if (want_scale) scale_diff[c] = scale_beta == 0.0f ? sum_dyy[c] : scale_beta * scale_diff[c] + sum_dyy[c];
  }
}
