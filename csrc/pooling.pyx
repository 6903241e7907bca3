# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""CPU 2-D pooling, forward and backward, as Caffe's src/caffe/layers/pooling_layer.cpp (MAX, AVE) and, for
STOCHASTIC, its GPU kernels in pooling_layer.cu (Caffe's CPU has no STOCHASTIC path).

Every function takes C-contiguous arrays of planes: the input (planes, height * width), the output
(planes, pooled_h * pooled_w), with planes = num * channels, and `geometry` = (height, width, pooled_h, pooled_w,
kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w). float32 and float64 both work (all real arrays of one call
share the dtype). Work runs in parallel (OpenMP prange) without the GIL. Window positions are plane offsets
h * width + w in int32 arrays shaped like the output (-1: the window chose nothing).

Window of output (ph, pw), as Caffe: hstart = ph * stride_h - pad_h, clipped to [0, height) for reading; AVE
divides by the window's size clipped to the PADDED extent [-pad, height + pad) only. STOCHASTIC ignores padding
(Caffe allows none with it).

MAX and AVE run Caffe's loops LANES planes at a time: every plane has the same windows, so a block of planes is
first interleaved (element e of lane l at e * LANES + l) and each step of a window then works on LANES
neighbouring values, independent of each other (one window at a time is a chain of dependent compares or adds,
and consecutive windows of one plane would need strided reads). Each lane still takes its inputs, and each input
diff its terms, in exactly Caffe's order, so the results are Caffe's bit for bit.
Python wrappers on 4-D arrays: pycaffe_dist/backend/pooling.py.
"""
cimport openmp
from cython.parallel import prange, threadid
import numpy as np
from libc.float cimport FLT_MAX, FLT_MIN

ctypedef fused real:
    float
    double

cdef enum:
    LANES = 8   # planes pooled side by side (pcd_max_window8 below is written for 8)


cdef extern from *:
    """
    #include <float.h>
    typedef float pcd_f4 __attribute__((vector_size(16)));
    typedef int pcd_i4 __attribute__((vector_size(16)));
    typedef float pcd_f4u __attribute__((vector_size(16), aligned(4), may_alias));   /* for unaligned access */
    typedef int pcd_i4u __attribute__((vector_size(16), aligned(4), may_alias));

    /* Caffe's MAX loop over one window of 8 interleaved float planes (element e of lane l at buf[e * 8 + l]),
       written with GCC / Clang generic vectors: gcc (12) leaves the same loop written per lane scalar, with
       the running maxima spilled; this is twice as fast. */
    static inline void pcd_max_window8(const float* buf, int width, int hstart, int hend, int wstart, int wend,
                                       float* best, int* arg) {
        pcd_f4 best0 = {-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX}, best1 = best0;
        pcd_i4 arg0 = {-1, -1, -1, -1}, arg1 = arg0;
        for (int h = hstart; h < hend; h++) {
            for (int w = wstart; w < wend; w++) {
                int i = h * width + w;
                pcd_f4 a0 = *(const pcd_f4u*)(buf + (size_t)i * 8), a1 = *(const pcd_f4u*)(buf + (size_t)i * 8 + 4);
                pcd_i4 better0 = a0 > best0, better1 = a1 > best1;   /* -1 where strictly greater */
                arg0 = (arg0 & ~better0) | (i & better0);
                arg1 = (arg1 & ~better1) | (i & better1);
                best0 = (pcd_f4)(((pcd_i4)best0 & ~better0) | ((pcd_i4)a0 & better0));
                best1 = (pcd_f4)(((pcd_i4)best1 & ~better1) | ((pcd_i4)a1 & better1));
            }
        }
        *(pcd_f4u*)best = best0;
        *(pcd_f4u*)(best + 4) = best1;
        *(pcd_i4u*)arg = arg0;
        *(pcd_i4u*)(arg + 4) = arg1;
    }

    /* 2x2 windows at stride 2 that all lie inside the plane (height = 2 pooled_h, width = 2 pooled_w, no pad),
       LeNet's and VGG's pooling: 8 (then 4) outputs of a row at a time straight from the plane, the even and odd
       columns of two input rows taken apart by shuffles. Caffe's order and test, as pcd_max_window8. */
    typedef float pcd_f8 __attribute__((vector_size(32)));
    typedef int pcd_i8 __attribute__((vector_size(32)));
    typedef float pcd_f8u __attribute__((vector_size(32), aligned(4), may_alias));
    typedef int pcd_i8u __attribute__((vector_size(32), aligned(4), may_alias));
    #define PCD_TAKE(vec_f, vec_i, v, at) do { vec_i gt_ = (v) > best;                                             \
            best = (vec_f)(((vec_i)best & ~gt_) | ((vec_i)(v) & gt_)); arg = (arg & ~gt_) | ((at) & gt_); } while (0)
    /* n (8 or 4) outputs from two input rows a, b (the window's top-left input at plane offset `first`) */
    #define PCD_MAX2X2(vec_f, vec_fu, vec_i, vec_iu, n, EVEN, ODD) do {                                          \
            pcd_f8 a0 = *(const pcd_f8u*)(a + 2 * pw), b0 = *(const pcd_f8u*)(b + 2 * pw), a1 = a0, b1 = b0;    \
            if (n == 8) { a1 = *(const pcd_f8u*)(a + 2 * pw + 8); b1 = *(const pcd_f8u*)(b + 2 * pw + 8); }     \
            vec_i at = (vec_i){EVEN} + first + 2 * pw;     /* EVEN: also the even offsets */                       \
            vec_f best = (vec_f){} - FLT_MAX;                                                                   \
            vec_i arg = (vec_i){} - 1;                                                                          \
            PCD_TAKE(vec_f, vec_i, __builtin_shufflevector(a0, a1, EVEN), at);                                  \
            PCD_TAKE(vec_f, vec_i, __builtin_shufflevector(a0, a1, ODD), at + 1);                               \
            PCD_TAKE(vec_f, vec_i, __builtin_shufflevector(b0, b1, EVEN), at + width);                          \
            PCD_TAKE(vec_f, vec_i, __builtin_shufflevector(b0, b1, ODD), at + width + 1);                       \
            *(vec_fu*)(yo + pw) = best;                                                                         \
            *(vec_iu*)(mo + pw) = arg;                                                                          \
        } while (0)
    #define PCD_EVEN8 0, 2, 4, 6, 8, 10, 12, 14
    #define PCD_ODD8 1, 3, 5, 7, 9, 11, 13, 15
    #define PCD_EVEN4 0, 2, 4, 6
    #define PCD_ODD4 1, 3, 5, 7
    static void pcd_max2x2_plane(const float* x, int width, int pooled_h, int pooled_w, float* y, int* mask) {
        for (int ph = 0; ph < pooled_h; ph++) {
            const float* a = x + (size_t)2 * ph * width;
            const float* b = a + width;
            float* yo = y + (size_t)ph * pooled_w;
            int* mo = mask + (size_t)ph * pooled_w;
            int first = 2 * ph * width, pw = 0;
            for (; pw + 8 <= pooled_w; pw += 8)
                PCD_MAX2X2(pcd_f8, pcd_f8u, pcd_i8, pcd_i8u, 8, PCD_EVEN8, PCD_ODD8);
            for (; pw + 4 <= pooled_w; pw += 4)
                PCD_MAX2X2(pcd_f4, pcd_f4u, pcd_i4, pcd_i4u, 4, PCD_EVEN4, PCD_ODD4);
            for (; pw < pooled_w; pw++) {
                float best = -FLT_MAX;
                int arg = -1, i = first + 2 * pw;
                const int taps[4] = {i, i + 1, i + width, i + width + 1};
                for (int t = 0; t < 4; t++) {
                    int better = x[taps[t]] > best;
                    arg = better ? taps[t] : arg;
                    best = better ? x[taps[t]] : best;
                }
                yo[pw] = best;
                mo[pw] = arg;
            }
        }
    }

    /* v in every lane (a sum with a zero vector would turn -0.0 into +0.0) */
    static inline pcd_f8 pcd_splat8(float v) { return (pcd_f8){v, v, v, v, v, v, v, v}; }

    /* The three columns of 8 windows at stride 2 in one input row: the row's even columns, its odd ones, and the
       even ones shifted by one (each window's third column; `fill` for the eighth window's where it lies past the
       row). */
    static inline void pcd_3x3s2_columns(const float* row, int third_inside, float fill, pcd_f8* first,
                                         pcd_f8* second, pcd_f8* third) {
        pcd_f8 a = *(const pcd_f8u*)row, b = *(const pcd_f8u*)(row + 8);
        *first = __builtin_shufflevector(a, b, PCD_EVEN8);
        *second = __builtin_shufflevector(a, b, PCD_ODD8);
        *third = __builtin_shufflevector(*first, pcd_splat8(third_inside ? row[16] : fill), 1, 2, 3, 4, 5, 6, 7, 8);
    }

    /* 3x3 windows at stride 2 without padding (CIFAR-10's, CaffeNet's and GoogLeNet's MAX pooling), 8 outputs of a
       row at a time, each input row's three columns (pcd_3x3s2_columns) taken in Caffe's row-major order and test.
       Caffe's ceil rounding clips the last window of a row or column; its missing third column is -FLT_MAX here,
       which never wins (Caffe starts from -FLT_MAX and takes only a strictly greater value). */
    static void pcd_max3x3s2_plane(const float* x, int height, int width, int pooled_h, int pooled_w, float* y,
                                   int* mask) {
        const pcd_i8 even = {PCD_EVEN8};
        for (int ph = 0; ph < pooled_h; ph++) {
            int h0 = 2 * ph, h1 = h0 + 3 < height ? h0 + 3 : height;
            float* yo = y + (size_t)ph * pooled_w;
            int* mo = mask + (size_t)ph * pooled_w;
            int pw = 0;
            for (; pw + 8 <= pooled_w && 2 * pw + 16 <= width; pw += 8) {
                pcd_f8 best = (pcd_f8){} - FLT_MAX;
                pcd_i8 arg = (pcd_i8){} - 1;
                for (int h = h0; h < h1; h++) {
                    pcd_f8 c0, c1, c2;
                    pcd_3x3s2_columns(x + (size_t)h * width + 2 * pw, 2 * pw + 16 < width, -FLT_MAX, &c0, &c1, &c2);
                    pcd_i8 at = even + (h * width + 2 * pw);
                    PCD_TAKE(pcd_f8, pcd_i8, c0, at);
                    PCD_TAKE(pcd_f8, pcd_i8, c1, at + 1);
                    PCD_TAKE(pcd_f8, pcd_i8, c2, at + 2);
                }
                *(pcd_f8u*)(yo + pw) = best;
                *(pcd_i8u*)(mo + pw) = arg;
            }
            for (; pw < pooled_w; pw++) {
                int w1 = 2 * pw + 3 < width ? 2 * pw + 3 : width;
                float best = -FLT_MAX;
                int arg = -1;
                for (int h = h0; h < h1; h++)
                    for (int w = 2 * pw; w < w1; w++) {
                        int i = h * width + w, better = x[i] > best;
                        arg = better ? i : arg;
                        best = better ? x[i] : best;
                    }
                yo[pw] = best;
                mo[pw] = arg;
            }
        }
    }

    /* AVE over the same windows, in Caffe's order: the sum from 0 row by row, then divided by the window's size
       (clipped windows are smaller: no padding). A missing third column adds -0.0, which changes no sum. */
    static void pcd_ave3x3s2_plane(const float* x, int height, int width, int pooled_h, int pooled_w, float* y) {
        for (int ph = 0; ph < pooled_h; ph++) {
            int h0 = 2 * ph, h1 = h0 + 3 < height ? h0 + 3 : height;
            float* yo = y + (size_t)ph * pooled_w;
            int pw = 0;
            for (; pw + 8 <= pooled_w && 2 * pw + 16 <= width; pw += 8) {
                pcd_f8 total = {};
                int last_cols = 2 * pw + 16 < width ? 3 : 2;     /* output pw + 7 may lose its third column */
                for (int h = h0; h < h1; h++) {
                    pcd_f8 c0, c1, c2;
                    pcd_3x3s2_columns(x + (size_t)h * width + 2 * pw, last_cols == 3, -0.0f, &c0, &c1, &c2);
                    total += c0;
                    total += c1;
                    total += c2;
                }
                int rows = h1 - h0;
                pcd_f8 size = {3 * rows, 3 * rows, 3 * rows, 3 * rows, 3 * rows, 3 * rows, 3 * rows, last_cols * rows};
                *(pcd_f8u*)(yo + pw) = total / size;
            }
            for (; pw < pooled_w; pw++) {
                int w1 = 2 * pw + 3 < width ? 2 * pw + 3 : width;
                float total = 0;
                for (int h = h0; h < h1; h++)
                    for (int w = 2 * pw; w < w1; w++) total += x[h * width + w];
                yo[pw] = total / ((h1 - h0) * (w1 - 2 * pw));
            }
        }
    }

    /* Its backward, gathered: each input diff sums the shares (dy / window size) of the windows that cover it in
       Caffe's order (windows in row-major order, from 0 or from dx when accumulating), 16 inputs of a row at a
       time, where Caffe's scatter adds 9 shares per window. Input row h lies in output rows h / 2 - 1 (its third
       row, h even) and h / 2 (first row), or (h - 1) / 2 (odd h); columns alike. (MAX's scatter, one add per
       window, stays faster than a gather.) */
    static inline float pcd_ave3x3s2_share(const float* dy, int height, int width, int pooled_w, int ph, int pw) {
        int h1 = 2 * ph + 3 < height ? 2 * ph + 3 : height, w1 = 2 * pw + 3 < width ? 2 * pw + 3 : width;
        return dy[ph * pooled_w + pw] / ((h1 - 2 * ph) * (w1 - 2 * pw));
    }
    static void pcd_ave3x3s2_backward_plane(const float* dy, float* dx, int height, int width, int pooled_h,
                                            int pooled_w, int accumulate) {
        for (int h = 0; h < height; h++) {
            int rows[2], nr = 0;
            if (h % 2 == 0) {
                if (h >= 2) rows[nr++] = h / 2 - 1;
                if (h / 2 < pooled_h) rows[nr++] = h / 2;
            } else if ((h - 1) / 2 < pooled_h) {
                rows[nr++] = (h - 1) / 2;
            }
            float* d = dx + (size_t)h * width;
            int w = 0;
            for (; w + 16 <= width && w / 2 + 8 <= pooled_w; w += 16) {
                int j0 = w / 2;
                pcd_f8 e = {}, o = {};   /* the even and the odd inputs */
                if (accumulate) {
                    pcd_f8 a = *(const pcd_f8u*)(d + w), b = *(const pcd_f8u*)(d + w + 8);
                    e = __builtin_shufflevector(a, b, PCD_EVEN8);
                    o = __builtin_shufflevector(a, b, PCD_ODD8);
                }
                for (int k = 0; k < nr; k++) {
                    int r = rows[k], r1 = 2 * r + 3 < height ? 2 * r + 3 : height;
                    int last_cols = 2 * (j0 + 7) + 3 <= width ? 3 : width - 2 * (j0 + 7);
                    float n = r1 - 2 * r;
                    pcd_f8 size = {3 * n, 3 * n, 3 * n, 3 * n, 3 * n, 3 * n, 3 * n, last_cols * n};
                    pcd_f8 share = *(const pcd_f8u*)(dy + (size_t)r * pooled_w + j0) / size;
                    /* even input 2j: window j - 1 (its third column), then window j; odd input 2j + 1: window j */
                    pcd_f8 before = pcd_splat8(j0 > 0 ? pcd_ave3x3s2_share(dy, height, width, pooled_w, r, j0 - 1)
                                                      : -0.0f);
                    e += __builtin_shufflevector(before, share, 0, 8, 9, 10, 11, 12, 13, 14);
                    e += share;
                    o += share;
                }
                *(pcd_f8u*)(d + w) = __builtin_shufflevector(e, o, 0, 8, 1, 9, 2, 10, 3, 11);
                *(pcd_f8u*)(d + w + 8) = __builtin_shufflevector(e, o, 4, 12, 5, 13, 6, 14, 7, 15);
            }
            for (; w < width; w++) {
                int cols[2], nc = 0;
                if (w % 2 == 0) {
                    if (w >= 2 && w / 2 - 1 < pooled_w) cols[nc++] = w / 2 - 1;
                    if (w / 2 < pooled_w) cols[nc++] = w / 2;
                } else if ((w - 1) / 2 < pooled_w) {
                    cols[nc++] = (w - 1) / 2;
                }
                float total = accumulate ? d[w] : 0.0f;
                for (int k = 0; k < nr; k++)
                    for (int c = 0; c < nc; c++)
                        total += pcd_ave3x3s2_share(dy, height, width, pooled_w, rows[k], cols[c]);
                d[w] = total;
            }
        }
    }

    /* Its backward: every input is in exactly one window, so its diff is that window's where the window chose it
       (Caffe zeroes the diff, then adds each output's at its mask: the same values, with no scatter). 4 outputs
       (8 inputs of a row) at a time. */
    static void pcd_max2x2_backward_plane(const float* dy, const int* mask, float* dx, int width, int pooled_h,
                                          int pooled_w, int accumulate) {
        const pcd_i8 steps = {0, 1, 2, 3, 4, 5, 6, 7};
        for (int h = 0; h < 2 * pooled_h; h++) {
            const float* g = dy + (size_t)(h / 2) * pooled_w;
            const int* m = mask + (size_t)(h / 2) * pooled_w;
            float* d = dx + (size_t)h * width;
            int pw = 0;
            for (; pw + 4 <= pooled_w; pw += 4) {
                pcd_f4 gv = *(const pcd_f4u*)(g + pw);
                pcd_i4 mv = *(const pcd_i4u*)(m + pw);
                pcd_f8 pairs = __builtin_shufflevector(gv, gv, 0, 0, 1, 1, 2, 2, 3, 3);
                pcd_i8 chosen = __builtin_shufflevector(mv, mv, 0, 0, 1, 1, 2, 2, 3, 3) == steps + h * width + 2 * pw;
                pcd_f8 old = *(pcd_f8u*)(d + 2 * pw);
                pcd_f8 keep = accumulate ? old : (pcd_f8){};
                pcd_f8 take = accumulate ? old + pairs : pairs;
                *(pcd_f8u*)(d + 2 * pw) = (pcd_f8)(((pcd_i8)take & chosen) | ((pcd_i8)keep & ~chosen));
            }
            for (int w = 2 * pw; w < 2 * pooled_w; w++) {
                int chosen = m[w / 2] == h * width + w;
                d[w] = accumulate ? (chosen ? d[w] + g[w / 2] : d[w]) : (chosen ? g[w / 2] : 0);
            }
        }
    }
    """
    void pcd_max_window8(const float* buf, int width, int hstart, int hend, int wstart, int wend, float* best,
                         int* arg) noexcept nogil
    void pcd_max2x2_plane(const float* x, int width, int pooled_h, int pooled_w, float* y, int* mask) noexcept nogil
    void pcd_max3x3s2_plane(const float* x, int height, int width, int pooled_h, int pooled_w, float* y,
                            int* mask) noexcept nogil
    void pcd_ave3x3s2_plane(const float* x, int height, int width, int pooled_h, int pooled_w, float* y) noexcept nogil
    void pcd_ave3x3s2_backward_plane(const float* dy, float* dx, int height, int width, int pooled_h, int pooled_w,
                                     int accumulate) noexcept nogil
    void pcd_max2x2_backward_plane(const float* dy, const int* mask, float* dx, int width, int pooled_h, int pooled_w,
                                   int accumulate) noexcept nogil


cdef struct Geometry:
    int height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w


cdef int _geometry(tuple geometry, Py_ssize_t planes_in, Py_ssize_t plane_in, Py_ssize_t planes_out,
                   Py_ssize_t plane_out, Geometry* g) except -1:
    if len(geometry) != 10:
        raise ValueError("geometry is (height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, "
                         "stride_w, pad_h, pad_w), got %r" % (geometry,))
    (g.height, g.width, g.pooled_h, g.pooled_w, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h,
     g.pad_w) = geometry
    if min(geometry) < 0 or g.kernel_h < 1 or g.kernel_w < 1 or g.stride_h < 1 or g.stride_w < 1:
        raise ValueError("bad pooling geometry %r" % (geometry,))
    if planes_in != planes_out or plane_in != <Py_ssize_t>g.height * g.width \
            or plane_out != <Py_ssize_t>g.pooled_h * g.pooled_w:
        raise ValueError("pooling arrays of shapes (%d, %d) -> (%d, %d) do not match the geometry %r"
                         % (planes_in, plane_in, planes_out, plane_out, geometry))
    return 0


cdef inline void _window(int ph, int pw, const Geometry* g, int* hstart, int* hend, int* wstart, int* wend,
                         int* pool_size) noexcept nogil:
    """Caffe's window of output (ph, pw), clipped to the image, and its AVE divisor (clipped to the padding)."""
    hstart[0] = ph * g.stride_h - g.pad_h
    wstart[0] = pw * g.stride_w - g.pad_w
    hend[0] = min(hstart[0] + g.kernel_h, g.height + g.pad_h)
    wend[0] = min(wstart[0] + g.kernel_w, g.width + g.pad_w)
    pool_size[0] = (hend[0] - hstart[0]) * (wend[0] - wstart[0])
    hstart[0] = max(hstart[0], 0)
    wstart[0] = max(wstart[0], 0)
    hend[0] = min(hend[0], g.height)
    wend[0] = min(wend[0], g.width)


cdef inline bint _whole_2x2(const Geometry* g) noexcept nogil:
    """2x2 windows at stride 2, no pad, tiling the plane exactly (pcd_max2x2_plane's case)."""
    return g.kernel_h == 2 and g.kernel_w == 2 and g.stride_h == 2 and g.stride_w == 2 and g.pad_h == 0 and \
        g.pad_w == 0 and g.height == 2 * g.pooled_h and g.width == 2 * g.pooled_w


cdef inline bint _unpadded_3x3_stride2(const Geometry* g) noexcept nogil:
    """3x3 windows at stride 2, no pad, rows of 8 outputs or more (pcd_max3x3s2_plane's, pcd_ave3x3s2_plane's and
    pcd_ave3x3s2_backward_plane's case: narrower rows run faster interleaved, 8 planes side by side)."""
    return g.kernel_h == 3 and g.kernel_w == 3 and g.stride_h == 2 and g.stride_w == 2 and g.pad_h == 0 and \
        g.pad_w == 0 and g.pooled_w >= 8


# --- blocks of planes, interleaved -----------------------------------------------------------------------------

cdef inline int _lanes(Py_ssize_t block, Py_ssize_t planes) noexcept nogil:
    """How many planes block `block` holds (LANES but in the last block)."""
    return <int>min(<Py_ssize_t>LANES, planes - block * LANES)


cdef void _interleave(const real* x, Py_ssize_t size, int lanes, real* buf) noexcept nogil:
    """buf[e * LANES + l] = element e of plane l of x (planes of `size`); lanes past `lanes` are zeros."""
    cdef Py_ssize_t e
    cdef int l
    if lanes == LANES:   # a full block, in the loop order that gcc vectorizes (as 4 x 4 transposes)
        for e in range(size):
            for l in range(LANES):
                buf[e * LANES + l] = x[l * size + e]
        return
    for l in range(LANES):
        for e in range(size):
            buf[e * LANES + l] = x[l * size + e] if l < lanes else 0


cdef void _deinterleave(const real* buf, Py_ssize_t size, int lanes, real* x) noexcept nogil:
    """The inverse of _interleave, for the first `lanes` planes."""
    cdef Py_ssize_t e
    cdef int l
    if lanes == LANES:
        for e in range(size):
            for l in range(LANES):
                x[l * size + e] = buf[e * LANES + l]
        return
    for l in range(lanes):
        for e in range(size):
            x[l * size + e] = buf[e * LANES + l]


cdef object _scratch(const Geometry* g, dtype):
    """Per thread: a block of planes, interleaved."""
    return np.empty((openmp.omp_get_max_threads(), <Py_ssize_t>g.height * g.width * LANES), dtype)


# --- MAX ---------------------------------------------------------------------------------------------------

cdef void _max_block(const real* x, real* buf, real* y, int* mask, int lanes, const Geometry* g) noexcept nogil:
    cdef Py_ssize_t size = <Py_ssize_t>g.height * g.width, out_size = <Py_ssize_t>g.pooled_h * g.pooled_w, o
    cdef int ph, pw, h, w, l, hstart, hend, wstart, wend, pool_size, i, better
    cdef real best[LANES]
    cdef int arg[LANES]
    cdef const real* v
    cdef real a
    _interleave(x, size, lanes, buf)
    for ph in range(g.pooled_h):
        for pw in range(g.pooled_w):
            _window(ph, pw, g, &hstart, &hend, &wstart, &wend, &pool_size)
            if real is float:
                pcd_max_window8(buf, g.width, hstart, hend, wstart, wend, best, arg)
            else:
                # Caffe starts from -FLT_MAX and keeps the first strict maximum in row-major order.
                for l in range(LANES):
                    best[l] = -FLT_MAX
                    arg[l] = -1
                for h in range(hstart, hend):
                    for w in range(wstart, wend):
                        i = h * g.width + w
                        v = buf + <Py_ssize_t>i * LANES
                        for l in range(LANES):
                            a = v[l]
                            better = a > best[l]
                            arg[l] ^= (arg[l] ^ i) & -better   # a select, not a branch (random data mispredicts)
                            best[l] = a if better else best[l]
            o = ph * g.pooled_w + pw
            for l in range(lanes):
                y[l * out_size + o] = best[l]
                mask[l * out_size + o] = arg[l]


def max_forward(const real[:, ::1] x, real[:, ::1] y, int[:, ::1] mask, tuple geometry):
    """y = the maximum of each window; mask = its position (the first one in row-major order on ties)."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], y.shape[0], y.shape[1], &g)
    if mask.shape[0] != y.shape[0] or mask.shape[1] != y.shape[1]:
        raise ValueError("max_forward: the mask must be shaped like the output")
    cdef Py_ssize_t b, planes = y.shape[0]
    if planes == 0 or y.shape[1] == 0:
        return
    if real is float and _whole_2x2(&g):
        with nogil:
            for b in prange(planes, schedule="static"):
                pcd_max2x2_plane(&x[b, 0], g.width, g.pooled_h, g.pooled_w, &y[b, 0], &mask[b, 0])
        return
    if real is float and _unpadded_3x3_stride2(&g):
        with nogil:
            for b in prange(planes, schedule="static"):
                pcd_max3x3s2_plane(&x[b, 0], g.height, g.width, g.pooled_h, g.pooled_w, &y[b, 0], &mask[b, 0])
        return
    cdef real[:, ::1] scratch = _scratch(&g, np.asarray(y).dtype)
    with nogil:
        for b in prange((planes + LANES - 1) // LANES, schedule="static"):
            _max_block(&x[b * LANES, 0], &scratch[threadid(), 0], &y[b * LANES, 0], &mask[b * LANES, 0],
                       _lanes(b, planes), &g)


cdef void _scatter_plane(const real* dy, const int* mask, real* dx, Py_ssize_t n_out, Py_ssize_t n_in,
                         bint accumulate) noexcept nogil:
    cdef Py_ssize_t i
    cdef int j
    if not accumulate:
        for i in range(n_in):
            dx[i] = 0
    for i in range(n_out):
        j = mask[i]
        if 0 <= j < n_in:   # -1: the window chose nothing (all -FLT_MAX or NaN); Caffe would write out of bounds
            dx[j] += dy[i]


def mask_backward(const real[:, ::1] dy, const int[:, ::1] mask, real[:, ::1] dx, bint accumulate=False,
                  tuple geometry=None):
    """dx[mask[i]] += dy[i] plane by plane (MAX and STOCHASTIC TRAIN); dx is zeroed first unless accumulate.
    With the forward's `geometry` (optional), whole 2x2 stride-2 windows take a faster path."""
    if mask.shape[0] != dy.shape[0] or mask.shape[1] != dy.shape[1] or dx.shape[0] != dy.shape[0]:
        raise ValueError("mask_backward: shapes %r, mask %r, input %r do not match"
                         % (tuple(dy.shape)[:2], tuple(mask.shape)[:2], tuple(dx.shape)[:2]))
    cdef Py_ssize_t p
    cdef Geometry g
    if dx.shape[1] == 0:
        return
    if geometry is not None:
        _geometry(geometry, dx.shape[0], dx.shape[1], dy.shape[0], dy.shape[1], &g)
        if real is float and _whole_2x2(&g):
            with nogil:
                for p in prange(dx.shape[0], schedule="static"):
                    pcd_max2x2_backward_plane(&dy[p, 0], &mask[p, 0], &dx[p, 0], g.width, g.pooled_h, g.pooled_w,
                                              accumulate)
            return
    with nogil:
        for p in prange(dx.shape[0], schedule="static"):
            _scatter_plane(&dy[p, 0], &mask[p, 0], &dx[p, 0], dy.shape[1], dx.shape[1], accumulate)


# --- AVE ---------------------------------------------------------------------------------------------------

cdef void _ave_block(const real* x, real* buf, real* y, int lanes, const Geometry* g) noexcept nogil:
    cdef Py_ssize_t size = <Py_ssize_t>g.height * g.width, out_size = <Py_ssize_t>g.pooled_h * g.pooled_w, o
    cdef int ph, pw, h, w, l, hstart, hend, wstart, wend, pool_size
    cdef real total[LANES]
    cdef const real* v
    _interleave(x, size, lanes, buf)
    for ph in range(g.pooled_h):
        for pw in range(g.pooled_w):
            _window(ph, pw, g, &hstart, &hend, &wstart, &wend, &pool_size)
            for l in range(LANES):
                total[l] = 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    v = buf + (<Py_ssize_t>h * g.width + w) * LANES
                    for l in range(LANES):
                        total[l] = total[l] + v[l]
            o = ph * g.pooled_w + pw
            for l in range(lanes):
                y[l * out_size + o] = total[l] / pool_size


def ave_forward(const real[:, ::1] x, real[:, ::1] y, tuple geometry):
    """y = the sum of each window / its size within the padded image (padding counts as zeros)."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], y.shape[0], y.shape[1], &g)
    cdef Py_ssize_t b, planes = y.shape[0]
    if planes == 0 or y.shape[1] == 0:
        return
    if real is float and _unpadded_3x3_stride2(&g):
        with nogil:
            for b in prange(planes, schedule="static"):
                pcd_ave3x3s2_plane(&x[b, 0], g.height, g.width, g.pooled_h, g.pooled_w, &y[b, 0])
        return
    cdef real[:, ::1] scratch = _scratch(&g, np.asarray(y).dtype)
    with nogil:
        for b in prange((planes + LANES - 1) // LANES, schedule="static"):
            _ave_block(&x[b * LANES, 0], &scratch[threadid(), 0], &y[b * LANES, 0], _lanes(b, planes), &g)


cdef void _ave_backward_block(const real* dy, real* dx, real* buf, int lanes, const Geometry* g,
                              bint accumulate) noexcept nogil:
    # Caffe adds each window's share to its inputs, window after window; so do we, LANES planes at a time.
    cdef Py_ssize_t size = <Py_ssize_t>g.height * g.width, out_size = <Py_ssize_t>g.pooled_h * g.pooled_w, o, e
    cdef int ph, pw, h, w, l, hstart, hend, wstart, wend, pool_size
    cdef real share[LANES]
    cdef real* d
    if accumulate:
        _interleave(dx, size, lanes, buf)
    else:
        for e in range(size * LANES):
            buf[e] = 0
    for ph in range(g.pooled_h):
        for pw in range(g.pooled_w):
            _window(ph, pw, g, &hstart, &hend, &wstart, &wend, &pool_size)
            o = ph * g.pooled_w + pw
            for l in range(LANES):
                share[l] = dy[l * out_size + o] / pool_size if l < lanes else 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    d = buf + (<Py_ssize_t>h * g.width + w) * LANES
                    for l in range(LANES):
                        d[l] += share[l]
    _deinterleave(buf, size, lanes, dx)


def ave_backward(const real[:, ::1] dy, real[:, ::1] dx, tuple geometry, bint accumulate=False):
    """dx += each window's dy / its size, spread over the window; dx is zeroed first unless accumulate."""
    cdef Geometry g
    _geometry(geometry, dx.shape[0], dx.shape[1], dy.shape[0], dy.shape[1], &g)
    cdef Py_ssize_t b, planes = dx.shape[0]
    if planes == 0 or dx.shape[1] == 0:
        return
    if real is float and _unpadded_3x3_stride2(&g):
        with nogil:
            for b in prange(planes, schedule="static"):
                pcd_ave3x3s2_backward_plane(&dy[b, 0], &dx[b, 0], g.height, g.width, g.pooled_h, g.pooled_w,
                                            accumulate)
        return
    cdef real[:, ::1] scratch = _scratch(&g, np.asarray(dx).dtype)
    with nogil:
        for b in prange((planes + LANES - 1) // LANES, schedule="static"):
            _ave_backward_block(&dy[b * LANES, 0], &dx[b * LANES, 0], &scratch[threadid(), 0], _lanes(b, planes),
                                &g, accumulate)


# --- STOCHASTIC --------------------------------------------------------------------------------------------

cdef void _stochastic_plane(const real* x, const real* u, real* y, int* mask, const Geometry* g) noexcept nogil:
    cdef int ph, pw, h, w, hstart, hend, wstart, wend, o
    cdef real total, threshold
    for ph in range(g.pooled_h):
        hstart = ph * g.stride_h
        hend = min(hstart + g.kernel_h, g.height)
        for pw in range(g.pooled_w):
            wstart = pw * g.stride_w
            wend = min(wstart + g.kernel_w, g.width)
            o = ph * g.pooled_w + pw
            total = 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    total = total + x[h * g.width + w]
            threshold = u[o] * total
            # Caffe's StoPoolForwardTrain: the first position whose running sum reaches u * sum. None does only
            # with negative inputs or an empty window; Caffe then leaves the output unset, we output 0.
            y[o] = 0
            mask[o] = -1
            total = 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    total = total + x[h * g.width + w]
                    if total >= threshold:
                        y[o] = x[h * g.width + w]
                        mask[o] = h * g.width + w
                        break
                if mask[o] >= 0:
                    break


def stochastic_forward(const real[:, ::1] x, const real[:, ::1] uniform, real[:, ::1] y, int[:, ::1] mask,
                       tuple geometry):
    """TRAIN: each window outputs one of its inputs, drawn with probability proportional to it (inputs are
    meant to be nonnegative) by `uniform` (one draw in [0, 1] per output); mask = the drawn position."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], y.shape[0], y.shape[1], &g)
    if mask.shape[0] != y.shape[0] or mask.shape[1] != y.shape[1] or uniform.shape[0] != y.shape[0] \
            or uniform.shape[1] != y.shape[1]:
        raise ValueError("stochastic_forward: the draws and the mask must be shaped like the output")
    cdef Py_ssize_t p
    if y.shape[1] == 0:
        return
    with nogil:
        for p in prange(y.shape[0], schedule="static"):
            _stochastic_plane(&x[p, 0], &uniform[p, 0], &y[p, 0], &mask[p, 0], &g)


cdef void _stochastic_test_plane(const real* x, real* y, const real* dy, real* dx, const Geometry* g,
                                 bint backward, bint accumulate) noexcept nogil:
    cdef int ph, pw, h, w, hstart, hend, wstart, wend, i, o
    cdef real total, squares, v, out, scale
    if backward and not accumulate:
        for i in range(g.height * g.width):
            dx[i] = 0
    for ph in range(g.pooled_h):
        hstart = ph * g.stride_h
        hend = min(hstart + g.kernel_h, g.height)
        for pw in range(g.pooled_w):
            wstart = pw * g.stride_w
            wend = min(wstart + g.kernel_w, g.width)
            o = ph * g.pooled_w + pw
            # Caffe's StoPoolForwardTest starts the sum at FLT_MIN, so that an all-zero window gives 0.
            total = FLT_MIN
            squares = 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    v = x[h * g.width + w]
                    total = total + v
                    squares = squares + v * v
            out = squares / total
            if not backward:
                y[o] = out
                continue
            # d(sum x^2 / sum x)/dx_i = (2 x_i - out) / sum x
            scale = dy[o] / total
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    i = h * g.width + w
                    dx[i] += scale * (2 * x[i] - out)


def stochastic_forward_test(const real[:, ::1] x, real[:, ::1] y, tuple geometry):
    """TEST: each window outputs its inputs weighted by themselves, sum(x^2) / sum(x)."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], y.shape[0], y.shape[1], &g)
    cdef Py_ssize_t p
    if y.shape[1] == 0:
        return
    with nogil:
        for p in prange(y.shape[0], schedule="static"):
            _stochastic_test_plane(&x[p, 0], &y[p, 0], NULL, NULL, &g, False, False)


def stochastic_test_backward(const real[:, ::1] x, const real[:, ::1] dy, real[:, ::1] dx, tuple geometry,
                             bint accumulate=False):
    """The exact gradient of stochastic_forward_test (Caffe's GPU backward reuses stale TRAIN draws instead)."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], dy.shape[0], dy.shape[1], &g)
    if dx.shape[0] != x.shape[0] or dx.shape[1] != x.shape[1]:
        raise ValueError("stochastic_test_backward: the input diff must be shaped like the input")
    cdef Py_ssize_t p
    if dx.shape[1] == 0:
        return
    with nogil:
        for p in prange(dx.shape[0], schedule="static"):
            _stochastic_test_plane(&x[p, 0], NULL, &dy[p, 0], &dx[p, 0], &g, True, accumulate)
