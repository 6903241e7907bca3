// Kernels of the neuron layers (pycaffe_dist/layers/activation.py), one thread per element as in Caffe's
// src/caffe/layers/*_layer.cu. Each kernel computes what the layer's CPU code computes (pycaffe_dist/backend/
// neuron.py and csrc/neuron.pyx), in the same operation order: Sigmoid and Swish as 1 / (1 + e^-x) (Caffe's
// kernels write 0.5 * tanh(0.5 * x) + 0.5), ELU and ReLU as max(x, 0) + a * (...) of min(x, 0), BNLL's log1p from
// its log, Power / Exp / Log skipping the steps that change nothing. Each thread reads element i of its inputs
// before it writes element i of its output, so an output may be an input (in-place layers, shared diffs).
#include "common.cuh"

// std::max(v, 0) and std::min(v, 0) with std's comparisons (a NaN passes through), as csrc/neuron.pyx.
PCD_DEVICE float neuron_max0(const float v) { return v < 0.0f ? 0.0f : v; }
PCD_DEVICE float neuron_min0(const float v) { return 0.0f < v ? 0.0f : v; }
PCD_DEVICE float neuron_sigmoid(const float v) { return 1.0f / (1.0f + expf(-v)); }

// --- ReLU, PReLU, ELU ---------------------------------------------------------------------------------------------

PCD_KERNEL void relu_forward(const int n, const float* x, const float negative_slope, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = relu_value(x[i], negative_slope);
  }
}

PCD_KERNEL void relu_backward(const int n, const float* x, const float* dy, const float negative_slope, float* dx) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = dy[i] * (x[i] > 0.0f ? 1.0f : negative_slope); }
}

// x, y: (num, channels, dim); the slope of element i is slope[(i / dim) % channels / div_factor], div_factor being
// `channels` for one shared slope and 1 otherwise (prelu_layer.cu).
PCD_KERNEL void prelu_forward(const int n, const int channels, const int dim, const int div_factor, const float* x,
                              const float* slope, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    const float a = slope[(i / dim) % channels / div_factor];
    y[i] = relu_value(v, a);     // Caffe's PReLU is the ReLU of a learned slope
  }
}

PCD_KERNEL void prelu_backward(const int n, const int channels, const int dim, const int div_factor, const float* x,
                               const float* dy, const float* slope, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float a = slope[(i / dim) % channels / div_factor];
    dx[i] = dy[i] * (x[i] > 0.0f ? 1.0f : a);
  }
}

// The slope gradient's first step (prelu_layer.cu's PReLUParamBackward): for each of the channels * dim positions
// i (n of them), out[i] = sum over the `rows` images of dy * min(x, 0); a GEMV then sums over dim.
PCD_KERNEL void prelu_param_backward(const int n, const int rows, const float* x, const float* dy, float* out) {
  CUDA_KERNEL_LOOP(i, n) {
    float sum = dy[i] * neuron_min0(x[i]);
    for (int r = 1; r < rows; ++r) {
      const int j = r * n + i;
      sum += dy[j] * neuron_min0(x[j]);
    }
    out[i] = sum;
  }
}

// y = max(x, 0) + alpha * (exp(min(x, 0)) - 1)
PCD_KERNEL void elu_forward(const int n, const float* x, const float alpha, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    y[i] = neuron_max0(v) + alpha * (expf(neuron_min0(v)) - 1.0f);
  }
}

PCD_KERNEL void elu_backward(const int n, const float* x, const float* y, const float* dy, const float alpha,
                             float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float t = alpha + y[i];
    dx[i] = dy[i] * (x[i] > 0.0f ? 1.0f : t);
  }
}

// --- Sigmoid, TanH, Swish, BNLL -----------------------------------------------------------------------------------

PCD_KERNEL void sigmoid_forward(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = neuron_sigmoid(x[i]); }
}

PCD_KERNEL void sigmoid_backward(const int n, const float* y, const float* dy, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = y[i];
    dx[i] = dy[i] * v * (1.0f - v);
  }
}

PCD_KERNEL void tanh_forward(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = tanhf(x[i]); }
}

PCD_KERNEL void tanh_backward(const int n, const float* y, const float* dy, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = y[i];
    dx[i] = dy[i] * (1.0f - v * v);
  }
}

// sig = sigmoid(beta * x), kept for the backward (Caffe's sigmoid_output_); y = x * sig
PCD_KERNEL void swish_forward(const int n, const float* x, const float beta, float* sig, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    const float s = neuron_sigmoid(v * beta);
    sig[i] = s;
    y[i] = v * s;
  }
}

// dx = dy * (beta * y + sig * (1 - beta * y))
PCD_KERNEL void swish_backward(const int n, const float* y, const float* sig, const float* dy, const float beta,
                               float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float by = beta * y[i];
    dx[i] = dy[i] * (by + sig[i] * (1.0f - by));
  }
}

// y = max(x, 0) + log1p(e), e = exp(-|x|): Caffe's x > 0 ? x + log(1 + e^-x) : log(1 + e^x), with log1p recovered
// from log(1 + e) as the CPU kernel does (l * e / ((1 + e) - 1), and e where 1 + e rounds to 1).
PCD_KERNEL void bnll_forward(const int n, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const float u = x[i];
    const float e = expf(-fabsf(u));
    const float d = (1.0f + e) - 1.0f;
    const float q = d == 0.0f ? e : logf(1.0f + e) * (e / d);
    y[i] = neuron_max0(u) + q;
  }
}

// dx = dy * e / (e + 1), e = exp(min(x, 50)) (Caffe's kBNLL_THRESHOLD)
PCD_KERNEL void bnll_backward(const int n, const float* x, const float* dy, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    const float e = expf(50.0f < v ? 50.0f : v);
    dx[i] = dy[i] * e / (e + 1.0f);
  }
}

// --- AbsVal, Clip, Threshold --------------------------------------------------------------------------------------

// dx = dy * sign(x), sign(0) = 0 (the forward is math.cu's gpu_abs)
PCD_KERNEL void absval_backward(const int n, const float* x, const float* dy, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    dx[i] = dy[i] * (float)((0.0f < v) - (v < 0.0f));
  }
}

// y = std::max(lo, std::min(x, hi)) in std's comparison order (a NaN gives lo, as in Caffe)
PCD_KERNEL void clip_forward(const int n, const float* x, const float lo, const float hi, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    float v = x[i];
    v = hi < v ? hi : v;
    y[i] = lo < v ? v : lo;
  }
}

PCD_KERNEL void clip_backward(const int n, const float* x, const float* dy, const float lo, const float hi,
                              float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float v = x[i];
    dx[i] = dy[i] * (float)((v >= lo) & (v <= hi));
  }
}

PCD_KERNEL void threshold_forward(const int n, const float* x, const float threshold, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] > threshold ? 1.0f : 0.0f; }
}

// --- Power, Exp, Log ----------------------------------------------------------------------------------------------

// y = (shift + scale * x) ^ power, skipping the steps that change nothing as power_layer.cpp does (the layer fills
// the constant output of power * scale == 0 itself)
PCD_KERNEL void power_forward(const int n, const float* x, const float power, const float scale, const float shift,
                              float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    float v = x[i];
    if (scale != 1.0f) v = v * scale;
    if (shift != 0.0f) v = v + shift;
    if (power != 1.0f) v = powf(v, power);
    y[i] = v;
  }
}

// dx = dy * d/dx (scale * x + shift) ^ power by Caffe's formulas, diff_scale = power * scale: power 2:
// (diff_scale * scale) * x + diff_scale * shift; shift 0: power * y / x; else diff_scale * y / (scale * x + shift).
// (Power 1 and diff_scale 0 have constant derivatives: the layer scales or zeroes.)
PCD_KERNEL void power_backward(const int n, const float* x, const float* y, const float* dy, const float power,
                               const float scale, const float shift, float* dx) {
  const float diff_scale = power * scale, linear = diff_scale * scale, constant = diff_scale * shift;
  CUDA_KERNEL_LOOP(i, n) {
    if (power == 2.0f) {
      dx[i] = dy[i] * (linear * x[i] + constant);
    } else if (shift == 0.0f) {
      dx[i] = dy[i] * (power * (y[i] / x[i]));
    } else {
      dx[i] = dy[i] * (diff_scale * (y[i] / (scale * x[i] + shift)));
    }
  }
}

// y = outer_scale * exp(inner_scale * x) (exp_layer.cpp), multiplying only by scales other than 1
PCD_KERNEL void exp_forward(const int n, const float* x, const float inner_scale, const float outer_scale, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    float v = x[i];
    if (inner_scale != 1.0f) v = v * inner_scale;
    v = expf(v);
    if (outer_scale != 1.0f) v = v * outer_scale;
    y[i] = v;
  }
}

// dx = y * dy * inner_scale
PCD_KERNEL void exp_backward(const int n, const float* y, const float* dy, const float inner_scale, float* dx) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = y[i] * dy[i] * inner_scale; }
}

// y = base_scale * log(scale * x + shift) (log_layer.cpp), skipping the steps that change nothing
PCD_KERNEL void log_forward(const int n, const float* x, const float scale, const float shift, const float base_scale,
                            float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    float v = x[i];
    if (scale != 1.0f) v = v * scale;
    if (shift != 0.0f) v = v + shift;
    v = logf(v);
    if (base_scale != 1.0f) v = v * base_scale;
    y[i] = v;
  }
}

// dx = dy * (numerator * (scale * x + shift) ^ -1), numerator = scale / log(base)
PCD_KERNEL void log_backward(const int n, const float* x, const float* dy, const float scale, const float shift,
                             const float numerator, float* dx) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = dy[i] * (numerator * (1.0f / (scale * x[i] + shift))); }
}

// --- Dropout ------------------------------------------------------------------------------------------------------

// y = x * (rand < keep ? scale : 0) with uniform draws in [0, 1): Dropout's backward (x = top diff) with the draws
// its forward made and kept (dropout_philox_forward in random.cu). Caffe draws unsigned integers with curand and
// compares them with a threshold; the layer draws the CPU path's numbers instead, so both paths drop the same units.
PCD_KERNEL void dropout_apply(const int n, const float* x, const float* rand, const float keep, const float scale,
                              float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] * (rand[i] < keep ? scale : 0.0f); }
}
