/* A convolution's weight gradient summed straight from the output diff and the images, without GEMM packing,
   for layers whose dW is small (LeNet's conv1: 20 x 25 weights over 36,864 positions per batch).

   dW[m][t] += sum over images n, output rows r, output columns x of
               y[n * y_image + m * y_channel + r * ow + x] * im[n * im_image + r * im_row + tap[t] + x]

   where tap[t] is the offset of weight column t (channel, kh, kw) in a (padded) image and im_row the offset of
   one output row's window (stride_h * padded width). Output columns must be consecutive image columns (stride 1
   along the width): the sums then run 8 positions at a time with plain vector loads of both operands, in blocks
   of 4 weight rows x 3 weight columns held in 12 registers. A GEMM would pack both operands for every 256
   positions and use each packed value only 20 or 25 times: packing costs as much as the multiplies there.

   Only built with AVX2 and FMA (PCD_SGEMM, see sgemm.h). */
#ifndef PCD_CONV_DW_H
#define PCD_CONV_DW_H
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
    /* y's vector is used by 3 FMAs: without this, gcc folds its load into each of them, and the loads (not the
       multiplies) then bound the loop */
#define PCD_IN_REGISTER(v) __asm__("" : "+x"(v))
    for (int n = 0; n < s->images; n++) {
        const float* yn = s->y + n * s->y_image + m0 * s->y_channel;
        const float* xn = s->im + n * s->im_image;
        for (int r = 0; r < s->rows; r++) {
            const float* yr = yn + (ptrdiff_t)r * s->cols;
            const float* xr = xn + r * s->im_row;
            /* 12 accumulators, 3 image vectors and one of y: the 16 registers (the tail's mask lives outside) */
#define PCD_DW_STEP(LOAD)                                                                                       \
            {                                                                                                   \
                __m256 x0 = LOAD(xr + t_0 + x), x1 = _mm256_setzero_ps(), x2 = x1, d;                           \
                if (tb > 1) x1 = LOAD(xr + t_1 + x);                                                            \
                if (tb > 2) x2 = LOAD(xr + t_2 + x);                                                            \
                d = LOAD(yr + x);                                                                               \
                PCD_IN_REGISTER(d);                                                                             \
                a00 = _mm256_fmadd_ps(d, x0, a00);                                                              \
                if (tb > 1) a01 = _mm256_fmadd_ps(d, x1, a01);                                                  \
                if (tb > 2) a02 = _mm256_fmadd_ps(d, x2, a02);                                                  \
                if (mb > 1) {                                                                                   \
                    d = LOAD(yr + s->y_channel + x);                                                            \
                    PCD_IN_REGISTER(d);                                                                         \
                    a10 = _mm256_fmadd_ps(d, x0, a10);                                                          \
                    if (tb > 1) a11 = _mm256_fmadd_ps(d, x1, a11);                                              \
                    if (tb > 2) a12 = _mm256_fmadd_ps(d, x2, a12);                                              \
                }                                                                                               \
                if (mb > 2) {                                                                                   \
                    d = LOAD(yr + 2 * s->y_channel + x);                                                        \
                    PCD_IN_REGISTER(d);                                                                         \
                    a20 = _mm256_fmadd_ps(d, x0, a20);                                                          \
                    if (tb > 1) a21 = _mm256_fmadd_ps(d, x1, a21);                                              \
                    if (tb > 2) a22 = _mm256_fmadd_ps(d, x2, a22);                                              \
                }                                                                                               \
                if (mb > 3) {                                                                                   \
                    d = LOAD(yr + 3 * s->y_channel + x);                                                        \
                    PCD_IN_REGISTER(d);                                                                         \
                    a30 = _mm256_fmadd_ps(d, x0, a30);                                                          \
                    if (tb > 1) a31 = _mm256_fmadd_ps(d, x1, a31);                                              \
                    if (tb > 2) a32 = _mm256_fmadd_ps(d, x2, a32);                                              \
                }                                                                                               \
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
static void pcd_dw_direct(const pcd_dw_sums* s, int m_count, int t_lo, int t_hi, float* dw, ptrdiff_t dw_row) {
    for (int m0 = 0; m0 < m_count; m0 += 4)
        for (int t0 = t_lo; t0 < t_hi; t0 += 3) {
            int mb = m_count - m0 < 4 ? m_count - m0 : 4, tb = t_hi - t0 < 3 ? t_hi - t0 : 3;
            if (mb == 4 && tb == 3)
                pcd_dw_block(4, 3, s, m0, t0, dw, dw_row);
            else
                pcd_dw_edge(mb, tb, s, m0, t0, dw, dw_row);
        }
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
#endif
#endif
