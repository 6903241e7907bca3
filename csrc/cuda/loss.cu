// SigmoidCrossEntropyLoss and Accuracy, after Caffe's src/caffe/layers/sigmoid_cross_entropy_loss_layer.cu
// (SigmoidCrossEntropyLossForwardGPU, SigmoidCrossEntropyLossIgnoreDiffGPU) and accuracy_layer.cu
// (AccuracyForwardGPU, AccuracyForwardWithPerClassGPU). Per-position values go to arrays that the layer then
// reduces on the device (asum, or a GEMV against ones); only the scalars come to the host. Labels and targets are
// floats read as static_cast<int> where an integer is meant. (EuclideanLoss needs only math.cu's kernels.)
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
