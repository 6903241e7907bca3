// Softmax over one axis of an (outer, channels, inner) array, after Caffe's src/caffe/layers/softmax_layer.cu
// (kernel_channel_max, kernel_channel_subtract, kernel_exp, kernel_channel_sum, kernel_channel_div,
// kernel_channel_dot), and the per-position loss of SoftmaxWithLoss after softmax_loss_layer.cu
// (SoftmaxLossForwardGPU, SoftmaxLossBackwardGPU). Sums run over the channels in order, as the CPU kernels
// (csrc/softmax.pyx) do. Labels are floats read as static_cast<int>.
#include "common.cuh"

#define SOFTMAX_FLT_MIN 1.175494351e-38f   // FLT_MIN, which softmax_loss_layer.cu clamps the probability at

// A position's loss for the probability of its label: -log(max(p, FLT_MIN)), as softmax_loss_layer.cu.
PCD_DEVICE float softmax_label_loss(const float p) { return -logf(max(p, SOFTMAX_FLT_MIN)); }

// The loss's normalizer: `fixed` where it does not depend on the labels (> 0), else max(1, the valid count), Caffe's
// get_normalizer for VALID with an ignore_label (the host path's int(round(asum(counts)))).
PCD_DEVICE float softmax_loss_normalizer(const float fixed, const float valid_count) {
  return fixed > 0.0f ? fixed : fmaxf(1.0f, rintf(valid_count));
}

// out[o, i] = max over c of data[o, c, i]; n = outer * inner.
PCD_KERNEL void softmax_channel_max(const int n, const int channels, const int inner, const float* data,
                                    float* out) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner, i = index % inner;
    const float* const x = data + o * channels * inner + i;
    float top = x[0];
    for (int c = 1; c < channels; ++c) {
      if (top < x[c * inner]) top = x[c * inner];   // std::max(top, x), as the CPU kernel (NaN handling included)
    }
    out[index] = top;
  }
}

// data[o, c, i] -= value[o, i]; n = outer * channels * inner.
PCD_KERNEL void softmax_channel_subtract(const int n, const int channels, const int inner, const float* value,
                                         float* data) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / channels / inner, i = index % inner;
    data[index] = data[index] - value[o * inner + i];
  }
}

PCD_KERNEL void softmax_exp(const int n, const float* in, float* out) {
  CUDA_KERNEL_LOOP(index, n) { out[index] = expf(in[index]); }
}

// out[o, i] = sum over c of data[o, c, i], in channel order.
PCD_KERNEL void softmax_channel_sum(const int n, const int channels, const int inner, const float* data,
                                    float* out) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner, i = index % inner;
    const float* const x = data + o * channels * inner + i;
    float sum = 0;
    for (int c = 0; c < channels; ++c) sum += x[c * inner];
    out[index] = sum;
  }
}

// data[o, c, i] /= value[o, i].
PCD_KERNEL void softmax_channel_div(const int n, const int channels, const int inner, const float* value,
                                    float* data) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / channels / inner, i = index % inner;
    data[index] = data[index] / value[o * inner + i];
  }
}

// The five kernels above as one, a thread per position (o, i) looping over its channels: the same operations in
// the same order (the max, x - max, its exp, the sum in channel order, the quotient), so the same bits, in one
// launch instead of five. For few channels (layers/gpu_helpers.py): a position's loops are the work of one thread.
// y may be x. n = outer * inner.
PCD_KERNEL void softmax_positions(const int n, const int channels, const int inner, const float* x, float* y) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner, i = index % inner;
    const float* const in = x + o * channels * inner + i;
    float* const out = y + o * channels * inner + i;
    float top = in[0];
    for (int c = 1; c < channels; ++c) {
      if (top < in[c * inner]) top = in[c * inner];
    }
    float sum = 0;
    for (int c = 0; c < channels; ++c) {
      const float e = expf(in[c * inner] - top);
      out[c * inner] = e;
      sum += e;
    }
    for (int c = 0; c < channels; ++c) out[c * inner] = out[c * inner] / sum;
  }
}

// out[o, i] = sum over c of a[o, c, i] * b[o, c, i], in channel order.
PCD_KERNEL void softmax_channel_dot(const int n, const int channels, const int inner, const float* a,
                                    const float* b, float* out) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner, i = index % inner;
    const int base = o * channels * inner + i;
    float dot = 0;
    for (int c = 0; c < channels; ++c) dot += a[base + c * inner] * b[base + c * inner];
    out[index] = dot;
  }
}

// Softmax backward's last step, fused: dx = (dy - dot[o, i]) * y (kernel_channel_subtract, then caffe_gpu_mul).
// dx may be dy.
PCD_KERNEL void softmax_backward_diff(const int n, const int channels, const int inner, const float* dot,
                                      const float* top_data, const float* top_diff, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / channels / inner, i = index % inner;
    bottom_diff[index] = (top_diff[index] - dot[o * inner + i]) * top_data[index];
  }
}

// Per position (o, i) of the labels: loss = -log(max(prob[label], FLT_MIN)) and count = 1, or 0 and 0 where the
// label is ignore_label (has_ignore_label != 0). A label outside [0, channels) reads nothing: its position gets
// loss 0, count 0 and bad = 1, so that the host can report it as the CPU path does. n = outer * inner.
PCD_KERNEL void softmax_loss_forward(const int n, const float* prob, const float* label, const int channels,
                                     const int inner, const int has_ignore_label, const int ignore_label,
                                     float* loss, float* counts, float* bad) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner, i = index % inner;
    const int label_value = static_cast<int>(label[index]);
    loss[index] = 0;
    counts[index] = 0;
    bad[index] = 0;
    if (has_ignore_label && label_value == ignore_label) continue;
    if (label_value < 0 || label_value >= channels) {
      bad[index] = 1;
      continue;
    }
    loss[index] = softmax_label_loss(prob[(o * channels + label_value) * inner + i]);
    counts[index] = 1;
  }
}

// bottom_diff holds the probabilities; subtract 1 at the label, or zero every channel of an ignored position;
// counts as in the forward (labels out of range were refused by the forward and are skipped).
PCD_KERNEL void softmax_loss_backward(const int n, const float* label, const int channels, const int inner,
                                      const int has_ignore_label, const int ignore_label, float* bottom_diff,
                                      float* counts) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner, i = index % inner;
    const int label_value = static_cast<int>(label[index]);
    float* const diff = bottom_diff + o * channels * inner + i;
    if (has_ignore_label && label_value == ignore_label) {
      for (int c = 0; c < channels; ++c) diff[c * inner] = 0;
      counts[index] = 0;
    } else {
      if (label_value >= 0 && label_value < channels) diff[label_value * inner] -= 1;
      counts[index] = 1;
    }
  }
}

// The forward's loss over few positions in one launch of one thread (layers/loss.py), which walks the positions in
// order, as Caffe's Forward_cpu sums them, and writes what softmax_loss_forward, channel_sums and softmax_loss_total
// write together: sums_a = [the valid count, the bad labels], sums_ab = [the sum of the losses, 0], the normalizer
// and top. loss + (-log p) is Forward_cpu's loss - log p, the same bits. A lone thread waits for each load (a few
// hundred cycles from L2), and a position's probability is read at its label: the loop has no early exits and
// reads channel 0 where the label is not valid, so that the compiler can issue several positions' loads at once
// (unrolled by 4). n = 1.
PCD_KERNEL void softmax_loss_sequential(const int n, const int positions, const float* prob, const float* label,
                                        const int channels, const int inner, const int has_ignore_label,
                                        const int ignore_label, const float fixed, float* sums_a, float* sums_ab,
                                        float* normalizer, float* top) {
  CUDA_KERNEL_LOOP(index, n) {
    float loss = 0, count = 0, bad = 0;
#ifdef __CUDACC__
#pragma unroll 4
#endif
    for (int p = 0; p < positions; ++p) {
      const int o = p / inner, i = p % inner;
      const int label_value = static_cast<int>(label[p]);
      const bool ignored = has_ignore_label && label_value == ignore_label;
      const bool out_of_range = !ignored && (label_value < 0 || label_value >= channels);
      const bool valid = !ignored && !out_of_range;
      const float q = prob[(o * channels + (valid ? label_value : 0)) * inner + i];
      if (valid) {
        loss += softmax_label_loss(q);
        count += 1;
      }
      if (out_of_range) bad += 1;
    }
    sums_a[0] = count;
    sums_a[1] = bad;
    sums_ab[0] = loss;
    sums_ab[1] = 0;
    const float d = softmax_loss_normalizer(fixed, count);
    normalizer[0] = d;
    top[0] = loss / d;
  }
}

// The backward's three calls as one where the normalizer is fixed (known on the host): copy the probabilities,
// subtract 1 at the label (zero an ignored position's channels), multiply by scale = loss weight / normalizer (the
// cuBLAS scal): the same operations in the same order. bottom_diff may not be prob. n = outer * inner.
PCD_KERNEL void softmax_loss_backward_scaled(const int n, const float* prob, const float* label, const int channels,
                                             const int inner, const int has_ignore_label, const int ignore_label,
                                             const float scale, float* bottom_diff) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner, i = index % inner;
    const int label_value = static_cast<int>(label[index]);
    const float* const p = prob + o * channels * inner + i;
    float* const diff = bottom_diff + o * channels * inner + i;
    const bool ignored = has_ignore_label && label_value == ignore_label;
    for (int c = 0; c < channels; ++c) {
      const float v = ignored ? 0.0f : (c == label_value ? p[c * inner] - 1.0f : p[c * inner]);
      diff[c * inner] = v * scale;
    }
  }
}

// SoftmaxWithLoss's loss on the device, so that the host need not wait for it in mid-pass. sums_a holds the valid
// count (the sum of counts) and the number of bad labels, sums_ab[0] the sum of the losses (channel_sums over
// [counts | bad] and [loss | 0]). normalizer[0] = fixed where fixed > 0, else max(1, the valid count): Caffe's
// get_normalizer for VALID with an ignore_label, as the host path's int(round(asum(counts))). top[0] = the sum /
// normalizer, both float32 as the host path's division. n = 1.
PCD_KERNEL void softmax_loss_total(const int n, const float* sums_a, const float* sums_ab, const float fixed,
                                   float* normalizer, float* top) {
  CUDA_KERNEL_LOOP(index, n) {
    const float d = softmax_loss_normalizer(fixed, sums_a[0]);
    normalizer[0] = d;
    top[0] = sums_ab[0] / d;
  }
}
