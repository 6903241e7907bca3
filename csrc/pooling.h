/* The float32 fast paths of csrc/pooling.pyx, in C with GCC / Clang generic vectors (vector_size): Caffe's MAX
   loop over one window of 8 interleaved planes (the general MAX path, pooling.pyx's _max_block), and whole planes
   for the common geometries: 2x2 windows at stride 2 (LeNet's and VGG's MAX, forward and backward) and 3x3 at
   stride 2 without padding (CIFAR-10's, CaffeNet's and GoogLeNet's MAX and AVE forward, and AVE backward).

   Each lane takes its inputs, and each input diff its terms, in Caffe's order and with Caffe's test, so the
   results are Caffe's bit for bit (pooling.pyx's docstring says how). Kept as a header, declared to Cython in
   pooling.pyx, so that it reads, diffs and compiles as the C it is; built with the module's flags (setup.py). */
#ifndef PCD_POOLING_H
#define PCD_POOLING_H
#include <stddef.h>
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
#endif
