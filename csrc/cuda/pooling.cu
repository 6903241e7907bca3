// 2-D pooling on the GPU, after Caffe's src/caffe/layers/pooling_layer.cu (MaxPoolForward, AvePoolForward,
// StoPoolForwardTrain, StoPoolForwardTest, MaxPoolBackward, AvePoolBackward), for (planes, height, width) inputs
// and (planes, pooled_h, pooled_w) outputs, planes = num * channels. Forward: one thread per output; backward:
// one thread per input element gathering from the windows that cover it (no atomics), as Caffe's.
//
// The rules are those of the CPU kernels (csrc/pooling.pyx), which are Caffe's: windows start at
// p * stride - pad, are clipped to the image for reading, and AVE divides by the window clipped to the padded
// image only; MAX starts from -FLT_MAX and keeps the first strict maximum in row-major order (mask -1: none);
// STOCHASTIC has no padding. Each input diff takes its terms window after window in row-major order, as the CPU
// kernels add them, and `accumulate` adds to the input diff already there (the SPP levels) instead of
// overwriting it. Window positions (masks) are int32 offsets h * width + w within the plane.
#include <cfloat>

#include "common.cuh"

PCD_KERNEL void pool_max_forward(const int n, const float* bottom, const int height, const int width,
                                 const int pooled_h, const int pooled_w, const int kernel_h, const int kernel_w,
                                 const int stride_h, const int stride_w, const int pad_h, const int pad_w,
                                 float* top, int* mask) {
  CUDA_KERNEL_LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int plane = index / pooled_w / pooled_h;
    int hstart = ph * stride_h - pad_h;
    int wstart = pw * stride_w - pad_w;
    const int hend = min(hstart + kernel_h, height);
    const int wend = min(wstart + kernel_w, width);
    hstart = max(hstart, 0);
    wstart = max(wstart, 0);
    float best = -FLT_MAX;
    int arg = -1;
    const float* x = bottom + (long long)plane * height * width;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        if (x[h * width + w] > best) {
          arg = h * width + w;
          best = x[arg];
        }
      }
    }
    top[index] = best;
    mask[index] = arg;
  }
}

// Caffe's mask top: the positions as floats.
PCD_KERNEL void pool_mask_to_float(const int n, const int* mask, float* top_mask) {
  CUDA_KERNEL_LOOP(index, n) { top_mask[index] = (float)mask[index]; }
}

PCD_KERNEL void pool_ave_forward(const int n, const float* bottom, const int height, const int width,
                                 const int pooled_h, const int pooled_w, const int kernel_h, const int kernel_w,
                                 const int stride_h, const int stride_w, const int pad_h, const int pad_w,
                                 float* top) {
  CUDA_KERNEL_LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int plane = index / pooled_w / pooled_h;
    int hstart = ph * stride_h - pad_h;
    int wstart = pw * stride_w - pad_w;
    int hend = min(hstart + kernel_h, height + pad_h);
    int wend = min(wstart + kernel_w, width + pad_w);
    const int pool_size = (hend - hstart) * (wend - wstart);
    hstart = max(hstart, 0);
    wstart = max(wstart, 0);
    hend = min(hend, height);
    wend = min(wend, width);
    float total = 0;
    const float* x = bottom + (long long)plane * height * width;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        total += x[h * width + w];
      }
    }
    top[index] = total / pool_size;
  }
}

// TRAIN: the first position whose running sum reaches uniform * (window sum); `uniform` holds one draw in [0, 1]
// per output, made on the host (Caffe draws them with curand; we take our CPU path's draws, so that both agree).
// None reaches it only with negative inputs or an empty window: output 0, mask -1, as the CPU kernel.
PCD_KERNEL void pool_stochastic_forward_train(const int n, const float* bottom, const float* uniform,
                                              const int height, const int width, const int pooled_h,
                                              const int pooled_w, const int kernel_h, const int kernel_w,
                                              const int stride_h, const int stride_w, float* top, int* mask) {
  CUDA_KERNEL_LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int plane = index / pooled_w / pooled_h;
    const int hstart = ph * stride_h;
    const int hend = min(hstart + kernel_h, height);
    const int wstart = pw * stride_w;
    const int wend = min(wstart + kernel_w, width);
    const float* x = bottom + (long long)plane * height * width;
    float total = 0;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        total += x[h * width + w];
      }
    }
    const float threshold = uniform[index] * total;
    float value = 0;
    int arg = -1;
    total = 0;
    for (int h = hstart; h < hend && arg < 0; ++h) {
      for (int w = wstart; w < wend; ++w) {
        total += x[h * width + w];
        if (total >= threshold) {
          arg = h * width + w;
          value = x[arg];
          break;
        }
      }
    }
    top[index] = value;
    mask[index] = arg;
  }
}

// The window's sum(x^2) / sum(x), the sum starting at FLT_MIN (an all-zero window gives 0), as StoPoolForwardTest.
PCD_DEVICE void pool_stochastic_window(const float* x, const int width, const int hstart, const int hend,
                                       const int wstart, const int wend, float* total, float* squares) {
  float t = FLT_MIN, s = 0;
  for (int h = hstart; h < hend; ++h) {
    for (int w = wstart; w < wend; ++w) {
      const float v = x[h * width + w];
      t += v;
      s += v * v;
    }
  }
  *total = t;
  *squares = s;
}

PCD_KERNEL void pool_stochastic_forward_test(const int n, const float* bottom, const int height, const int width,
                                             const int pooled_h, const int pooled_w, const int kernel_h,
                                             const int kernel_w, const int stride_h, const int stride_w,
                                             float* top) {
  CUDA_KERNEL_LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int plane = index / pooled_w / pooled_h;
    const int hstart = ph * stride_h;
    const int wstart = pw * stride_w;
    float total, squares;
    pool_stochastic_window(bottom + (long long)plane * height * width, width, hstart, min(hstart + kernel_h, height),
                           wstart, min(wstart + kernel_w, width), &total, &squares);
    top[index] = squares / total;
  }
}

// --- backward: one thread per input element ---------------------------------------------------------------------

// The windows (padded coordinates h, w = position + pad) that cover an input element: [phstart, phend) x
// [pwstart, pwend), as Caffe's MaxPoolBackward / AvePoolBackward compute them.
PCD_DEVICE int pool_first_window(const int h, const int kernel, const int stride) {
  return (h < kernel) ? 0 : (h - kernel) / stride + 1;
}

PCD_DEVICE int pool_end_window(const int h, const int stride, const int pooled) {
  return min(h / stride + 1, pooled);
}

// The sum of the output diffs of the windows whose mask names this element: the backward of MAX (an int mask of
// our own, or Caffe's mask top as floats, read with static_cast<int> as Caffe does) and of STOCHASTIC TRAIN,
// added to `gradient` (0, or what SPP's other levels left in the bottom diff) in window order.
template <typename Mask>
PCD_DEVICE float pool_masked_gradient(float gradient, const int index, const float* top_diff, const Mask* mask,
                                      const int height, const int width, const int pooled_h, const int pooled_w, const int kernel_h,
                                      const int kernel_w, const int stride_h, const int stride_w, const int pad_h,
                                      const int pad_w) {
  const int w = index % width;
  const int h = (index / width) % height;
  const int plane = index / width / height;
  const int phstart = pool_first_window(h + pad_h, kernel_h, stride_h);
  const int phend = pool_end_window(h + pad_h, stride_h, pooled_h);
  const int pwstart = pool_first_window(w + pad_w, kernel_w, stride_w);
  const int pwend = pool_end_window(w + pad_w, stride_w, pooled_w);
  const long long offset = (long long)plane * pooled_h * pooled_w;
  const float* dy = top_diff + offset;
  const Mask* m = mask + offset;
  for (int ph = phstart; ph < phend; ++ph) {
    for (int pw = pwstart; pw < pwend; ++pw) {
      if (static_cast<int>(m[ph * pooled_w + pw]) == h * width + w) {
        gradient += dy[ph * pooled_w + pw];
      }
    }
  }
  return gradient;
}

PCD_KERNEL void pool_mask_backward(const int n, const float* top_diff, const int* mask, const int height,
                                   const int width, const int pooled_h, const int pooled_w, const int kernel_h,
                                   const int kernel_w, const int stride_h, const int stride_w, const int pad_h,
                                   const int pad_w, const int accumulate, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    bottom_diff[index] = pool_masked_gradient(accumulate ? bottom_diff[index] : 0.0f, index, top_diff, mask, height,
                                              width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w,
                                              pad_h, pad_w);
  }
}

PCD_KERNEL void pool_top_mask_backward(const int n, const float* top_diff, const float* top_mask, const int height,
                                       const int width, const int pooled_h, const int pooled_w, const int kernel_h,
                                       const int kernel_w, const int stride_h, const int stride_w, const int pad_h,
                                       const int pad_w, const int accumulate, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    bottom_diff[index] = pool_masked_gradient(accumulate ? bottom_diff[index] : 0.0f, index, top_diff, top_mask,
                                              height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h,
                                              stride_w, pad_h, pad_w);
  }
}

PCD_KERNEL void pool_ave_backward(const int n, const float* top_diff, const int height, const int width,
                                  const int pooled_h, const int pooled_w, const int kernel_h, const int kernel_w,
                                  const int stride_h, const int stride_w, const int pad_h, const int pad_w,
                                  const int accumulate, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w = index % width + pad_w;
    const int h = (index / width) % height + pad_h;
    const int plane = index / width / height;
    const int phstart = pool_first_window(h, kernel_h, stride_h);
    const int phend = pool_end_window(h, stride_h, pooled_h);
    const int pwstart = pool_first_window(w, kernel_w, stride_w);
    const int pwend = pool_end_window(w, stride_w, pooled_w);
    const float* dy = top_diff + (long long)plane * pooled_h * pooled_w;
    float gradient = accumulate ? bottom_diff[index] : 0.0f;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const int hstart = ph * stride_h - pad_h;
        const int wstart = pw * stride_w - pad_w;
        const int hend = min(hstart + kernel_h, height + pad_h);
        const int wend = min(wstart + kernel_w, width + pad_w);
        const int pool_size = (hend - hstart) * (wend - wstart);
        gradient += dy[ph * pooled_w + pw] / pool_size;
      }
    }
    bottom_diff[index] = gradient;
  }
}

// STOCHASTIC TEST: the exact gradient of sum(x^2) / sum(x), (2 x_i - out) * dy / sum(x) from each covering
// window (the CPU kernel's rule; Caffe's GPU backward reuses stale TRAIN draws instead).
PCD_KERNEL void pool_stochastic_test_backward(const int n, const float* bottom, const float* top_diff,
                                              const int height, const int width, const int pooled_h,
                                              const int pooled_w, const int kernel_h, const int kernel_w,
                                              const int stride_h, const int stride_w, const int accumulate,
                                              float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int plane = index / width / height;
    const int phstart = pool_first_window(h, kernel_h, stride_h);
    const int phend = pool_end_window(h, stride_h, pooled_h);
    const int pwstart = pool_first_window(w, kernel_w, stride_w);
    const int pwend = pool_end_window(w, stride_w, pooled_w);
    const float* x = bottom + (long long)plane * height * width;
    const float* dy = top_diff + (long long)plane * pooled_h * pooled_w;
    float gradient = accumulate ? bottom_diff[index] : 0.0f;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const int hstart = ph * stride_h;
        const int wstart = pw * stride_w;
        float total, squares;
        pool_stochastic_window(x, width, hstart, min(hstart + kernel_h, height), wstart,
                               min(wstart + kernel_w, width), &total, &squares);
        const float out = squares / total;
        const float scale = dy[ph * pooled_w + pw] / total;
        gradient += scale * (2 * x[h * width + w] - out);
      }
    }
    bottom_diff[index] = gradient;
  }
}
