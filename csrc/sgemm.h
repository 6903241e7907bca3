/* A float32 GEMM whose operands are addressed through offset tables, so that a convolution's im2col matrix,
   its output in (N, C, P) layout or a transposed matrix is read and written in place: no unrolled column buffer,
   no layout transposes. Element (i, j) of an operand is base[row[i] + col[j]].

   The blocking is BLIS's (Goto's), written once in sgemm_blocked.h: C is computed in MR x NR tiles by a
   register-blocked micro-kernel from packed slivers of A (MR rows) and B (NR columns), KC deep; the packing reads
   through the tables, with whole-vector copies where runs of consecutive columns of B are consecutive in memory,
   and 8 x 8 transposes where 8 consecutive rows are (a transposed operand, such as the columns of dW = y col^T).
   Two micro-kernels: AVX2/FMA (sgemm_avx2.h, 6 x 16) and AVX-512 (sgemm_avx512.h, 14 x 32, where the compiler
   targets AVX-512F: -march=native on such a CPU; setup.py's PCD_SIMD=avx2 builds without it).

   Which one runs is chosen at run time (pcd_simd), the widest built by default: a build on an AVX-512 machine
   holds both, so that its tests check both paths (conv_fused.set_simd), and results are identical on both (the
   same sums in the same order, see sgemm_avx512.h). A packed A (pcd_pack_a_all) belongs to the path that packed
   it: pcd_simd must not change between packing and use (conv_fused.pyx packs and multiplies within one call).

   Only built where the compiler targets AVX2 and FMA (PCD_SGEMM is then 1); elsewhere callers use BLAS. The
   functions that are not inline are marked unused: conv_im2col.pyx includes this header (through fold8.h) for
   PCD_SGEMM alone. */
#ifndef PCD_SGEMM_H
#define PCD_SGEMM_H
#include <stddef.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#define PCD_SGEMM 1
#include <immintrin.h>
#else
#define PCD_SGEMM 0
#endif
#if PCD_SGEMM && defined(__AVX512F__)
#define PCD_SGEMM_AVX512 1
#else
#define PCD_SGEMM_AVX512 0
#endif

/* The depth of a packed block, the same on every path (the sums, and so the results, depend on it). */
#define PCD_KC 256
/* Floats of packing space one pcd_sgemm call needs, on either path (A: MC x KC, B: KC x NC; plus 16 to align it
   to 64 bytes). */
#define PCD_SGEMM_PACK_FLOATS ((size_t)168 * PCD_KC + (size_t)PCD_KC * 2048 + 16)
/* Callers that split C's columns between threads cut at multiples of this (every path's NR divides it). */
#define PCD_NR_ALIGN 32

typedef struct {
    const float* base;
    const ptrdiff_t* row;   /* offset of row i */
    const ptrdiff_t* col;   /* offset of column j */
} pcd_operand;

typedef struct {
    float* base;
    const ptrdiff_t* row;
    const ptrdiff_t* col;
    const float* row_bias;  /* NULL, or added to every element of row i after the sum */
    int accumulate;         /* C += A B (else C = A B) */
} pcd_result;

enum { PCD_SIMD_AVX2 = 0, PCD_SIMD_AVX512 = 1 };

#if PCD_SGEMM

/* The path pcd_sgemm takes, in this module (each extension that includes this header has its own). */
static int pcd_simd __attribute__((unused)) = PCD_SGEMM_AVX512 ? PCD_SIMD_AVX512 : PCD_SIMD_AVX2;

#define PCD_PASTE2(a, b) a##_##b
#define PCD_PASTE(a, b) PCD_PASTE2(a, b)
#define PCD_FN(name) PCD_PASTE(pcd_##name, PCD_ISA)

static inline int pcd_consecutive8(const ptrdiff_t* t) {
    for (int j = 1; j < 8; j++)
        if (t[j] != t[0] + j) return 0;
    return 1;
}

/* Whether every block of 8 table entries from the start (t[0:8], t[8:16], ... within n) is consecutive. */
static inline int pcd_consecutive8_all(const ptrdiff_t* t, int n) {
    for (int p = 0; p + 8 <= n; p += 8)
        if (!pcd_consecutive8(t + p)) return 0;
    return n >= 8;
}

/* v[i][j] <- v[j][i] */
static inline void pcd_transpose8(__m256* v) {
    __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    v[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    v[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    v[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    v[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    v[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    v[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    v[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    v[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The first n (6 or 8, else any up to 8) floats of v to dst. */
static inline void pcd_store_lanes(float* dst, __m256 v, int n) {
    if (n == 8) { _mm256_storeu_ps(dst, v); return; }
    if (n == 6) {   /* 4 + 2 (a masked store is microcoded on AMD) */
        _mm_storeu_ps(dst, _mm256_castps256_ps128(v));
        _mm_storel_pi((__m64*)(dst + 4), _mm256_extractf128_ps(v, 1));
        return;
    }
    float tmp[8] __attribute__((aligned(32)));
    _mm256_store_ps(tmp, v);
    for (int i = 0; i < n; i++) dst[i] = tmp[i];
}

/* How an MC block's rows are cut into slivers (the micro-kernel's tiles; the paths' plans: sgemm_blocked.h). */
typedef struct { int full, tail[3], tails; } pcd_slivers;

#include "sgemm_avx2.h"
#if PCD_SGEMM_AVX512
#include "sgemm_avx512.h"
#endif

/* C (m x n) = A (m x k) B (k x n) (+ C) (+ bias), through the operands' tables, on the pcd_simd path; pack:
   PCD_SGEMM_PACK_FLOATS. a_packed: A as pcd_pack_a_all wrote it (on the same path), or NULL (then `a` is packed
   here). */
static __attribute__((unused)) void pcd_sgemm(int m, int n, int k, pcd_operand a, const float* a_packed,
                                              pcd_operand b, pcd_result c, float* pack) {
    if (k == 0) {   /* an empty sum: C keeps its value (accumulate) or becomes 0, then the bias */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float* e = c.base + c.row[i] + c.col[j];
                *e = (c.accumulate ? *e : 0.0f) + (c.row_bias ? c.row_bias[i] : 0.0f);
            }
        return;
    }
#if PCD_SGEMM_AVX512
    if (pcd_simd == PCD_SIMD_AVX512) { pcd_sgemm_avx512(m, n, k, a, a_packed, b, c, pack); return; }
#endif
    pcd_sgemm_avx2(m, n, k, a, a_packed, b, c, pack);
}

/* The floats pcd_pack_a_all writes for an m x k A on the pcd_simd path. */
static __attribute__((unused)) size_t pcd_packed_a_floats(int m, int k) {
#if PCD_SGEMM_AVX512
    if (pcd_simd == PCD_SIMD_AVX512) return pcd_packed_a_floats_avx512(m, k);
#endif
    return pcd_packed_a_floats_avx2(m, k);
}

/* All of A packed for pcd_sgemm's a_packed (on the pcd_simd path), for an A that several calls share (a
   convolution's weights across the chunks of a batch). */
static __attribute__((unused)) void pcd_pack_a_all(int m, int k, pcd_operand a, float* dst) {
#if PCD_SGEMM_AVX512
    if (pcd_simd == PCD_SIMD_AVX512) { pcd_pack_a_all_avx512(m, k, a, dst); return; }
#endif
    pcd_pack_a_all_avx2(m, k, a, dst);
}

#else   /* no AVX2 / FMA: never called (callers check PCD_SGEMM) */
static int pcd_simd __attribute__((unused)) = PCD_SIMD_AVX2;
static __attribute__((unused)) void pcd_sgemm(int m, int n, int k, pcd_operand a, const float* a_packed,
                                              pcd_operand b, pcd_result c, float* pack) {
    (void)m; (void)n; (void)k; (void)a; (void)a_packed; (void)b; (void)c; (void)pack;
}
static __attribute__((unused)) size_t pcd_packed_a_floats(int m, int k) { (void)m; (void)k; return 0; }
static __attribute__((unused)) void pcd_pack_a_all(int m, int k, pcd_operand a, float* dst) {
    (void)m; (void)k; (void)a; (void)dst;
}
#endif
#endif
