// The update rules of Caffe's src/caffe/solvers/*_solver.cu, one kernel each, in place: g (the gradient) becomes
// the step that Net::Update subtracts, h (and h2) are the rule's history. The operations are in the order of our
// CPU rules (pycaffe_dist/solver/updates.py, which follow Caffe's CPU code), so that a GPU and a CPU run agree up
// to the fused multiply-adds nvcc makes; Caffe's own GPU kernels group a few products differently.
#include "common.cuh"

PCD_KERNEL void sgd_update(const int n, float* g, float* h, const float momentum, const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    const float hi = momentum * h[i] + local_rate * g[i];
    g[i] = h[i] = hi;
  }
}

PCD_KERNEL void nesterov_update(const int n, float* g, float* h, const float momentum, const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    const float hi = h[i];
    const float hi_new = h[i] = momentum * hi + local_rate * g[i];
    g[i] = -momentum * hi + (1.0f + momentum) * hi_new;
  }
}

PCD_KERNEL void adagrad_update(const int n, float* g, float* h, const float delta, const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    const float gi = g[i];
    const float hi = h[i] = h[i] + gi * gi;
    g[i] = gi / (sqrt(hi) + delta) * local_rate;
  }
}

PCD_KERNEL void rmsprop_update(const int n, float* g, float* h, const float rms_decay, const float delta,
                               const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    const float gi = g[i];
    const float hi = h[i] = rms_decay * h[i] + (1.0f - rms_decay) * (gi * gi);
    g[i] = gi / (sqrt(hi) + delta) * local_rate;
  }
}

PCD_KERNEL void adadelta_update(const int n, float* g, float* h, float* h2, const float momentum, const float delta,
                                const float local_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    float gi = g[i];
    const float hi = h[i] = momentum * h[i] + (1.0f - momentum) * (gi * gi);
    gi = gi * sqrt((h2[i] + delta) / (hi + delta));
    h2[i] = momentum * h2[i] + (1.0f - momentum) * (gi * gi);
    g[i] = gi * local_rate;
  }
}

// corrected_rate = local_rate * sqrt(1 - beta2^t) / (1 - beta1^t), rounded to float on the host as Caffe does.
PCD_KERNEL void adam_update(const int n, float* g, float* m, float* v, const float beta1, const float beta2,
                            const float delta, const float corrected_rate) {
  CUDA_KERNEL_LOOP(i, n) {
    const float gi = g[i];
    const float mi = m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = v[i] = beta2 * v[i] + (1.0f - beta2) * (gi * gi);
    g[i] = mi / (sqrt(vi) + delta) * corrected_rate;
  }
}

// L1 weight decay: diff += decay * sign(w) (Caffe: caffe_gpu_sign into a temporary, then caffe_gpu_axpy).
PCD_KERNEL void l1_regularize(const int n, const float decay, const float* w, float* diff) {
  CUDA_KERNEL_LOOP(i, n) { diff[i] += decay * (float)((0.0f < w[i]) - (w[i] < 0.0f)); }
}

// --- Many parameters in one launch (solver/updates_gpu.py's ParameterTable) ----------------------------------------
// Caffe's ApplyUpdate launches a regularize, an update and a Net::Update call per parameter: for ResNet-50 963
// launches, each too small to keep the GPU busy while the host issues the next. Here one launch covers them all:
// thread `index` works on element chunk_start[c] + index % chunk of parameter p = chunk_param[c], c = index / chunk
// (a parameter's elements are split into chunks, so no chunk spans two); addresses[3 p .. 3 p + 2] are the
// parameter's diff, history and data, sizes[p] its count. The arithmetic is the per-parameter path's: Regularize
// (L2, caffe_gpu_axpy: a fused multiply-add, skipped where the decay is 0), sgd_update's, and Net::Update's axpy.

PCD_DEVICE bool many_element(const int index, const int chunk, const int* chunk_param, const int* chunk_start,
                             const int* sizes, int& p, int& i) {
  const int c = index / chunk;
  p = chunk_param[c];
  i = chunk_start[c] + index % chunk;
  return i < sizes[p];
}

PCD_DEVICE float* many_array(const long long* addresses, const int p, const int which) {
  return reinterpret_cast<float*>(addresses[3 * p + which]);
}

// SGD with L2 weight decay: g += decays[p] w; h = momentum h + (rate lr_mults[p]) g; g = h.
PCD_KERNEL void sgd_update_many(const int n, const int chunk, const int* chunk_param, const int* chunk_start,
                                const long long* addresses, const int* sizes, const float* lr_mults,
                                const float* decays, const float momentum, const float rate) {
  CUDA_KERNEL_LOOP(index, n) {
    int p, i;
    if (!many_element(index, chunk, chunk_param, chunk_start, sizes, p, i)) continue;
    float* const g = many_array(addresses, p, 0);
    float* const h = many_array(addresses, p, 1);
    const float decay = decays[p];
    float gi = g[i];
    if (decay != 0.0f) gi = fmaf(decay, many_array(addresses, p, 2)[i], gi);
    const float local_rate = rate * lr_mults[p];
    const float hi = momentum * h[i] + local_rate * gi;
    g[i] = h[i] = hi;
  }
}

// Net::Update: w -= step (the diff), as axpy(-1, diff, data).
PCD_KERNEL void apply_update_many(const int n, const int chunk, const int* chunk_param, const int* chunk_start,
                                  const long long* addresses, const int* sizes) {
  CUDA_KERNEL_LOOP(index, n) {
    int p, i;
    if (!many_element(index, chunk, chunk_param, chunk_start, sizes, p, i)) continue;
    float* const w = many_array(addresses, p, 2);
    w[i] = w[i] - many_array(addresses, p, 0)[i];
  }
}
