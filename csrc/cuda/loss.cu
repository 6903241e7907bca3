// SigmoidCrossEntropyLoss, Accuracy and ContrastiveLoss, after Caffe's src/caffe/layers/
// sigmoid_cross_entropy_loss_layer.cu (SigmoidCrossEntropyLossForwardGPU, SigmoidCrossEntropyLossIgnoreDiffGPU),
// accuracy_layer.cu (AccuracyForwardGPU, AccuracyForwardWithPerClassGPU) and contrastive_loss_layer.cu
// (CLLBackward). Per-position values go to arrays that the layer then reduces on the device (asum, or a GEMV against
// ones); only the scalars come to the host. Labels and targets are floats read as static_cast<int> where an integer
// is meant. (EuclideanLoss needs only math.cu's kernels.)
#include "common.cuh"

// term = x (t - (x >= 0)) - log(1 + exp(x - 2 x (x >= 0))), the overflow-free log-likelihood (the loss is minus
// the sum of the terms); 0 where the target is ignore_label. counts: 1 where the target counts, else 0.
PCD_KERNEL void sigmoid_ce_loss_forward(const int n, const float* input, const float* target,
                                        const int has_ignore_label, const int ignore_label, float* terms,
                                        float* counts) {
  CUDA_KERNEL_LOOP(i, n) {
    if (has_ignore_label && static_cast<int>(target[i]) == ignore_label) {
      terms[i] = 0;
      counts[i] = 0;
    } else {
      const float x = input[i];
      const float positive = x >= 0 ? 1.0f : 0.0f;
      terms[i] = x * (target[i] - positive) - logf(1.0f + expf(x - 2.0f * x * positive));
      counts[i] = 1;
    }
  }
}

// diff = (sigmoid(x) - t) * scale, sigmoid as Caffe's SigmoidLayer (0.5 tanh(0.5 x) + 0.5); 0 (times scale) where
// the target is ignore_label. scale = loss_weight / normalizer.
PCD_KERNEL void sigmoid_ce_loss_backward(const int n, const float* input, const float* target,
                                         const int has_ignore_label, const int ignore_label, const float scale,
                                         float* diff) {
  CUDA_KERNEL_LOOP(i, n) {
    // Caffe's sigmoid: 0.5 * tanh(0.5 * x) + 0.5 in double (its literals), rounded once to float
    float d = static_cast<float>(0.5 * tanh(0.5 * static_cast<double>(input[i])) + 0.5) - target[i];
    if (has_ignore_label && static_cast<int>(target[i]) == ignore_label) d = 0;
    diff[i] = d * scale;
  }
}

// Per label position (o, i), n = outer * inner: correct = 1 when fewer than top_k classes other than the true one
// score >= the true class (ties count against it, NaN compares false), counts = 1 where the position counts (its
// label is not ignore_label). A label outside [0, num_labels) reads nothing and sets bad = 1 (the host refuses it).
PCD_KERNEL void accuracy_forward(const int n, const float* scores, const float* label, const int num_labels,
                                 const int inner, const int top_k, const int has_ignore_label,
                                 const int ignore_label, float* correct, float* counts, float* bad) {
  CUDA_KERNEL_LOOP(index, n) {
    const int o = index / inner, i = index % inner;
    const int label_value = static_cast<int>(label[index]);
    correct[index] = 0;
    counts[index] = 0;
    bad[index] = 0;
    if (has_ignore_label && label_value == ignore_label) continue;
    if (label_value < 0 || label_value >= num_labels) {
      bad[index] = 1;
      continue;
    }
    const float* const s = scores + o * num_labels * inner + i;
    const float true_score = s[label_value * inner];
    int better = -1;   // the true class counts itself
    for (int k = 0; k < num_labels && better < top_k; ++k) better += s[k * inner] >= true_score;
    correct[index] = better < top_k ? 1.0f : 0.0f;
    counts[index] = 1;
  }
}

// Per-class tallies as AccuracyForwardWithPerClassGPU lays them out: for class l and position p (index =
// l * positions + p, n = num_labels * positions), hits = correct and seen = 1 where p counts and has label l, else
// 0. Row sums (a GEMV with ones) then give each class's hits and positions.
PCD_KERNEL void accuracy_per_class(const int n, const float* label, const float* correct, const float* counts,
                                   const int positions, float* hits, float* seen) {
  CUDA_KERNEL_LOOP(index, n) {
    const int l = index / positions, p = index % positions;
    const int mine = counts[p] > 0 && static_cast<int>(label[p]) == l;
    hits[index] = mine ? correct[p] : 0.0f;
    seen[index] = mine ? 1.0f : 0.0f;
  }
}

// --- ContrastiveLoss ----------------------------------------------------------------------------------------------

// Per pair p (n = num): dist_sq = the sum over the channels of diff^2 (diff = a - b, from gpu_sub), which
// contrastive_loss_layer.cu gets from powx and a GEMV with ones; one thread sums its pair's row in order. terms:
// the pair's share of the loss, dist_sq for a similar pair (static_cast<int>(y) != 0), else max(margin - dist, 0)^2
// or, legacy_version, max(margin - dist_sq, 0) (Caffe adds these up on the host; the layer sums terms on the device).
PCD_KERNEL void contrastive_loss_forward(const int n, const int channels, const float* diff, const float* y,
                                         const float margin, const int legacy_version, float* dist_sq,
                                         float* terms) {
  CUDA_KERNEL_LOOP(p, n) {
    const float* d = diff + p * channels;
    float sum = 0;
    for (int c = 0; c < channels; ++c) sum += d[c] * d[c];
    dist_sq[p] = sum;
    if (static_cast<int>(y[p])) {
      terms[p] = sum;
    } else if (legacy_version) {
      const float m = margin - sum;
      terms[p] = m > 0 ? m : 0.0f;
    } else {
      const float m = margin - sqrtf(sum);
      terms[p] = m > 0 ? m * m : 0.0f;
    }
  }
}

// d(loss)/d(a) (alpha = loss_weight / num) or d/d(b) (alpha = -loss_weight / num), one thread per value (n = count):
// alpha * diff for a similar pair; for a dissimilar pair within the margin -alpha * diff (legacy_version) or
// -alpha * (margin - dist) / (dist + 1e-4) * diff, else 0. CLLBackward writes -alpha without the factor diff in the
// legacy case, unlike contrastive_loss_layer.cpp and the loss's derivative; we follow the CPU code.
PCD_KERNEL void contrastive_loss_backward(const int n, const int channels, const float margin,
                                          const int legacy_version, const float alpha, const float* y,
                                          const float* diff, const float* dist_sq, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int p = i / channels;
    if (static_cast<int>(y[p])) {
      dx[i] = alpha * diff[i];
    } else if (legacy_version) {
      dx[i] = margin - dist_sq[p] > 0 ? -alpha * diff[i] : 0.0f;
    } else {
      const float dist = sqrtf(dist_sq[p]);
      const float mdist = margin - dist;
      dx[i] = mdist > 0 ? -alpha * mdist / (dist + 1e-4f) * diff[i] : 0.0f;
    }
  }
}
