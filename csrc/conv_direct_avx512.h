/* conv_direct.h's sums with 16-float vectors, for maps whose rows hold 16 outputs or more (LeNet's conv1: 24,
   CIFAR-10 quick's: 32), where the compiler targets AVX-512: conv_direct.h's pcd_forward_direct and
   pcd_dw_direct take these on the AVX-512 path (pcd_simd, sgemm.h).

   An image's output positions are taken 16 at a time in order (position r * cols + x), across row ends: y is
   read and written as plain vectors, and a vector's image values, which lie in two rows where it crosses a row
   end, are gathered by two masked loads (pcd_span16), so no lanes are wasted (the AVX2 sums run 24-wide rows
   as 3 vectors of 8; 16-wide vectors within rows would be 16 + 8). Blocks of 8 outputs (or weight rows) x 3
   vectors (or weight columns) hold 24 accumulators of the 32 registers.

   The forward sums each output in the AVX2 order (bias, then the taps in turn): the same results. The weight
   gradient sums 16 lanes, then adds them up: it differs from the AVX2 path's 8 lanes in the last bits. */
#ifndef PCD_CONV_DIRECT_AVX512_H
#define PCD_CONV_DIRECT_AVX512_H

/* 16 consecutive output positions: lanes `first` from im + off0 + lane, lanes `second` (those past the row's
   end) from im + off1 + lane, i.e. the next row's start; first | second: the positions that exist. */
typedef struct {
    ptrdiff_t off0, off1;
    __mmask16 first, second, valid;
} pcd_span16;

/* The spans of an image of rows x cols outputs (cols >= 16: a span crosses at most one row end), whose output
   row r starts at r * im_row in the image; malloc'd, *count of them (NULL where out of memory). */
static pcd_span16* pcd_spans16(int rows, int cols, ptrdiff_t im_row, int* count) {
    int total = rows * cols, spans = (total + 15) / 16;
    pcd_span16* sp = (pcd_span16*)malloc((size_t)(spans > 0 ? spans : 1) * sizeof(pcd_span16));
    if (!sp) return NULL;
    for (int q = 0; q < spans; q++) {
        int p0 = 16 * q, r = p0 / cols, x = p0 % cols;
        int v = total - p0 < 16 ? total - p0 : 16, n0 = cols - x < v ? cols - x : v;
        sp[q].first = (__mmask16)((1u << n0) - 1);
        sp[q].valid = (__mmask16)((1u << v) - 1);
        sp[q].second = (__mmask16)(sp[q].valid & ~sp[q].first);
        sp[q].off0 = (ptrdiff_t)r * im_row + x;
        sp[q].off1 = (ptrdiff_t)(r + 1) * im_row - n0;
    }
    *count = spans;
    return sp;
}

/* The image values of span sp at tap offset `tap` (lanes past the positions: 0). */
static inline __m512 pcd_span_load(const float* im, const pcd_span16* sp, ptrdiff_t tap) {
    __m512 x = _mm512_maskz_loadu_ps(sp->first, im + sp->off0 + tap);
    return _mm512_mask_loadu_ps(x, sp->second, im + sp->off1 + tap);
}

#define PCD_ACC3(i) __m512 a##i##0 = _mm512_setzero_ps(), a##i##1 = a##i##0, a##i##2 = a##i##0;
#define PCD_ACC24 PCD_ACC3(0) PCD_ACC3(1) PCD_ACC3(2) PCD_ACC3(3) PCD_ACC3(4) PCD_ACC3(5) PCD_ACC3(6) PCD_ACC3(7)

/* Outputs m0..m0+mb (mb <= 8) at spans sp[0..nv) (nv <= 3) of image `im`, into y (the image's output 0, at the
   first span's position). */
static inline __attribute__((always_inline)) void pcd_forward_block16(const int mb, const int nv,
                                                                      const pcd_forward_sums* s, const float* im,
                                                                      const pcd_span16* sp, float* y, int m0) {
    PCD_ACC24
#define PCD_BIAS(i) if (mb > i && s->bias) a##i##0 = a##i##1 = a##i##2 = _mm512_set1_ps(s->bias[m0 + i]);
    PCD_BIAS(0) PCD_BIAS(1) PCD_BIAS(2) PCD_BIAS(3) PCD_BIAS(4) PCD_BIAS(5) PCD_BIAS(6) PCD_BIAS(7)
#undef PCD_BIAS
    const float* w = s->w + (ptrdiff_t)m0 * s->kg;
    for (int t = 0; t < s->kg; t++) {
        const ptrdiff_t tap = s->tap[t];
        __m512 x0 = pcd_span_load(im, sp, tap);
        __m512 x1 = nv > 1 ? pcd_span_load(im, sp + 1, tap) : x0;
        __m512 x2 = nv > 2 ? pcd_span_load(im, sp + 2, tap) : x0;
#define PCD_ROW(i)                                                                                              \
        if (mb > i) {                                                                                           \
            __m512 v = _mm512_set1_ps(w[i * s->kg + t]);                                                        \
            a##i##0 = _mm512_fmadd_ps(v, x0, a##i##0);                                                          \
            if (nv > 1) a##i##1 = _mm512_fmadd_ps(v, x1, a##i##1);                                              \
            if (nv > 2) a##i##2 = _mm512_fmadd_ps(v, x2, a##i##2);                                              \
        }
        PCD_ROW(0) PCD_ROW(1) PCD_ROW(2) PCD_ROW(3) PCD_ROW(4) PCD_ROW(5) PCD_ROW(6) PCD_ROW(7)
#undef PCD_ROW
    }
#define PCD_OUT(i)                                                                                              \
    if (mb > i) {                                                                                               \
        float* out = y + (ptrdiff_t)(m0 + i) * s->y_channel;                                                    \
        _mm512_mask_storeu_ps(out, sp[0].valid, a##i##0);                                                       \
        if (nv > 1) _mm512_mask_storeu_ps(out + 16, sp[1].valid, a##i##1);                                      \
        if (nv > 2) _mm512_mask_storeu_ps(out + 32, sp[2].valid, a##i##2);                                      \
    }
    PCD_OUT(0) PCD_OUT(1) PCD_OUT(2) PCD_OUT(3) PCD_OUT(4) PCD_OUT(5) PCD_OUT(6) PCD_OUT(7)
#undef PCD_OUT
}

static __attribute__((noinline)) void pcd_forward_edge16(int mb, int nv, const pcd_forward_sums* s,
                                                         const float* im, const pcd_span16* sp, float* y, int m0) {
    /* fewer outputs or spans: one specialised copy per shape */
#define PCD_CASE(M, V) if (mb == M && nv == V) { pcd_forward_block16(M, V, s, im, sp, y, m0); return; }
#define PCD_CASES(M) PCD_CASE(M, 1) PCD_CASE(M, 2) PCD_CASE(M, 3)
    PCD_CASES(1) PCD_CASES(2) PCD_CASES(3) PCD_CASES(4) PCD_CASES(5) PCD_CASES(6) PCD_CASES(7)
    PCD_CASE(8, 1) PCD_CASE(8, 2)
#undef PCD_CASES
#undef PCD_CASE
}

/* Every output of images [0, images), 8 outputs at a time over the whole image (their rows of y are written in
   order), 3 spans at a time. Returns 0 where out of memory (nothing written). */
static int pcd_forward_direct16(const pcd_forward_sums* s, int images) {
    int spans;
    pcd_span16* sp = pcd_spans16(s->rows, s->cols, s->im_row, &spans);
    if (!sp) return 0;
    for (int n = 0; n < images; n++) {
        const float* im = s->im + n * s->im_image;
        float* y = s->y + n * s->y_image;
        for (int m0 = 0; m0 < s->outputs; m0 += 8) {
            int mb = s->outputs - m0 < 8 ? s->outputs - m0 : 8;
            for (int q0 = 0; q0 < spans; q0 += 3) {
                int nv = spans - q0 < 3 ? spans - q0 : 3;
                if (mb == 8 && nv == 3)
                    pcd_forward_block16(8, 3, s, im, sp + q0, y + 16 * (ptrdiff_t)q0, m0);
                else
                    pcd_forward_edge16(mb, nv, s, im, sp + q0, y + 16 * (ptrdiff_t)q0, m0);
            }
        }
    }
    free(sp);
    return 1;
}

/* Weight rows m0..m0+mb (mb <= 8), columns t0..t0+tb (tb <= 3) into dw (row stride dw_row). */
static inline __attribute__((always_inline)) void pcd_dw_block16(const int mb, const int tb, const pcd_dw_sums* s,
                                                                 const pcd_span16* sp, int spans, int m0, int t0,
                                                                 float* dw, ptrdiff_t dw_row) {
    PCD_ACC24
    const ptrdiff_t t_0 = s->tap[t0], t_1 = tb > 1 ? s->tap[t0 + 1] : 0, t_2 = tb > 2 ? s->tap[t0 + 2] : 0;
    for (int n = 0; n < s->images; n++) {
        const float* yn = s->y + n * s->y_image + m0 * s->y_channel;
        const float* xn = s->im + n * s->im_image;
        for (int q = 0; q < spans; q++) {
            __m512 x0 = pcd_span_load(xn, sp + q, t_0);
            __m512 x1 = tb > 1 ? pcd_span_load(xn, sp + q, t_1) : x0;
            __m512 x2 = tb > 2 ? pcd_span_load(xn, sp + q, t_2) : x0;
#define PCD_ROW(i)                                                                                              \
            if (mb > i) {                                                                                       \
                __m512 d = _mm512_maskz_loadu_ps(sp[q].valid, yn + i * s->y_channel + 16 * (ptrdiff_t)q);       \
                a##i##0 = _mm512_fmadd_ps(d, x0, a##i##0);                                                      \
                if (tb > 1) a##i##1 = _mm512_fmadd_ps(d, x1, a##i##1);                                          \
                if (tb > 2) a##i##2 = _mm512_fmadd_ps(d, x2, a##i##2);                                          \
            }
            PCD_ROW(0) PCD_ROW(1) PCD_ROW(2) PCD_ROW(3) PCD_ROW(4) PCD_ROW(5) PCD_ROW(6) PCD_ROW(7)
#undef PCD_ROW
        }
    }
#define PCD_OUT(i)                                                                                              \
    if (mb > i) {                                                                                               \
        float* out = dw + (ptrdiff_t)(m0 + i) * dw_row + t0;                                                    \
        out[0] += _mm512_reduce_add_ps(a##i##0);                                                                \
        if (tb > 1) out[1] += _mm512_reduce_add_ps(a##i##1);                                                    \
        if (tb > 2) out[2] += _mm512_reduce_add_ps(a##i##2);                                                    \
    }
    PCD_OUT(0) PCD_OUT(1) PCD_OUT(2) PCD_OUT(3) PCD_OUT(4) PCD_OUT(5) PCD_OUT(6) PCD_OUT(7)
#undef PCD_OUT
}

static __attribute__((noinline)) void pcd_dw_edge16(int mb, int tb, const pcd_dw_sums* s, const pcd_span16* sp,
                                                    int spans, int m0, int t0, float* dw, ptrdiff_t dw_row) {
#define PCD_CASE(M, T) if (mb == M && tb == T) { pcd_dw_block16(M, T, s, sp, spans, m0, t0, dw, dw_row); return; }
#define PCD_CASES(M) PCD_CASE(M, 1) PCD_CASE(M, 2) PCD_CASE(M, 3)
    PCD_CASES(1) PCD_CASES(2) PCD_CASES(3) PCD_CASES(4) PCD_CASES(5) PCD_CASES(6) PCD_CASES(7)
    PCD_CASE(8, 1) PCD_CASE(8, 2)
#undef PCD_CASES
#undef PCD_CASE
}

/* dw[m * dw_row + t] += the sums for weight rows [0, m_count) and columns [t_lo, t_hi). Returns 0 where out of
   memory (nothing added). */
static int pcd_dw_direct16(const pcd_dw_sums* s, int m_count, int t_lo, int t_hi, float* dw, ptrdiff_t dw_row) {
    int spans;
    pcd_span16* sp = pcd_spans16(s->rows, s->cols, s->im_row, &spans);
    if (!sp) return 0;
    for (int m0 = 0; m0 < m_count; m0 += 8)
        for (int t0 = t_lo; t0 < t_hi; t0 += 3) {
            int mb = m_count - m0 < 8 ? m_count - m0 : 8, tb = t_hi - t0 < 3 ? t_hi - t0 : 3;
            if (mb == 8 && tb == 3)
                pcd_dw_block16(8, 3, s, sp, spans, m0, t0, dw, dw_row);
            else
                pcd_dw_edge16(mb, tb, s, sp, spans, m0, t0, dw, dw_row);
        }
    free(sp);
    return 1;
}

#undef PCD_ACC24
#undef PCD_ACC3
#endif
