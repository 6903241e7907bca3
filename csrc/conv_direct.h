/* Convolutions with few weight columns per output (LeNet's conv1: 25; CIFAR-10 quick's conv1: 75) summed
   straight from the images, without GEMM packing: a GEMM would pack its operands for every block and use each
   packed value only a few dozen times, so that the packing costs as much as the multiplies.

   Weight gradient (pcd_dw_direct):
   dW[m][t] += sum over images n, output rows r, output columns x of
               y[n * y_image + m * y_channel + r * ow + x] * im[n * im_image + r * im_row + tap[t] + x]

   where tap[t] is the offset of weight column t (channel, kh, kw) in a (padded) image and im_row the offset of
   one output row's window (stride_h * padded width). Output columns must be consecutive image columns (stride 1
   along the width): the sums then run 8 positions at a time with plain vector loads of both operands, in blocks
   of 4 weight rows x 3 weight columns held in 12 registers. A GEMM would pack both operands for every 256
   positions and use each packed value only 20 or 25 times.

   Forward (pcd_forward_direct): y[n][m][r * ow + x] = bias[m] + sum over t of W[m][t] * im[n * im_image +
   r * im_row + tap[t] + x], 8 output columns at a time, in blocks of 4 outputs x 3 vectors (see
   pcd_forward_direct for how the vectors are grouped).

   On the AVX-512 path (pcd_simd, sgemm.h) maps with rows of 16 outputs or more take conv_direct_avx512.h's
   16-float sums instead. Only built with AVX2 and FMA (PCD_SGEMM, see sgemm.h). */
#ifndef PCD_CONV_DIRECT_H
#define PCD_CONV_DIRECT_H
#include <stdlib.h>
#include "sgemm.h"

#if PCD_SGEMM

typedef struct {
    const float* y;         /* output diff of weight row 0, image 0 */
    const float* im;        /* (padded) image 0 */
    const ptrdiff_t* tap;   /* offset of weight column t in an image */
    ptrdiff_t y_image, y_channel, im_image, im_row;
    int images, rows, cols; /* images; output rows and columns of one image */
} pcd_dw_sums;

static inline float pcd_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Weight rows m0..m0+mb, columns t0..t0+tb (mb <= 4, tb <= 3; constants after inlining) into dw (row stride
   dw_row). */
static inline __attribute__((always_inline)) void pcd_dw_block(const int mb, const int tb, const pcd_dw_sums* s,
                                                               int m0, int t0, float* dw, ptrdiff_t dw_row) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00, a20 = a00,
           a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    const ptrdiff_t t_0 = s->tap[t0], t_1 = tb > 1 ? s->tap[t0 + 1] : 0, t_2 = tb > 2 ? s->tap[t0 + 2] : 0;
    const int full = s->cols / 8 * 8, rest = s->cols - full;
    /* each loaded vector is used by 3 or 4 FMAs: without this, gcc folds its load into each of them (it did so
       for the image vectors, 16 loads for 12 FMAs), and the loads (not the multiplies) then bound the loop */
#define PCD_IN_REGISTER(v) __asm__("" : "+x"(v))
    for (int n = 0; n < s->images; n++) {
        const float* yn = s->y + n * s->y_image + m0 * s->y_channel;
        const float* xn = s->im + n * s->im_image;
        for (int r = 0; r < s->rows; r++) {
            const float* yr = yn + (ptrdiff_t)r * s->cols;
            const float* xr = xn + r * s->im_row;
            /* 12 accumulators, 3 image vectors and one of y: the 16 registers (the tail's mask lives outside) */
            /* weight row i's output-diff vector against the 3 image vectors */
#define PCD_DW_ROW(LOAD, i, c0, c1, c2)                                                                         \
                if (mb > i) {                                                                                   \
                    __m256 d = LOAD(yr + i * s->y_channel + x);                                                 \
                    PCD_IN_REGISTER(d);                                                                         \
                    c0 = _mm256_fmadd_ps(d, x0, c0);                                                            \
                    if (tb > 1) c1 = _mm256_fmadd_ps(d, x1, c1);                                                \
                    if (tb > 2) c2 = _mm256_fmadd_ps(d, x2, c2);                                                \
                }
#define PCD_DW_STEP(LOAD)                                                                                       \
            {                                                                                                   \
                __m256 x0 = LOAD(xr + t_0 + x), x1 = _mm256_setzero_ps(), x2 = x1;                              \
                if (tb > 1) x1 = LOAD(xr + t_1 + x);                                                            \
                if (tb > 2) x2 = LOAD(xr + t_2 + x);                                                            \
                PCD_IN_REGISTER(x0); PCD_IN_REGISTER(x1); PCD_IN_REGISTER(x2);                                  \
                PCD_DW_ROW(LOAD, 0, a00, a01, a02)                                                              \
                PCD_DW_ROW(LOAD, 1, a10, a11, a12)                                                              \
                PCD_DW_ROW(LOAD, 2, a20, a21, a22)                                                              \
                PCD_DW_ROW(LOAD, 3, a30, a31, a32)                                                              \
            }
            int x = 0;
            for (; x < full; x += 8)
                PCD_DW_STEP(_mm256_loadu_ps)
            if (rest) {
                /* the last, partial vector of a row, loaded under a mask: past the row there may be the end of
                   the buffer, or values that are not finite */
                const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(rest),
                                                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#define PCD_DW_MASKED(p) _mm256_maskload_ps((p), tail)
                PCD_DW_STEP(PCD_DW_MASKED)
#undef PCD_DW_MASKED
            }
#undef PCD_DW_STEP
#undef PCD_DW_ROW
#undef PCD_IN_REGISTER
        }
    }
    float* out = dw + m0 * dw_row + t0;
    out[0] += pcd_hsum(a00);
    if (tb > 1) out[1] += pcd_hsum(a01);
    if (tb > 2) out[2] += pcd_hsum(a02);
    if (mb > 1) {
        out[dw_row] += pcd_hsum(a10);
        if (tb > 1) out[dw_row + 1] += pcd_hsum(a11);
        if (tb > 2) out[dw_row + 2] += pcd_hsum(a12);
    }
    if (mb > 2) {
        out[2 * dw_row] += pcd_hsum(a20);
        if (tb > 1) out[2 * dw_row + 1] += pcd_hsum(a21);
        if (tb > 2) out[2 * dw_row + 2] += pcd_hsum(a22);
    }
    if (mb > 3) {
        out[3 * dw_row] += pcd_hsum(a30);
        if (tb > 1) out[3 * dw_row + 1] += pcd_hsum(a31);
        if (tb > 2) out[3 * dw_row + 2] += pcd_hsum(a32);
    }
}

static __attribute__((noinline)) void pcd_dw_edge(int mb, int tb, const pcd_dw_sums* s, int m0, int t0, float* dw,
                                                  ptrdiff_t dw_row) {
    /* the last rows or columns of dW: one specialised copy per shape */
#define PCD_DW_CASE(M, T) if (mb == M && tb == T) { pcd_dw_block(M, T, s, m0, t0, dw, dw_row); return; }
    PCD_DW_CASE(1, 1) PCD_DW_CASE(1, 2) PCD_DW_CASE(1, 3) PCD_DW_CASE(2, 1) PCD_DW_CASE(2, 2) PCD_DW_CASE(2, 3)
    PCD_DW_CASE(3, 1) PCD_DW_CASE(3, 2) PCD_DW_CASE(3, 3) PCD_DW_CASE(4, 1) PCD_DW_CASE(4, 2)
#undef PCD_DW_CASE
}

/* dw[m * dw_row + t] += the sums above for weight rows [0, m_count) and columns [t_lo, t_hi). */
static void pcd_dw_direct8(const pcd_dw_sums* s, int m_count, int t_lo, int t_hi, float* dw, ptrdiff_t dw_row) {
    for (int m0 = 0; m0 < m_count; m0 += 4)
        for (int t0 = t_lo; t0 < t_hi; t0 += 3) {
            int mb = m_count - m0 < 4 ? m_count - m0 : 4, tb = t_hi - t0 < 3 ? t_hi - t0 : 3;
            if (mb == 4 && tb == 3)
                pcd_dw_block(4, 3, s, m0, t0, dw, dw_row);
            else
                pcd_dw_edge(mb, tb, s, m0, t0, dw, dw_row);
        }
}

typedef struct {
    const float* w;         /* the group's weights, kg per output */
    const float* bias;      /* NULL, or the group's biases */
    const float* im;        /* (padded) image 0 */
    const ptrdiff_t* tap;   /* offset of weight column t in an image */
    float* y;               /* output 0 of the group, image 0 */
    ptrdiff_t y_image, y_channel, im_image, im_row;
    int outputs, kg, rows, cols;
} pcd_forward_sums;

/* Outputs m0..m0+mb (mb <= 4) at nv <= 3 consecutive output vectors yr[0:8 * nv] of one image (the last one
   holding `last` <= 8 columns), whose windows start at src[0..nv) in the image. */
static inline __attribute__((always_inline)) void pcd_forward_block(const int mb, const int nv,
                                                                    const pcd_forward_sums* s,
                                                                    const float* const* src, float* yr, int m0,
                                                                    int last) {
    const float* w = s->w + (ptrdiff_t)m0 * s->kg;
    __m256 a00, a01, a02, a10, a11, a12, a20, a21, a22, a30, a31, a32;
    a00 = a01 = a02 = _mm256_set1_ps(s->bias ? s->bias[m0] : 0.0f);
    a10 = a11 = a12 = _mm256_set1_ps(mb > 1 && s->bias ? s->bias[m0 + 1] : 0.0f);
    a20 = a21 = a22 = _mm256_set1_ps(mb > 2 && s->bias ? s->bias[m0 + 2] : 0.0f);
    a30 = a31 = a32 = _mm256_set1_ps(mb > 3 && s->bias ? s->bias[m0 + 3] : 0.0f);
    /* lanes < last of the last vector: past the row's end there may be the end of the image buffer */
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(last), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int t = 0; t < s->kg; t++) {
        const ptrdiff_t tap = s->tap[t];
#define PCD_FWD_LOAD(q) (nv == q + 1 && last < 8 ? _mm256_maskload_ps(src[q] + tap, tail) \
                                                  : _mm256_loadu_ps(src[q] + tap))
        __m256 x0 = PCD_FWD_LOAD(0), x1 = nv > 1 ? PCD_FWD_LOAD(1) : x0, x2 = nv > 2 ? PCD_FWD_LOAD(2) : x0;
#undef PCD_FWD_LOAD
        /* each image vector feeds 4 FMAs: kept in registers (gcc would fold its load into each of them) */
        __asm__("" : "+x"(x0), "+x"(x1), "+x"(x2));
#define PCD_FWD_ROW(i, c0, c1, c2)                                                                          \
        if (mb > i) {                                                                                       \
            __m256 v = _mm256_broadcast_ss(w + i * s->kg + t);                                              \
            c0 = _mm256_fmadd_ps(v, x0, c0);                                                                \
            if (nv > 1) c1 = _mm256_fmadd_ps(v, x1, c1);                                                    \
            if (nv > 2) c2 = _mm256_fmadd_ps(v, x2, c2);                                                    \
        }
        PCD_FWD_ROW(0, a00, a01, a02)
        PCD_FWD_ROW(1, a10, a11, a12)
        PCD_FWD_ROW(2, a20, a21, a22)
        PCD_FWD_ROW(3, a30, a31, a32)
#undef PCD_FWD_ROW
    }
    __m256 rows[4][3] = {{a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
    for (int i = 0; i < mb; i++) {
        float* out = yr + (ptrdiff_t)(m0 + i) * s->y_channel;
        for (int q = 0; q < nv; q++) {
            if (q == nv - 1 && last < 8) {   /* a partial vector: a masked store is microcoded on AMD */
                float tmp[8] __attribute__((aligned(32)));
                _mm256_store_ps(tmp, rows[i][q]);
                memcpy(out + 8 * q, tmp, (size_t)last * sizeof(float));
            } else {
                _mm256_storeu_ps(out + 8 * q, rows[i][q]);
            }
        }
    }
}

static __attribute__((noinline)) void pcd_forward_edge(int mb, int nv, const pcd_forward_sums* s,
                                                       const float* const* src, float* yr, int m0, int last) {
    /* fewer outputs or vectors: one specialised copy per shape */
#define PCD_FWD_CASE(M, V) if (mb == M && nv == V) { pcd_forward_block(M, V, s, src, yr, m0, last); return; }
    PCD_FWD_CASE(1, 1) PCD_FWD_CASE(1, 2) PCD_FWD_CASE(1, 3) PCD_FWD_CASE(2, 1) PCD_FWD_CASE(2, 2)
    PCD_FWD_CASE(2, 3) PCD_FWD_CASE(3, 1) PCD_FWD_CASE(3, 2) PCD_FWD_CASE(3, 3) PCD_FWD_CASE(4, 1)
    PCD_FWD_CASE(4, 2)
#undef PCD_FWD_CASE
}

/* Outputs m0..m0+mb of nv vectors at yr, windows at src. */
static inline void pcd_forward_vectors(const pcd_forward_sums* s, const float* const* src, float* yr, int nv,
                                       int last, int m0, int mb) {
    if (mb == 4 && nv == 3)
        pcd_forward_block(4, 3, s, src, yr, m0, last);
    else
        pcd_forward_edge(mb, nv, s, src, yr, m0, last);
}

/* Every output of images [0, images): y overwritten. Rows of whole vectors (cols % 8 == 0) are taken 3 vectors
   at a time across row ends (CIFAR's 32 columns: no block of 1 vector, which would load as much as it
   multiplies); other rows 3 vectors at a time within the row, the last one partial. */
static void pcd_forward_direct8(const pcd_forward_sums* s, int images) {
    const float* src[3];
    for (int n = 0; n < images; n++) {
        const float* im = s->im + n * s->im_image;
        float* y = s->y + n * s->y_image;
        /* 4 outputs at a time over the whole image: their 4 rows of y are written in order (all outputs at one
           position would touch every output plane, 4 KB apart for CIFAR's 32 x 32 maps: one L1 set) */
        for (int m0 = 0; m0 < s->outputs; m0 += 4) {
            int mb = s->outputs - m0 < 4 ? s->outputs - m0 : 4;
            if (s->cols % 8 == 0) {
                int per_row = s->cols / 8, total = s->rows * per_row;
                for (int q0 = 0; q0 < total; q0 += 3) {
                    int nv = total - q0 < 3 ? total - q0 : 3;
                    for (int v = 0; v < nv; v++)
                        src[v] = im + (q0 + v) / per_row * s->im_row + (q0 + v) % per_row * 8;
                    pcd_forward_vectors(s, src, y + 8 * (ptrdiff_t)q0, nv, 8, m0, mb);
                }
                continue;
            }
            for (int r = 0; r < s->rows; r++)
                for (int x0 = 0; x0 < s->cols; x0 += 24) {
                    int left = s->cols - x0, nv = left >= 24 ? 3 : (left + 7) / 8;
                    int last = left >= 24 ? 8 : left - 8 * (nv - 1);
                    for (int v = 0; v < nv; v++) src[v] = im + r * s->im_row + x0 + 8 * v;
                    pcd_forward_vectors(s, src, y + (ptrdiff_t)r * s->cols + x0, nv, last, m0, mb);
                }
        }
    }
}

#if PCD_SGEMM_AVX512
#include "conv_direct_avx512.h"
#endif

/* dw[m * dw_row + t] += the sums above for weight rows [0, m_count) and columns [t_lo, t_hi). */
static void pcd_dw_direct(const pcd_dw_sums* s, int m_count, int t_lo, int t_hi, float* dw, ptrdiff_t dw_row) {
#if PCD_SGEMM_AVX512
    if (pcd_simd == PCD_SIMD_AVX512 && s->cols >= 16 && pcd_dw_direct16(s, m_count, t_lo, t_hi, dw, dw_row))
        return;
#endif
    pcd_dw_direct8(s, m_count, t_lo, t_hi, dw, dw_row);
}

/* Every output of images [0, images): y overwritten. */
static void pcd_forward_direct(const pcd_forward_sums* s, int images) {
#if PCD_SGEMM_AVX512
    if (pcd_simd == PCD_SIMD_AVX512 && s->cols >= 16 && pcd_forward_direct16(s, images)) return;
#endif
    pcd_forward_direct8(s, images);
}

#else
typedef struct {
    const float* y;
    const float* im;
    const ptrdiff_t* tap;
    ptrdiff_t y_image, y_channel, im_image, im_row;
    int images, rows, cols;
} pcd_dw_sums;
static void pcd_dw_direct(const pcd_dw_sums* s, int m_count, int t_lo, int t_hi, float* dw, ptrdiff_t dw_row) {
    (void)s; (void)m_count; (void)t_lo; (void)t_hi; (void)dw; (void)dw_row;
}
typedef struct {
    const float* w;
    const float* bias;
    const float* im;
    const ptrdiff_t* tap;
    float* y;
    ptrdiff_t y_image, y_channel, im_image, im_row;
    int outputs, kg, rows, cols;
} pcd_forward_sums;
static void pcd_forward_direct(const pcd_forward_sums* s, int images) { (void)s; (void)images; }
#endif
#endif
