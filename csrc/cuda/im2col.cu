// im2col and col2im on the GPU, after Caffe's src/caffe/util/im2col.cu (im2col_gpu_kernel, col2im_gpu_kernel,
// im2col_nd_gpu_kernel, col2im_nd_gpu_kernel), batched: `num` images of (channels, *spatial) one after the
// other unroll into `num` column buffers of (channels * prod(kernel), *out) one after the other, i.e. the column
// buffer is (num, rows, P), each image's part exactly Caffe's. Convolution (pycaffe_dist/layers/conv.py) unrolls
// a chunk of images this way and multiplies them with one strided-batched GEMM; the Im2col layer is num = N.
//
// col2im is a gather (one thread per image element sums its column entries, no atomics), as Caffe's. Each image
// element takes its terms in column-row order (kernel tap ascending), the order in which the CPU col2im
// (csrc/im2col_core.pxi) adds them, so both give the same sums from the same columns.
#include "common.cuh"

// --- 2-D (Caffe's im2col_gpu / col2im_gpu) --------------------------------------------------------------------

// n = num * channels * height_col * width_col threads; each writes the kernel_h * kernel_w column entries of one
// (image, channel, output position), as Caffe's im2col_gpu_kernel.
PCD_KERNEL void im2col_2d(const int n, const float* data_im, const int channels, const int height, const int width,
                          const int kernel_h, const int kernel_w, const int pad_h, const int pad_w,
                          const int stride_h, const int stride_w, const int dilation_h, const int dilation_w,
                          const int height_col, const int width_col, float* data_col) {
  CUDA_KERNEL_LOOP(index, n) {
    const int per_image = channels * height_col * width_col;
    const int image = index / per_image;
    const int rest = index % per_image;
    const int h_index = rest / width_col;
    const int h_col = h_index % height_col;
    const int w_col = rest % width_col;
    const int c_im = h_index / height_col;
    const int c_col = c_im * kernel_h * kernel_w;
    const int h_offset = h_col * stride_h - pad_h;
    const int w_offset = w_col * stride_w - pad_w;
    float* col = data_col + (long long)image * per_image * kernel_h * kernel_w
                 + ((long long)c_col * height_col + h_col) * width_col + w_col;
    const float* im = data_im + ((long long)image * channels + c_im) * height * width;
    for (int i = 0; i < kernel_h; ++i) {
      for (int j = 0; j < kernel_w; ++j) {
        const int h_im = h_offset + i * dilation_h;
        const int w_im = w_offset + j * dilation_w;
        *col = (h_im >= 0 && w_im >= 0 && h_im < height && w_im < width) ? im[h_im * width + w_im] : 0.0f;
        col += height_col * width_col;
      }
    }
  }
}

// n = num * channels * height * width threads, one per image element: the sum of the column entries im2col_2d
// took from it. Caffe's col2im_gpu_kernel, with the output positions walked backwards so that the kernel taps
// come in ascending order. Dilations must be positive (a zero dilation takes col2im_nd).
PCD_KERNEL void col2im_2d(const int n, const float* data_col, const int channels, const int height, const int width,
                          const int kernel_h, const int kernel_w, const int pad_h, const int pad_w,
                          const int stride_h, const int stride_w, const int dilation_h, const int dilation_w,
                          const int height_col, const int width_col, float* data_im) {
  CUDA_KERNEL_LOOP(index, n) {
    const int w_im = index % width + pad_w;
    const int h_im = (index / width) % height + pad_h;
    const int c_im = (index / (width * height)) % channels;
    const int image = index / (width * height * channels);
    const float* col = data_col + (long long)image * channels * kernel_h * kernel_w * height_col * width_col;
    const int kernel_extent_w = (kernel_w - 1) * dilation_w + 1;
    const int kernel_extent_h = (kernel_h - 1) * dilation_h + 1;
    // the output positions whose windows cover this element
    const int w_col_start = (w_im < kernel_extent_w) ? 0 : (w_im - kernel_extent_w) / stride_w + 1;
    const int w_col_end = min(w_im / stride_w + 1, width_col);
    const int h_col_start = (h_im < kernel_extent_h) ? 0 : (h_im - kernel_extent_h) / stride_h + 1;
    const int h_col_end = min(h_im / stride_h + 1, height_col);
    float val = 0;
    for (int h_col = h_col_end - 1; h_col >= h_col_start; --h_col) {
      for (int w_col = w_col_end - 1; w_col >= w_col_start; --w_col) {
        int h_k = h_im - h_col * stride_h;
        int w_k = w_im - w_col * stride_w;
        if (h_k % dilation_h == 0 && w_k % dilation_w == 0) {
          h_k /= dilation_h;
          w_k /= dilation_w;
          const long long col_index =
              (((long long)(c_im * kernel_h + h_k) * kernel_w + w_k) * height_col + h_col) * width_col + w_col;
          val += col[col_index];
        }
      }
    }
    data_im[index] = val;
  }
}

// --- N-d (Caffe's im2col_nd_gpu / col2im_nd_gpu) --------------------------------------------------------------
//
// `shape` is a small int array on the device: im_shape (channels, *spatial), col_shape (rows, *out), kernel, pad,
// stride, dilation, one after the other: 6 * num_axes + 2 ints.

#define PCD_IM2COL_MAX_AXES 32   // Caffe's kMaxBlobAxes

// The arrays packed one after the other in `shape` (above).
struct NdGeometry {
  const int *im_shape, *col_shape, *kernel, *pad, *stride, *dilation;
};

PCD_DEVICE NdGeometry nd_geometry(const int* shape, const int num_axes) {
  NdGeometry g;
  g.im_shape = shape;
  g.col_shape = g.im_shape + num_axes + 1;
  g.kernel = g.col_shape + num_axes + 1;
  g.pad = g.kernel + num_axes;
  g.stride = g.pad + num_axes;
  g.dilation = g.stride + num_axes;
  return g;
}

// n = num * rows * prod(out) threads, one per column entry (row = channel * kernel_size + tap, taps in row-major
// order over the kernel; then the output position, last axis fastest), as Caffe's im2col_nd_core_cpu lays them.
PCD_KERNEL void im2col_nd(const int n, const float* data_im, const int num_axes, const int* shape, float* data_col) {
  const NdGeometry g = nd_geometry(shape, num_axes);
  CUDA_KERNEL_LOOP(index, n) {
    int positions = 1, kernel_size = 1, im_size = g.im_shape[0];
    for (int d = 0; d < num_axes; ++d) {
      positions *= g.col_shape[d + 1];
      kernel_size *= g.kernel[d];
      im_size *= g.im_shape[d + 1];
    }
    const int col_size = g.col_shape[0] * positions;
    const int image = index / col_size;
    const int row = (index % col_size) / positions;
    int position = index % positions, tap = row % kernel_size;
    long long im_index = 0;
    int stride_im = 1;
    bool padding = false;
    // last axis first: the position's and the tap's coordinate along axis d
    for (int d = num_axes - 1; d >= 0; --d) {
      const int d_col = position % g.col_shape[d + 1];
      const int d_k = tap % g.kernel[d];
      position /= g.col_shape[d + 1];
      tap /= g.kernel[d];
      const int d_im = d_col * g.stride[d] - g.pad[d] + d_k * g.dilation[d];
      padding = padding || d_im < 0 || d_im >= g.im_shape[d + 1];
      im_index += (long long)d_im * stride_im;
      stride_im *= g.im_shape[d + 1];
    }
    const int channel = row / kernel_size;
    data_col[index] = padding ? 0.0f : data_im[(long long)image * im_size + (long long)channel * stride_im + im_index];
  }
}

// n = num * channels * prod(spatial) threads, one per image element: the sum over the kernel taps (ascending) of
// the column entry that tap took from it, if any. Any dilation, zero included.
PCD_KERNEL void col2im_nd(const int n, const float* data_col, const int num_axes, const int* shape, float* data_im) {
  const NdGeometry g = nd_geometry(shape, num_axes);
  CUDA_KERNEL_LOOP(index, n) {
    int d_im[PCD_IM2COL_MAX_AXES];
    int positions = 1, kernel_size = 1, spatial = 1;
    for (int d = 0; d < num_axes; ++d) {
      positions *= g.col_shape[d + 1];
      kernel_size *= g.kernel[d];
      spatial *= g.im_shape[d + 1];
    }
    const int channels = g.im_shape[0];
    const int image = index / (channels * spatial);
    const int channel = (index / spatial) % channels;
    int rest = index % spatial;
    for (int d = num_axes - 1; d >= 0; --d) {
      d_im[d] = rest % g.im_shape[d + 1] + g.pad[d];   // in padded coordinates
      rest /= g.im_shape[d + 1];
    }
    const float* col = data_col + ((long long)image * channels + channel) * kernel_size * positions;
    float val = 0;
    for (int tap = 0; tap < kernel_size; ++tap) {
      // the output position whose window reads this element at `tap`, if there is one
      int t = tap, position = 0, scale = 1;
      bool hit = true;
      for (int d = num_axes - 1; d >= 0 && hit; --d) {
        const int d_k = t % g.kernel[d];
        t /= g.kernel[d];
        const int offset = d_im[d] - d_k * g.dilation[d];
        hit = offset >= 0 && offset % g.stride[d] == 0 && offset / g.stride[d] < g.col_shape[d + 1];
        position += (hit ? offset / g.stride[d] : 0) * scale;
        scale *= g.col_shape[d + 1];
      }
      if (hit) {
        val += col[(long long)tap * positions + position];
      }
    }
    data_im[index] = val;
  }
}

// --- row lookups (Embed, pycaffe_dist/layers/inner_product.py) --------------------------------------------------
//
// Caffe's embed_layer.cu: the forward gathers rows of the table; its backward adds rows with atomics. Here the
// backward is a gather too: the positions of each index, grouped (stable) on the host (`starts[r]..starts[r+1]`
// index `positions`), are summed by one thread per table entry in position order, the order of the CPU's
// np.add.at, onto the entry's diff.

// n = count * num_output threads: top[i, j] = weight[index[i], j].
PCD_KERNEL void embed_forward(const int n, const int* index, const float* weight, const int num_output,
                              float* top) {
  CUDA_KERNEL_LOOP(i, n) {
    const int row = i / num_output, j = i % num_output;
    top[i] = weight[(long long)index[row] * num_output + j];
  }
}

// n = input_dim * num_output threads: weight_diff[r, j] += top_diff[p, j] for the positions p of index r.
PCD_KERNEL void embed_backward(const int n, const float* top_diff, const int* positions, const int* starts,
                               const int num_output, float* weight_diff) {
  CUDA_KERNEL_LOOP(i, n) {
    const int row = i / num_output, j = i % num_output;
    float gradient = weight_diff[i];
    for (int k = starts[row]; k < starts[row + 1]; ++k) {
      gradient += top_diff[(long long)positions[k] * num_output + j];
    }
    weight_diff[i] = gradient;
  }
}
