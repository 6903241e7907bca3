/* sgemm.h's AVX2/FMA micro-kernel: tiles of 6 rows x 16 columns (12 accumulators of 8 floats in the 16 ymm
   registers, 2 loads of B and 6 broadcasts of A a step), the packing of B into 16-column slivers and the stores
   of a tile into C; then sgemm_blocked.h makes the blocked GEMM around them (pcd_sgemm_avx2). Included by sgemm.h
   alone, where the compiler targets AVX2 and FMA. */
#ifndef PCD_SGEMM_AVX2_H
#define PCD_SGEMM_AVX2_H

#define PCD_ISA avx2
#define PCD_MR 6
#define PCD_NR 16
#define PCD_MC 144
#define PCD_NC 2048

/* How many of the n (<= NR) table entries from t are consecutive offsets: NR, NR / 2 (two runs of NR / 2) or 0. */
static inline int pcd_store_kind_avx2(const ptrdiff_t* t, int n) {
    int j, first_half = n >= PCD_NR / 2;
    for (j = 1; j < PCD_NR / 2 && first_half; j++) first_half = t[j] == t[0] + j;
    if (!first_half) return 0;
    if (n < PCD_NR) return 0;
    for (j = PCD_NR / 2 + 1; j < PCD_NR; j++)
        if (t[j] != t[PCD_NR / 2] + j - PCD_NR / 2) return 0;
    return t[PCD_NR / 2] == t[0] + PCD_NR / 2 ? PCD_NR : PCD_NR / 2;
}

/* B[0:kc, 0:nc] into slivers of NR columns: dst[(j / NR) * NR * kc + p * NR + j % NR], zero past nc. */
static void pcd_pack_b_avx2(int kc, int nc, pcd_operand b, float* dst) {
    for (int j0 = 0; j0 < nc; j0 += PCD_NR, dst += PCD_NR * kc) {
        int w = nc - j0 < PCD_NR ? nc - j0 : PCD_NR;
        const ptrdiff_t* col = b.col + j0;
        int kind = pcd_store_kind_avx2(col, w);
        if (kind) {
            /* one run of 16 or two of 8, as two 8-float vectors (gcc's memcpy moved 16 bytes at a time) */
            const ptrdiff_t lo = col[0], hi = col[PCD_NR / 2];
            for (int p = 0; p < kc; p++) {
                const float* src = b.base + b.row[p];
                __m256 v0 = _mm256_loadu_ps(src + lo), v1 = _mm256_loadu_ps(src + hi);
                _mm256_store_ps(dst + p * PCD_NR, v0);
                _mm256_store_ps(dst + p * PCD_NR + 8, v1);
            }
        } else {
            /* scattered columns (a transposed or im2col B: dW = y col^T): where 8 rows are consecutive in
               memory, each column gives 8 values at once, and 8 x 8 transposes lay them out */
            int p = 0;
            while (p < kc) {
                if (p + 8 <= kc && pcd_consecutive8(b.row + p)) {
                    for (int half = 0; half < 2; half++) {
                        __m256 v[8];
                        for (int q = 0; q < 8; q++)
                            v[q] = half * 8 + q < w ? _mm256_loadu_ps(b.base + b.row[p] + col[half * 8 + q])
                                                    : _mm256_setzero_ps();
                        pcd_transpose8(v);
                        for (int i = 0; i < 8; i++) _mm256_store_ps(dst + (p + i) * PCD_NR + half * 8, v[i]);
                    }
                    p += 8;
                } else {
                    const float* src = b.base + b.row[p];
                    for (int q = 0; q < PCD_NR; q++) dst[p * PCD_NR + q] = q < w ? src[col[q]] : 0;
                    p++;
                }
            }
        }
    }
}

/* One C row of a tile from its two accumulators (see pcd_tile). */
static inline void pcd_store_row_avx2(pcd_result c, int i, const ptrdiff_t* col, int n, int kind, int add, int bias,
                                 __m256 v0, __m256 v1) {
    float* row = c.base + c.row[i];
    float b = bias ? c.row_bias[i] : 0.0f;
    if (kind) {
        float* lo = row + col[0];
        float* hi = row + col[PCD_NR / 2];
        if (add) {
            v0 = _mm256_add_ps(_mm256_loadu_ps(lo), v0);
            v1 = _mm256_add_ps(_mm256_loadu_ps(hi), v1);
        }
        if (bias) {
            v0 = _mm256_add_ps(v0, _mm256_set1_ps(b));
            v1 = _mm256_add_ps(v1, _mm256_set1_ps(b));
        }
        _mm256_storeu_ps(lo, v0);
        _mm256_storeu_ps(hi, v1);
    } else {
        float tile[PCD_NR] __attribute__((aligned(32)));
        _mm256_store_ps(tile, v0);
        _mm256_store_ps(tile + 8, v1);
        for (int j = 0; j < n; j++) {
            float v = add ? row[col[j]] + tile[j] : tile[j];
            row[col[j]] = bias ? v + b : v;
        }
    }
}

/* One tile of `rows` (<= MR) x NR: A sliver (kc) x B sliver (kc), written to C's rows i0.., columns j0.. (n of
   them valid; kind: pcd_run_kind of those columns). first: the first KC block (else C is added to); last: add the
   bias. Inlined with a constant `rows`, so that a sliver of fewer than MR rows (the last ones of m = 20, 50 or
   32) costs FMAs for its rows only. */
static inline __attribute__((always_inline)) void pcd_tile_rows_avx2(const int rows, int kc, const float* a,
                                                                const float* b, pcd_result c, int i0, int j0,
                                                                int n, int kind, int first, int last) {
    /* 12 accumulators, 2 loads and 6 broadcasts per step: kept in registers as named variables (an array of
       them is spilled by gcc) */
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
           c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    #pragma GCC unroll 4
    for (int p = 0; p < kc; p++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), t;
        t = _mm256_broadcast_ss(a + 0); c00 = _mm256_fmadd_ps(t, b0, c00); c01 = _mm256_fmadd_ps(t, b1, c01);
        if (rows > 1) {
            t = _mm256_broadcast_ss(a + 1); c10 = _mm256_fmadd_ps(t, b0, c10); c11 = _mm256_fmadd_ps(t, b1, c11);
        }
        if (rows > 2) {
            t = _mm256_broadcast_ss(a + 2); c20 = _mm256_fmadd_ps(t, b0, c20); c21 = _mm256_fmadd_ps(t, b1, c21);
        }
        if (rows > 3) {
            t = _mm256_broadcast_ss(a + 3); c30 = _mm256_fmadd_ps(t, b0, c30); c31 = _mm256_fmadd_ps(t, b1, c31);
        }
        if (rows > 4) {
            t = _mm256_broadcast_ss(a + 4); c40 = _mm256_fmadd_ps(t, b0, c40); c41 = _mm256_fmadd_ps(t, b1, c41);
        }
        if (rows > 5) {
            t = _mm256_broadcast_ss(a + 5); c50 = _mm256_fmadd_ps(t, b0, c50); c51 = _mm256_fmadd_ps(t, b1, c51);
        }
        a += PCD_MR;
        b += PCD_NR;
    }
    int add = c.accumulate || !first, bias = last && c.row_bias != NULL;
    const ptrdiff_t* col = c.col + j0;
    pcd_store_row_avx2(c, i0, col, n, kind, add, bias, c00, c01);
    if (rows > 1) pcd_store_row_avx2(c, i0 + 1, col, n, kind, add, bias, c10, c11);
    if (rows > 2) pcd_store_row_avx2(c, i0 + 2, col, n, kind, add, bias, c20, c21);
    if (rows > 3) pcd_store_row_avx2(c, i0 + 3, col, n, kind, add, bias, c30, c31);
    if (rows > 4) pcd_store_row_avx2(c, i0 + 4, col, n, kind, add, bias, c40, c41);
    if (rows > 5) pcd_store_row_avx2(c, i0 + 5, col, n, kind, add, bias, c50, c51);
}

/* c by address: a 40-byte struct passed by value was copied to the stack at every call, and the copy's loads
   stalled on the stores just made (store-to-load forwarding fails across their sizes): 4 % of a GEMM's time. */
static __attribute__((noinline)) void pcd_tile_few_avx2(int kc, const float* a, const float* b, const pcd_result* c,
                                                   int i0, int j0, int m, int n, int kind, int first, int last) {
    switch (m) {
    case 1: pcd_tile_rows_avx2(1, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    case 2: pcd_tile_rows_avx2(2, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    case 3: pcd_tile_rows_avx2(3, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    case 4: pcd_tile_rows_avx2(4, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    default: pcd_tile_rows_avx2(5, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    }
}

/* A tile of m (1..MR) rows: full tiles inline, the last slivers' fewer rows through a specialised copy. */
static inline __attribute__((always_inline)) void pcd_tile_avx2(int kc, const float* a, const float* b,
                                                           const pcd_result* c, int i0, int j0, int m, int n,
                                                           int kind, int first, int last) {
    if (m >= PCD_MR) {
        pcd_tile_rows_avx2(PCD_MR, kc, a, b, *c, i0, j0, n, kind, first, last);
        return;
    }
    pcd_tile_few_avx2(kc, a, b, c, i0, j0, m, n, kind, first, last);
}

#include "sgemm_blocked.h"
#endif
