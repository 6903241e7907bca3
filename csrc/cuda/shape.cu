// Kernels of the shape layers (pycaffe_dist/layers/shape.py) that math.cu's element-wise ones and BLAS do not cover:
// Crop, Tile, Eltwise MAX, the broadcast of Bias and Scale, BatchReindex and Filter, one thread per output element
// as in Caffe's src/caffe/layers/{crop,tile,eltwise,bias,scale,batch_reindex,filter}_layer.cu. (Concat and Slice use
// math.cu's gpu_copy_rows.)
#include "common.cuh"

// --- Crop ---------------------------------------------------------------------------------------------------------

// The bottom index of top element i: dims holds the top's shape, the bottom's strides and the offsets, num_axes of
// each (crop_layer.cu's crop_kernel, with the index arithmetic of its ND form).
PCD_DEVICE int crop_source_index(int i, const int num_axes, const int* dims) {
  const int* shape = dims;
  const int* strides = dims + num_axes;
  const int* offsets = dims + 2 * num_axes;
  int index = 0;
  for (int d = num_axes - 1; d >= 0; --d) {
    index += (i % shape[d] + offsets[d]) * strides[d];
    i /= shape[d];
  }
  return index;
}

PCD_KERNEL void crop_forward(const int n, const int num_axes, const int* dims, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[crop_source_index(i, num_axes, dims)]; }
}

// dx (zeroed first by the layer) at the window = dy
PCD_KERNEL void crop_backward(const int n, const int num_axes, const int* dims, const float* dy, float* dx) {
  CUDA_KERNEL_LOOP(i, n) { dx[crop_source_index(i, num_axes, dims)] = dy[i]; }
}

// --- Tile ---------------------------------------------------------------------------------------------------------

// y viewed as (outer, tiles, inner) = x viewed as (outer, 1, inner), n = y's count (tile_layer.cu's Tile)
PCD_KERNEL void tile_forward(const int n, const int inner, const int tiles, const float* x, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i / (inner * tiles) * inner + i % inner]; }
}

// dx (outer, inner) = the sum of dy (outer, tiles, inner) over the tiles, in order; n = dx's count
PCD_KERNEL void tile_backward(const int n, const int inner, const int tiles, const float* dy, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const float* src = dy + i / inner * tiles * inner + i % inner;
    float sum = src[0];
    for (int t = 1; t < tiles; ++t) sum += src[t * inner];
    dx[i] = sum;
  }
}

// --- Eltwise MAX --------------------------------------------------------------------------------------------------

// blob_idx 0: y = a > b ? a : b from bottoms 0 and 1, mask 0 or 1 (bottom 1 wins ties). blob_idx >= 2: a is the
// top so far, b bottom blob_idx, which replaces it only where strictly greater. This is eltwise_layer.cpp's
// Forward_cpu (and our CPU code); Caffe's MaxForward kernel lets a later bottom win a tie.
PCD_KERNEL void eltwise_max_forward(const int n, const float* a, const float* b, const int blob_idx, float* y,
                                    int* mask) {
  CUDA_KERNEL_LOOP(i, n) {
    const float va = a[i], vb = b[i];
    if (blob_idx == 0) {
      const bool first = va > vb;
      y[i] = first ? va : vb;
      mask[i] = first ? 0 : 1;
    } else if (vb > va) {
      y[i] = vb;
      mask[i] = blob_idx;
    }
  }
}

PCD_KERNEL void eltwise_max_backward(const int n, const float* dy, const int* mask, const int blob_idx, float* dx) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = mask[i] == blob_idx ? dy[i] : 0.0f; }
}

// --- Eltwise SUM of two bottoms with the in-place ReLU after it, as one (net/gpu_fusion.py) -----------------------

// y = relu(c0 a + c1 b): the Eltwise's gpu_scale then axpy (a fused multiply-add, as cuBLAS's saxpy), then
// the ReLU (common.cuh's relu_value, as relu_forward). y may not be a or b (the Eltwise is not in place).
PCD_KERNEL void eltwise_sum_relu_forward(const int n, const float c0, const float* a, const float c1, const float* b,
                                         const float negative_slope, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = relu_value(fmaf(c1, b[i], c0 * a[i]), negative_slope);
  }
}

// The backward of the two as the layers run it: the ReLU's, in place (dy through where y, its top and bottom, is
// positive, relu_backward's arithmetic), left in the blob's diff as the ReLU leaves it; then the Eltwise's,
// gpu_scale of that by each coefficient into the bottom diffs asked for (want0, want1; dx0, dx1 unused where 0).
// dy is read before it is written, thread by thread.
PCD_KERNEL void eltwise_sum_relu_backward(const int n, const float* y, const float negative_slope, const float c0,
                                          const float c1, const int want0, const int want1, float* dy, float* dx0,
                                          float* dx1) {
  CUDA_KERNEL_LOOP(i, n) {
    const float g = dy[i] * (y[i] > 0.0f ? 1.0f : negative_slope);
    dy[i] = g;
    if (want0) dx0[i] = c0 * g;
    if (want1) dx1[i] = c1 * g;
  }
}

// --- Bias, Scale --------------------------------------------------------------------------------------------------

// x, y viewed as (outer, dim, inner); bias, scale: dim values broadcast over outer and inner
PCD_KERNEL void bias_forward(const int n, const float* x, const float* bias, const int dim, const int inner,
                             float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] + bias[(i / inner) % dim]; }
}

// A Convolution's bias and the in-place ReLU after it, in one pass over the top (gpu_fusion.ConvolutionReLU): y + b
// as cuDNN's AddTensor and Caffe's bias GEMM (k = 1) round it, then the ReLU (common.cuh's relu_value).
PCD_KERNEL void bias_relu_forward(const int n, const float* x, const float* bias, const int dim, const int inner,
                                  const float negative_slope, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = relu_value(x[i] + bias[(i / inner) % dim], negative_slope);
  }
}

// Concat's copies of all its bottoms in one launch, where concat_layer.cu launches one per bottom. Over the top's
// n = outer * total * inner elements: bottom b (addresses[b]; 0: not copied) holds entries starts[b] ..
// starts[b + 1] - 1 of the top's `total` along the axis. forward: the top from the bottoms' data; backward: the
// bottoms' diffs from the top's.
PCD_KERNEL void concat_many(const int n, const long long* addresses, const int* starts, const int total,
                            const int inner, const int forward, float* top) {
  CUDA_KERNEL_LOOP(i, n) {
    const int a = i / inner % total;
    int b = 0;
    while (a >= starts[b + 1]) ++b;
    float* const bottom = reinterpret_cast<float*>(addresses[b]);
    if (bottom == 0) continue;
    const int size = starts[b + 1] - starts[b];
    const int j = (i / (inner * total) * size + (a - starts[b])) * inner + i % inner;
    if (forward) {
      top[i] = bottom[j];
    } else {
      bottom[j] = top[i];
    }
  }
}

// Split's gradient, the sum of its tops' diffs (addresses[0 .. tops - 1], tops >= 2), in one launch: split_layer.cu
// adds the first two and axpys each other one, y = 1 x + y: the same float sums in the same order.
PCD_KERNEL void split_sum_many(const int n, const int tops, const long long* addresses, float* sum) {
  CUDA_KERNEL_LOOP(i, n) {
    float v = reinterpret_cast<const float*>(addresses[0])[i] + reinterpret_cast<const float*>(addresses[1])[i];
    for (int t = 2; t < tops; ++t) v = reinterpret_cast<const float*>(addresses[t])[i] + v;
    sum[i] = v;
  }
}

PCD_KERNEL void scale_forward(const int n, const float* x, const float* scale, const int dim, const int inner,
                              float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] * scale[(i / inner) % dim]; }
}

// y = x * scale + bias, the scale and the bias broadcast alike (scale_layer.cu's ScaleBiasForward)
PCD_KERNEL void scale_bias_forward(const int n, const float* x, const float* scale, const float* bias, const int dim,
                                   const int inner, float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / inner) % dim;
    y[i] = x[i] * scale[c] + bias[c];
  }
}

// In place (y is x): saved = x, then y = x * scale (+ bias where has_bias, the bias broadcast as the scale), in one
// pass; Scale keeps its input for the scale's gradient as Caffe's temp_ does.
PCD_KERNEL void scale_bias_forward_keeping(const int n, const float* x, const float* scale, const float* bias,
                                           const int has_bias, const int dim, const int inner, float* saved,
                                           float* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / inner) % dim;
    const float v = x[i];
    saved[i] = v;
    y[i] = has_bias ? v * scale[c] + bias[c] : v * scale[c];
  }
}

// --- BatchReindex, Filter ----------------------------------------------------------------------------------------

// y row r = x row permut[r], rows of `inner` values; permut holds floats read as static_cast<int>, checked in range
// by the layer on the host (batch_reindex_layer.cu's BRForward).
PCD_KERNEL void batch_reindex_forward(const int n, const int inner, const float* x, const float* permut, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[static_cast<int>(permut[i / inner]) * inner + i % inner]; }
}

// dx row b = the sum of the dy rows that picked b, in ascending order: they are top_indexes[begins[b]] ..
// top_indexes[begins[b] + counts[b] - 1] (batch_reindex_layer.cu's BRBackward). One thread per dx value, so no
// atomics and the same sum at every run; a row no one picked gets 0.
PCD_KERNEL void batch_reindex_backward(const int n, const int inner, const float* dy, const int* top_indexes,
                                       const int* begins, const int* counts, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int b = i / inner, j = i % inner;
    float sum = 0;
    for (int k = begins[b]; k < begins[b] + counts[b]; ++k) sum += dy[top_indexes[k] * inner + j];
    dx[i] = sum;
  }
}

// y row r = x row rows[r]: Filter's forward of the selected items (filter_layer.cu copies them one caffe_copy per
// item; one launch does them all).
PCD_KERNEL void filter_forward(const int n, const int inner, const float* x, const int* rows, float* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[rows[i / inner] * inner + i % inner]; }
}

// dx row b = dy row top_rows[b] where item b was forwarded, else 0 (top_rows[b] = -1), as filter_layer.cu's
// Backward_gpu; n = dx's count.
PCD_KERNEL void filter_backward(const int n, const int inner, const float* dy, const int* top_rows, float* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int r = top_rows[i / inner];
    dx[i] = r >= 0 ? dy[r * inner + i % inner] : 0.0f;
  }
}
