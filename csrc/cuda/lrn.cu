// Local response normalization, after Caffe's src/caffe/layers/lrn_layer.cu (LRNFillScale, LRNComputeOutput,
// LRNComputeDiff): ACROSS_CHANNELS runs one thread per (image, pixel) that walks the channels with a running
// window sum. The sums are accumulated in the order of our CPU kernels (csrc/lrn.pyx, Caffe's
// CrossChannelForward_cpu / CrossChannelBackward_cpu: scale starts at k and each channel adds
// alpha_over_size * x^2 of its head and subtracts that of its tail), so that the GPU path equals the CPU path
// up to the device's rounding; Caffe's GPU kernel sums x^2 first and scales at the end.
// WITHIN_CHANNEL's kernels compute what our CPU code computes for Caffe's sub-net (Power, AVE pooling, Power,
// Eltwise PROD): the size x size window sum of x^2 (zero-padded, summed row by row as AVE pooling does).
#include "common.cuh"

// scale[n, c, p] = k + alpha / size * sum of x^2 over channels c - pre_pad .. c + pre_pad; n = num * pixels.
PCD_KERNEL void lrn_fill_scale(const int n, const float* in, const int channels, const int pixels, const int size,
                               const float alpha_over_size, const float k, float* scale) {
  CUDA_KERNEL_LOOP(index, n) {
    const int p = index % pixels;
    const int offset = (index / pixels) * channels * pixels + p;
    const float* const x = in + offset;
    float* const s = scale + offset;
    const int pre_pad = (size - 1) / 2;
    float accum = k;
    for (int c = 0; c < size; ++c) {         // the first window: channels -pre_pad .. size - 1 - pre_pad
      const int head = c - pre_pad;
      if (head >= 0 && head < channels) {
        const float v = x[head * pixels];
        accum = accum + alpha_over_size * (v * v);
      }
    }
    s[0] = accum;
    for (int c = 1; c < channels; ++c) {
      const int head = c + pre_pad, tail = c - 1 - pre_pad;
      if (head < channels) {
        const float v = x[head * pixels];
        accum = accum + alpha_over_size * (v * v);
      }
      if (tail >= 0) {
        const float v = x[tail * pixels];
        accum = accum + (-alpha_over_size) * (v * v);
      }
      s[c * pixels] = accum;
    }
  }
}

// out = scale^-beta * in, element by element (LRNComputeOutput).
PCD_KERNEL void lrn_compute_output(const int n, const float* in, const float* scale, const float negative_beta,
                                   float* out) {
  CUDA_KERNEL_LOOP(index, n) { out[index] = powf(scale[index], negative_beta) * in[index]; }
}

// bottom_diff = top_diff * scale^-beta + neg_cache_ratio * (x * window sum of top_diff * top / scale), with
// neg_cache_ratio = -2 alpha beta / size; one thread per (image, pixel) as LRNComputeDiff, n = num * pixels.
// bottom_diff must not be top_diff (the window reads top_diff of channels already done), as on the CPU.
PCD_KERNEL void lrn_compute_diff(const int n, const float* bottom_data, const float* top_data, const float* scale,
                                 const float* top_diff, const int channels, const int pixels, const int size,
                                 const float negative_beta, const float neg_cache_ratio, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int p = index % pixels;
    const int offset = (index / pixels) * channels * pixels + p;
    const float* const x = bottom_data + offset;
    const float* const y = top_data + offset;
    const float* const s = scale + offset;
    const float* const dy = top_diff + offset;
    float* const dx = bottom_diff + offset;
    const int pre_pad = (size - 1) / 2;
    float accum = 0;
    for (int c = 0; c < size - 1; ++c) {     // padded channels 0 .. size - 2 hold x channels c - pre_pad
      const int head = c - pre_pad;
      if (head >= 0 && head < channels) {
        const int j = head * pixels;
        accum = accum + dy[j] * y[j] / s[j];
      }
    }
    for (int c = 0; c < channels; ++c) {
      const int head = c + pre_pad, tail = c - pre_pad, i = c * pixels;
      if (head < channels) {
        const int j = head * pixels;
        accum = accum + dy[j] * y[j] / s[j];
      }
      dx[i] = powf(s[i], negative_beta) * dy[i] + neg_cache_ratio * (accum * x[i]);
      if (tail >= 0) {
        const int j = tail * pixels;
        accum = accum - dy[j] * y[j] / s[j];
      }
    }
  }
}

// WITHIN_CHANNEL pooling: pooled = (sum of sq over the size x size window centred on each pixel, clipped to the
// plane) / size^2; sq is x^2 (or a diff, in the backward), planes of height x width.
PCD_KERNEL void lrn_within_pool(const int n, const float* sq, const int height, const int width, const int size,
                                const float divisor, float* pooled) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w = index % width;
    const int h = (index / width) % height;
    const float* const plane = sq + (index / width / height) * height * width;
    const int pad = (size - 1) / 2;
    const int h0 = max(h - pad, 0), h1 = min(h + pad + 1, height);
    const int w0 = max(w - pad, 0), w1 = min(w + pad + 1, width);
    float sum = 0;
    for (int hh = h0; hh < h1; ++hh) {
      for (int ww = w0; ww < w1; ++ww) {
        sum = sum + plane[hh * width + ww];
      }
    }
    pooled[index] = sum / divisor;
  }
}

// WITHIN_CHANNEL forward: power = (alpha * pooled + 1)^-beta (Caffe's Power layer with shift 1), top = x * power.
PCD_KERNEL void lrn_within_output(const int n, const float* in, const float* pooled, const float alpha,
                                  const float negative_beta, float* power, float* out) {
  CUDA_KERNEL_LOOP(index, n) {
    const float p = powf(alpha * pooled[index] + 1.0f, negative_beta);
    power[index] = p;
    out[index] = in[index] * p;
  }
}

// WITHIN_CHANNEL backward, first step: the Power layer's diff, (x * top_diff) * (power / (alpha * pooled + 1) *
// power_scale) with power_scale = -beta * alpha, already divided by size^2 for the pooling's backward.
PCD_KERNEL void lrn_within_power_diff(const int n, const float* in, const float* top_diff, const float* pooled,
                                      const float* power, const float alpha, const float power_scale,
                                      const float divisor, float* pooled_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const float d = (in[index] * top_diff[index])
        * (power[index] / (alpha * pooled[index] + 1.0f) * power_scale);
    pooled_diff[index] = d / divisor;
  }
}

// WITHIN_CHANNEL backward, last step: bottom_diff = power * top_diff + square_diff * (2 x) (the Split adds the
// product's own diff to the square's). bottom_diff may be top_diff.
PCD_KERNEL void lrn_within_diff(const int n, const float* in, const float* top_diff, const float* power,
                                const float* square_diff, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    bottom_diff[index] = power[index] * top_diff[index] + square_diff[index] * (2.0f * in[index]);
  }
}
