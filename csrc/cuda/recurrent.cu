// LSTMUnit (pycaffe_dist/layers/recurrent.py), after Caffe's src/caffe/layers/lstm_unit_layer.cu. Caffe's kernels
// keep the gate activations (X_acts) between its forward and backward passes; these recompute them from the gate
// input instead, one thread per hidden unit of one stream, so no buffer has to outlive the forward pass.
// Gate input x of one stream holds 4 * dim pre-activations in the order i, f, o, g. The forget gate is
// cont * sigmoid(f) (0 where cont is 0), as lstm_unit_layer.cpp and our CPU code compute it also for its
// derivative; Caffe's GPU kernels scale sigmoid(f)'s derivative by cont instead, which agrees where cont is 0 or 1.
// Activations use expf and tanhf as the CPU code's float32 numpy (Caffe's GPU tanh is 2 sigmoid(2 x) - 1).
#include "common.cuh"

PCD_DEVICE float lstm_sigmoid(const float x) { return 1.0f / (1.0f + expf(-x)); }

// c = f * c_prev + i * g and h = o * tanh(c) for unit d of stream b (index = b * dim + d, n = num * dim).
PCD_KERNEL void lstm_unit_forward(const int n, const int dim, const float* c_prev, const float* x, const float* cont,
                                  float* c, float* h) {
  CUDA_KERNEL_LOOP(index, n) {
    const int b = index / dim, d = index % dim;
    const float* gates = x + 4 * b * dim;
    const float i = lstm_sigmoid(gates[d]);
    const float f = cont[b] == 0 ? 0.0f : cont[b] * lstm_sigmoid(gates[dim + d]);
    const float o = lstm_sigmoid(gates[2 * dim + d]);
    const float g = tanhf(gates[3 * dim + d]);
    const float c_value = f * c_prev[index] + i * g;
    c[index] = c_value;
    h[index] = o * tanhf(c_value);
  }
}

// The gradients of unit d of stream b from dc and dh (the tops' diffs), with c the forward's top:
// dc_prev = c_term * f where c_term = dc + dh * o * (1 - tanh(c)^2), and the four gate inputs' diffs. Each thread
// writes its own values only; want_c_prev / want_x say which bottoms are written (propagate_down).
PCD_KERNEL void lstm_unit_backward(const int n, const int dim, const float* c_prev, const float* x,
                                   const float* cont, const float* c, const float* dc, const float* dh,
                                   const int want_c_prev, const int want_x, float* dc_prev, float* dx) {
  CUDA_KERNEL_LOOP(index, n) {
    const int b = index / dim, d = index % dim;
    const float* gates = x + 4 * b * dim;
    const float i = lstm_sigmoid(gates[d]);
    const float f = cont[b] == 0 ? 0.0f : cont[b] * lstm_sigmoid(gates[dim + d]);
    const float o = lstm_sigmoid(gates[2 * dim + d]);
    const float g = tanhf(gates[3 * dim + d]);
    const float tanh_c = tanhf(c[index]);
    const float c_term = dc[index] + dh[index] * o * (1.0f - tanh_c * tanh_c);
    if (want_c_prev) dc_prev[index] = c_term * f;
    if (want_x) {
      float* gates_diff = dx + 4 * b * dim;
      gates_diff[d] = c_term * g * i * (1.0f - i);
      gates_diff[dim + d] = c_term * c_prev[index] * f * (1.0f - f);
      gates_diff[2 * dim + d] = dh[index] * tanh_c * o * (1.0f - o);
      gates_diff[3 * dim + d] = c_term * i * (1.0f - g * g);
    }
  }
}
