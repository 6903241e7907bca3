/* sgemm.h's AVX-512 micro-kernel: tiles of 14 rows x 32 columns, 28 accumulators of 16 floats in 32 zmm
   registers, 2 loads of B and 14 broadcasts of A (folded into the FMAs as {1to16} operands) a step; the packing
   of B into 32-column slivers and the stores of a tile into C; then sgemm_blocked.h makes the blocked GEMM around
   them (pcd_sgemm_avx512). Included by sgemm.h alone, where the compiler targets AVX-512 (F).

   Twice the AVX2 kernel's floats per instruction, on a core that executes 512-bit FMAs whole (Zen 5, Intel's
   server cores): 14 x 32 (rather than 6 x 64 or 8 x 48) because a convolution's C columns are output positions
   whose runs end at the map's row or image end (a 28 x 28 map's 784 positions): 16-column halves with at most
   two runs each are stored by two masked stores, where a 64-column tile would cross far more ends. The sums are
   the AVX2 kernel's, lane for lane (one FMA chain per element of C over the same KC block): results are
   identical on both paths. */
#ifndef PCD_SGEMM_AVX512_H
#define PCD_SGEMM_AVX512_H

#define PCD_ISA avx512
#define PCD_MR 14
#define PCD_NR 32
#define PCD_MC 168
#define PCD_NC 2048

/* Of the v (<= 16) table entries from t: c, where entries [0, c) are consecutive from t[0] and [c, v) from t[c]
   (c = v: one run), or -1 where they are not two runs. */
static inline int pcd_two_runs(const ptrdiff_t* t, int v) {
    int c = 1;
    if (v <= 0) return 0;
    while (c < v && t[c] == t[0] + c) c++;
    for (int j = c + 1; j < v; j++)
        if (t[j] != t[c] + (j - c)) return -1;
    return c;
}

/* The two 16-column halves of n (<= NR) columns, each as two runs (pcd_two_runs), one byte each (0xff: not). */
static inline int pcd_store_kind_avx512(const ptrdiff_t* t, int n) {
    int lo = pcd_two_runs(t, n < 16 ? n : 16), hi = pcd_two_runs(t + 16, n - 16);
    return (lo & 0xff) | (hi & 0xff) << 8;
}

/* A 16-column half as masked accesses: lanes `first` at base + off0 + lane, lanes `second` at base + off1 + lane
   (off1 = t[c] - c: the second run's lane j lies at t[c] + j - c); scattered: its lanes one by one. */
typedef struct {
    __mmask16 first, second;
    ptrdiff_t off0, off1;
    int scattered, valid, whole;   /* whole: one run of 16 */
} pcd_half;

static inline pcd_half pcd_half_of(const ptrdiff_t* t, int v, int code) {
    pcd_half h = {0, 0, 0, 0, 0, v < 0 ? 0 : v > 16 ? 16 : v, 0};
    if (h.valid == 0) return h;
    if (code == 0xff) { h.scattered = 1; return h; }
    h.first = (__mmask16)((1u << code) - 1);
    h.second = (__mmask16)(((1u << h.valid) - 1) & ~((1u << code) - 1));
    h.off0 = t[0];
    h.off1 = h.second ? t[code] - code : 0;
    h.whole = code == 16;
    return h;
}

/* The w (<= NR) column offsets from col as two vectors of 32-bit indices for gathers (0 past w); 0 where an
   offset does not fit 32 bits. */
static inline int pcd_gather_index(const ptrdiff_t* col, int w, __m512i* idx0, __m512i* idx1) {
    int lanes[PCD_NR] __attribute__((aligned(64)));
    for (int q = 0; q < PCD_NR; q++) {
        ptrdiff_t o = q < w ? col[q] : 0;
        if (o > 0x7fffffff || o < -0x7fffffff) return 0;
        lanes[q] = (int)o;
    }
    *idx0 = _mm512_load_si512((const void*)lanes);
    *idx1 = _mm512_load_si512((const void*)(lanes + 16));
    return 1;
}

/* B[0:kc, 0:nc] into slivers of NR columns: dst[(j / NR) * NR * kc + p * NR + j % NR], zero past nc. */
static void pcd_pack_b_avx512(int kc, int nc, pcd_operand b, float* dst) {
    for (int j0 = 0; j0 < nc; j0 += PCD_NR, dst += PCD_NR * kc) {
        int w = nc - j0 < PCD_NR ? nc - j0 : PCD_NR;
        const ptrdiff_t* col = b.col + j0;
        int kind = pcd_store_kind_avx512(col, w);
        pcd_half h0 = pcd_half_of(col, w, kind & 0xff), h1 = pcd_half_of(col + 16, w - 16, kind >> 8 & 0xff);
        if (!h0.scattered && !h1.scattered) {
            /* each half one or two runs (an image's row end, or the next image): two masked loads a half */
            for (int p = 0; p < kc; p++) {
                const float* src = b.base + b.row[p];
                __m512 v0 = _mm512_maskz_loadu_ps(h0.first, src + h0.off0);
                __m512 v1 = _mm512_maskz_loadu_ps(h1.first, src + h1.off0);
                v0 = _mm512_mask_loadu_ps(v0, h0.second, src + h0.off1);
                v1 = _mm512_mask_loadu_ps(v1, h1.second, src + h1.off1);
                _mm512_store_ps(dst + p * PCD_NR, v0);
                _mm512_store_ps(dst + p * PCD_NR + 16, v1);
            }
            continue;
        }
        /* scattered columns (a strided or transposed B: dW = y col^T): where 8 rows are consecutive in memory,
           each column gives 8 values at once, and 8 x 8 transposes lay them out; else each row is gathered,
           16 columns an instruction (a stride-2 convolution's columns, a 7 x 7 map's rows of 7 in a padded row of
           9): one gather instead of 16 loads and 16 stores */
        __m512i idx0 = _mm512_setzero_si512(), idx1 = idx0;
        int gather = pcd_gather_index(col, w, &idx0, &idx1);
        __mmask16 g0 = (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1);
        __mmask16 g1 = (__mmask16)(w >= 32 ? 0xffff : w > 16 ? (1u << (w - 16)) - 1 : 0);
        int p = 0;
        while (p < kc) {
            if (p + 8 <= kc && pcd_consecutive8(b.row + p)) {
                for (int part = 0; part < PCD_NR / 8; part++) {
                    __m256 v[8];
                    for (int q = 0; q < 8; q++)
                        v[q] = part * 8 + q < w ? _mm256_loadu_ps(b.base + b.row[p] + col[part * 8 + q])
                                                : _mm256_setzero_ps();
                    pcd_transpose8(v);
                    for (int i = 0; i < 8; i++) _mm256_store_ps(dst + (p + i) * PCD_NR + part * 8, v[i]);
                }
                p += 8;
            } else if (gather) {
                const float* src = b.base + b.row[p];
                _mm512_store_ps(dst + p * PCD_NR,
                                _mm512_mask_i32gather_ps(_mm512_setzero_ps(), g0, idx0, src, 4));
                _mm512_store_ps(dst + p * PCD_NR + 16,
                                _mm512_mask_i32gather_ps(_mm512_setzero_ps(), g1, idx1, src, 4));
                p++;
            } else {
                const float* src = b.base + b.row[p];
                for (int q = 0; q < PCD_NR; q++) dst[p * PCD_NR + q] = q < w ? src[col[q]] : 0;
                p++;
            }
        }
    }
}

/* One 16-column half of a C row: (C +) v (+ b), C's old value added first as the AVX2 kernel does. */
static inline __attribute__((always_inline)) void pcd_store_half(float* row, const pcd_half* h, const ptrdiff_t* col, __m512 v, int add,
                                  int bias, float b) {
    if (h->valid == 0) return;
    if (h->scattered) {
        float tile[16] __attribute__((aligned(64)));
        _mm512_store_ps(tile, v);
        for (int j = 0; j < h->valid; j++) {
            float x = add ? row[col[j]] + tile[j] : tile[j];
            row[col[j]] = bias ? x + b : x;
        }
        return;
    }
    if (h->whole) {
        /* plain accesses: a masked load that misses the cache (C, a weight gradient of megabytes) held up the
           loads after it; this took twice the AVX2 kernel's time on ResNet-18's last dW */
        if (add) v = _mm512_add_ps(_mm512_loadu_ps(row + h->off0), v);
        if (bias) v = _mm512_add_ps(v, _mm512_set1_ps(b));
        _mm512_storeu_ps(row + h->off0, v);
        return;
    }
    if (add) {
        __m512 old = _mm512_maskz_loadu_ps(h->first, row + h->off0);
        old = _mm512_mask_loadu_ps(old, h->second, row + h->off1);
        v = _mm512_add_ps(old, v);
    }
    if (bias) v = _mm512_add_ps(v, _mm512_set1_ps(b));
    _mm512_mask_storeu_ps(row + h->off0, h->first, v);
    if (h->second) _mm512_mask_storeu_ps(row + h->off1, h->second, v);
}

/* One tile of `rows` (<= MR) x NR: A sliver (kc) x B sliver (kc), written to C's rows i0.., columns j0.. (n of
   them valid; kind: pcd_store_kind_avx512 of those columns). first: the first KC block (else C is added to);
   last: add the bias. Inlined with a constant `rows`: a sliver of fewer rows costs FMAs for its rows only. */
static inline __attribute__((always_inline)) void pcd_tile_rows_avx512(const int rows, int kc, const float* a,
                                                                       const float* b, const pcd_result* c,
                                                                       int i0, int j0, int n, int kind,
                                                                       int first, int last) {
    /* named variables, as in the AVX2 kernel (an array of them is spilled by gcc) */
#define PCD_ACC(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = c##i##0;
    PCD_ACC(0) PCD_ACC(1) PCD_ACC(2) PCD_ACC(3) PCD_ACC(4) PCD_ACC(5) PCD_ACC(6) PCD_ACC(7) PCD_ACC(8) PCD_ACC(9)
    PCD_ACC(10) PCD_ACC(11) PCD_ACC(12) PCD_ACC(13)
#undef PCD_ACC
    #pragma GCC unroll 2
    for (int p = 0; p < kc; p++) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#define PCD_STEP(i)                                                                                             \
        if (rows > i) {                                                                                         \
            __m512 t = _mm512_set1_ps(a[i]);                                                                    \
            c##i##0 = _mm512_fmadd_ps(t, b0, c##i##0);                                                          \
            c##i##1 = _mm512_fmadd_ps(t, b1, c##i##1);                                                          \
        }
        PCD_STEP(0) PCD_STEP(1) PCD_STEP(2) PCD_STEP(3) PCD_STEP(4) PCD_STEP(5) PCD_STEP(6) PCD_STEP(7)
        PCD_STEP(8) PCD_STEP(9) PCD_STEP(10) PCD_STEP(11) PCD_STEP(12) PCD_STEP(13)
#undef PCD_STEP
        a += PCD_MR;
        b += PCD_NR;
    }
    int add = c->accumulate || !first, bias = last && c->row_bias != NULL;
    const ptrdiff_t* col = c->col + j0;
    pcd_half h0 = pcd_half_of(col, n, kind & 0xff), h1 = pcd_half_of(col + 16, n - 16, kind >> 8 & 0xff);
#define PCD_STORE(i)                                                                                            \
    if (rows > i) {                                                                                             \
        float* row = c->base + c->row[i0 + i];                                                                  \
        float bv = bias ? c->row_bias[i0 + i] : 0.0f;                                                           \
        pcd_store_half(row, &h0, col, c##i##0, add, bias, bv);                                                  \
        pcd_store_half(row, &h1, col + 16, c##i##1, add, bias, bv);                                             \
    }
    PCD_STORE(0) PCD_STORE(1) PCD_STORE(2) PCD_STORE(3) PCD_STORE(4) PCD_STORE(5) PCD_STORE(6) PCD_STORE(7)
    PCD_STORE(8) PCD_STORE(9) PCD_STORE(10) PCD_STORE(11) PCD_STORE(12) PCD_STORE(13)
#undef PCD_STORE
}

/* A tile of m (1..MR) rows: one specialised copy per row count (the even sliver plan gives any of them). */
static __attribute__((noinline)) void pcd_tile_avx512(int kc, const float* a, const float* b, const pcd_result* c,
                                                      int i0, int j0, int m, int n, int kind, int first,
                                                      int last) {
    switch (m) {
#define PCD_CASE(r) case r: pcd_tile_rows_avx512(r, kc, a, b, c, i0, j0, n, kind, first, last); break;
    PCD_CASE(1) PCD_CASE(2) PCD_CASE(3) PCD_CASE(4) PCD_CASE(5) PCD_CASE(6) PCD_CASE(7) PCD_CASE(8) PCD_CASE(9)
    PCD_CASE(10) PCD_CASE(11) PCD_CASE(12) PCD_CASE(13)
#undef PCD_CASE
    default: pcd_tile_rows_avx512(14, kc, a, b, c, i0, j0, n, kind, first, last); break;
    }
}

#include "sgemm_blocked.h"
#endif
