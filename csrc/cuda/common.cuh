// Conventions shared by every kernel of csrc/cuda (loaded by pycaffe_dist/backend/cuda.py through pycuda).
//
// A kernel is declared `PCD_KERNEL void name(const int n, ...)`: extern "C" (pycuda finds it by name), its first
// parameter the number of threads the launcher starts, its loop CUDA_KERNEL_LOOP(i, n) as in Caffe's
// include/caffe/util/device_alternate.hpp, so that any grid covers the work. Parameters are int, float or
// pointers (float*, const float*, int*, unsigned*): pycaffe_dist/backend/kernel_source.py reads the declarations
// to know the argument types, so a declaration must fit on the lines up to its opening brace.
//
// Without nvcc (__CUDACC__ undefined) the same sources compile for the host, one thread running the whole grid:
// the emulated device (backend/emulated.py) runs the GPU code path on the CPU in the tests of machines without a
// GPU. Kernels therefore use neither shared memory nor __syncthreads; the few atomics become plain updates.
#pragma once

#ifdef __CUDACC__
#define PCD_KERNEL extern "C" __global__
#define PCD_DEVICE __device__ __forceinline__
#else
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <climits>
struct pcd_dim3 { unsigned x, y, z; };
static const pcd_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define PCD_KERNEL extern "C"
#define PCD_DEVICE static inline
using std::max;
using std::min;
static inline float atomicAdd(float* address, float value) { float old = *address; *address += value; return old; }
#endif

#define CUDA_KERNEL_LOOP(i, n) \
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)

// Caffe's ReLU of slope s, max(v, 0) + s min(v, 0) (so a NaN stays NaN): every kernel that applies one, the layer's
// (neuron.cu) and the fused runs' (channel.cu, shape.cu), computes it here, so the fused results are the same bits.
PCD_DEVICE float relu_value(const float v, const float negative_slope) {
  return (v < 0.0f ? 0.0f : v) + negative_slope * (0.0f < v ? 0.0f : v);
}
