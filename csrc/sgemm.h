/* A float32 GEMM whose operands are addressed through offset tables, so that a convolution's im2col matrix,
   its output in (N, C, P) layout or a transposed matrix is read and written in place: no unrolled column buffer,
   no layout transposes. Element (i, j) of an operand is base[row[i] + col[j]].

   The blocking is BLIS's (Goto's): C is computed in MR x NR tiles by a register-blocked AVX2/FMA micro-kernel
   from packed slivers of A (MR rows) and B (NR columns), KC deep; the packing reads through the tables, with
   whole-vector copies where NR (or NR / 2) consecutive columns of B are consecutive in memory, and 8 x 8
   transposes where 8 consecutive rows are (a transposed operand, such as the columns of dW = y col^T).

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

enum { PCD_MR = 6, PCD_NR = 16, PCD_KC = 256, PCD_MC = 144, PCD_NC = 2048 };

/* Floats of packing space one pcd_sgemm call needs (plus 8 to align it to 32 bytes). */
#define PCD_SGEMM_PACK_FLOATS ((size_t)PCD_MC * PCD_KC + (size_t)PCD_KC * PCD_NC + 8)

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

#if PCD_SGEMM

/* How many of the n (<= NR) table entries from t are consecutive offsets: NR, NR / 2 (two runs of NR / 2) or 0. */
static inline int pcd_run_kind(const ptrdiff_t* t, int n) {
    int j, first_half = n >= PCD_NR / 2;
    for (j = 1; j < PCD_NR / 2 && first_half; j++) first_half = t[j] == t[0] + j;
    if (!first_half) return 0;
    if (n < PCD_NR) return 0;
    for (j = PCD_NR / 2 + 1; j < PCD_NR; j++)
        if (t[j] != t[PCD_NR / 2] + j - PCD_NR / 2) return 0;
    return t[PCD_NR / 2] == t[0] + PCD_NR / 2 ? PCD_NR : PCD_NR / 2;
}

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

/* How an MC block's mc rows are cut into slivers (the micro-kernel's tiles): MR = 6 rows each, except at the end.
   A tile of 2 rows (the last of m = 20, 32, 50 or 500) runs its 4 accumulators back to back, bound by the FMA
   latency (4 cycles on Zen 3) at a full tile's time per step for a third of its work; tiles of 4 or 5 rows
   keep both FMA pipes busy. So a remainder of 1, 2 or 3 rows takes rows from the last full slivers:
   ... 6 | 4 4, ... 6 | 5 4, ... 6 6 | 5 4 4, never more slivers than ceil(mc / 6). */
typedef struct { int full, tail[3], tails; } pcd_slivers;

static inline pcd_slivers pcd_sliver_plan(int mc) {
    pcd_slivers s = {mc / PCD_MR, {0, 0, 0}, 0};
    int r = mc % PCD_MR;
    if (r == 2 && s.full >= 1) { s.full -= 1; s.tail[0] = 4; s.tail[1] = 4; s.tails = 2; }
    else if (r == 3 && s.full >= 1) { s.full -= 1; s.tail[0] = 5; s.tail[1] = 4; s.tails = 2; }
    else if (r == 1 && s.full >= 2) { s.full -= 2; s.tail[0] = 5; s.tail[1] = 4; s.tail[2] = 4; s.tails = 3; }
    else if (r) { s.tail[0] = r; s.tails = 1; }
    return s;
}

/* Sliver q of a plan: its first row (returned) and its rows (*h). */
static inline int pcd_sliver(const pcd_slivers* s, int q, int* h) {
    if (q < s->full) { *h = PCD_MR; return q * PCD_MR; }
    int i0 = s->full * PCD_MR;
    for (int t = 0; t < q - s->full; t++) i0 += s->tail[t];
    *h = s->tail[q - s->full];
    return i0;
}

/* A[0:mc, 0:kc] into slivers (pcd_sliver_plan), each MR values a step (dst[q * MR * kc + p * MR + i] for row i of
   sliver q), zero past the sliver's rows. */
static void pcd_pack_a(int mc, int kc, pcd_operand a, float* dst) {
    pcd_slivers plan = pcd_sliver_plan(mc);
    for (int q = 0; q < plan.full + plan.tails; q++, dst += PCD_MR * kc) {
        int h, i0 = pcd_sliver(&plan, q, &h);
        if (pcd_consecutive8_all(a.col, kc)) {
            /* rows that are consecutive in memory (an output diff y as dW's A): 8 values of each row at once, laid
               out by an 8 x 8 transpose; the last p % 8 one by one */
            int p = 0;
            for (; p + 8 <= kc; p += 8) {
                __m256 v[8];
                for (int i = 0; i < 8; i++)
                    v[i] = i < h ? _mm256_loadu_ps(a.base + a.row[i0 + i] + a.col[p]) : _mm256_setzero_ps();
                pcd_transpose8(v);
                for (int j = 0; j < 8; j++) {   /* 6 of the 8 (a masked store is microcoded on AMD) */
                    _mm_storeu_ps(dst + (p + j) * PCD_MR, _mm256_castps256_ps128(v[j]));
                    _mm_storel_pi((__m64*)(dst + (p + j) * PCD_MR + 4), _mm256_extractf128_ps(v[j], 1));
                }
            }
            for (; p < kc; p++)
                for (int i = 0; i < PCD_MR; i++) dst[p * PCD_MR + i] = i < h ? a.base[a.row[i0 + i] + a.col[p]] : 0;
            continue;
        }
        for (int i = 0; i < PCD_MR; i++) {
            if (i < h) {
                const float* src = a.base + a.row[i0 + i];
                for (int p = 0; p < kc; p++) dst[p * PCD_MR + i] = src[a.col[p]];
            } else {
                for (int p = 0; p < kc; p++) dst[p * PCD_MR + i] = 0;
            }
        }
    }
}

/* B[0:kc, 0:nc] into slivers of NR columns: dst[(j / NR) * NR * kc + p * NR + j % NR], zero past nc. */
static void pcd_pack_b(int kc, int nc, pcd_operand b, float* dst) {
    for (int j0 = 0; j0 < nc; j0 += PCD_NR, dst += PCD_NR * kc) {
        int w = nc - j0 < PCD_NR ? nc - j0 : PCD_NR;
        const ptrdiff_t* col = b.col + j0;
        int kind = pcd_run_kind(col, w);
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
static inline void pcd_store_row(pcd_result c, int i, const ptrdiff_t* col, int n, int kind, int add, int bias,
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
static inline __attribute__((always_inline)) void pcd_tile_rows(const int rows, int kc, const float* a,
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
    pcd_store_row(c, i0, col, n, kind, add, bias, c00, c01);
    if (rows > 1) pcd_store_row(c, i0 + 1, col, n, kind, add, bias, c10, c11);
    if (rows > 2) pcd_store_row(c, i0 + 2, col, n, kind, add, bias, c20, c21);
    if (rows > 3) pcd_store_row(c, i0 + 3, col, n, kind, add, bias, c30, c31);
    if (rows > 4) pcd_store_row(c, i0 + 4, col, n, kind, add, bias, c40, c41);
    if (rows > 5) pcd_store_row(c, i0 + 5, col, n, kind, add, bias, c50, c51);
}

/* c by address: a 40-byte struct passed by value was copied to the stack at every call, and the copy's loads
   stalled on the stores just made (store-to-load forwarding fails across their sizes): 4 % of a GEMM's time. */
static __attribute__((noinline)) void pcd_tile_few(int kc, const float* a, const float* b, const pcd_result* c,
                                                   int i0, int j0, int m, int n, int kind, int first, int last) {
    switch (m) {
    case 1: pcd_tile_rows(1, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    case 2: pcd_tile_rows(2, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    case 3: pcd_tile_rows(3, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    case 4: pcd_tile_rows(4, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    default: pcd_tile_rows(5, kc, a, b, *c, i0, j0, n, kind, first, last); break;
    }
}

/* A tile of m (1..MR) rows: full tiles inline, the last slivers' fewer rows through a specialised copy. */
static inline __attribute__((always_inline)) void pcd_tile(int kc, const float* a, const float* b,
                                                           const pcd_result* c, int i0, int j0, int m, int n,
                                                           int kind, int first, int last) {
    if (m >= PCD_MR) {
        pcd_tile_rows(PCD_MR, kc, a, b, *c, i0, j0, n, kind, first, last);
        return;
    }
    pcd_tile_few(kc, a, b, c, i0, j0, m, n, kind, first, last);
}

/* One packed B sliver (NR columns from j0, n of them valid) against every sliver of a packed A block whose rows
   start at row i0 of C (plan: pcd_sliver_plan of its rows). */
static inline __attribute__((always_inline)) void pcd_sliver_tiles(int kc, const float* ablock,
                                                                   const pcd_slivers* plan, const float* bsliver,
                                                                   const pcd_result* c, int i0, int j0, int n,
                                                                   int kind, int first, int last) {
    for (int q = 0; q < plan->full + plan->tails; q++) {
        int h, ir = pcd_sliver(plan, q, &h);
        pcd_tile(kc, ablock + q * PCD_MR * kc, bsliver, c, i0 + ir, j0, h, n, kind, first, last);
    }
}

/* The floats pcd_pack_a_all writes for an m x k A. */
static inline size_t pcd_packed_a_floats(int m, int k) {
    return (size_t)((m + PCD_MR - 1) / PCD_MR * PCD_MR) * (size_t)k;
}

/* All of A packed in the order pcd_sgemm visits its blocks (KC blocks of k, within them MC blocks of m), for an A
   that several calls share (a convolution's weights across the chunks of a batch). */
static __attribute__((unused)) void pcd_pack_a_all(int m, int k, pcd_operand a, float* dst) {
    for (int pc = 0; pc < k; pc += PCD_KC) {
        int kc = k - pc < PCD_KC ? k - pc : PCD_KC;
        for (int ic = 0; ic < m; ic += PCD_MC) {
            int mc = m - ic < PCD_MC ? m - ic : PCD_MC;
            pcd_operand aa = {a.base, a.row + ic, a.col + pc};
            pcd_pack_a(mc, kc, aa, dst);
            dst += (size_t)((mc + PCD_MR - 1) / PCD_MR * PCD_MR) * kc;
        }
    }
}

/* The packed block of A's rows [ic, ic + mc), columns [pc, pc + kc): the next one of a prepacked A (*next, which
   then moves on), or packed into apack here (*next NULL). */
static inline const float* pcd_a_block(pcd_operand a, const float** next, int ic, int mc, int pc, int kc,
                                       float* apack) {
    const float* block = *next;
    if (block) {
        *next += pcd_packed_a_floats(mc, kc);
        return block;
    }
    pcd_operand aa = {a.base, a.row + ic, a.col + pc};
    pcd_pack_a(mc, kc, aa, apack);
    return apack;
}

/* C (m x n) = A (m x k) B (k x n) (+ C) (+ bias), through the operands' tables; pack: PCD_SGEMM_PACK_FLOATS.
   a_packed: A as pcd_pack_a_all wrote it, or NULL (then `a` is packed here). */
static __attribute__((unused)) void pcd_sgemm(int m, int n, int k, pcd_operand a, const float* a_packed,
                                              pcd_operand b, pcd_result c, float* pack) {
    float* apack = (float*)(((size_t)pack + 31) & ~(size_t)31);
    float* bpack = apack + PCD_MC * PCD_KC;
    signed char kinds[PCD_NC / PCD_NR];
    if (k == 0) {   /* an empty sum: C keeps its value (accumulate) or becomes 0, then the bias */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float* e = c.base + c.row[i] + c.col[j];
                *e = (c.accumulate ? *e : 0.0f) + (c.row_bias ? c.row_bias[i] : 0.0f);
            }
        return;
    }
    for (int jc = 0; jc < n; jc += PCD_NC) {
        int nc = n - jc < PCD_NC ? n - jc : PCD_NC;
        const float* next_a = a_packed;
        for (int jr = 0; jr < nc; jr += PCD_NR)
            kinds[jr / PCD_NR] = (signed char)pcd_run_kind(c.col + jc + jr, nc - jr < PCD_NR ? nc - jr : PCD_NR);
        for (int pc = 0; pc < k; pc += PCD_KC) {
            int kc = k - pc < PCD_KC ? k - pc : PCD_KC;
            if (m <= PCD_MC) {
                /* A is one block: each B sliver serves only its MR x NR tiles, so it is packed just before them
                   and used from L1, instead of the whole nc block being packed out to L3 and read back */
                const float* ablock = pcd_a_block(a, &next_a, 0, m, pc, kc, apack);
                pcd_slivers plan = pcd_sliver_plan(m);
                for (int jr = 0; jr < nc; jr += PCD_NR) {
                    int w = nc - jr < PCD_NR ? nc - jr : PCD_NR;
                    pcd_operand sliver = {b.base, b.row + pc, b.col + jc + jr};
                    pcd_pack_b(kc, w, sliver, bpack);
                    pcd_sliver_tiles(kc, ablock, &plan, bpack, &c, 0, jc + jr, w, kinds[jr / PCD_NR], pc == 0,
                                     pc + kc == k);
                }
                continue;
            }
            pcd_operand bb = {b.base, b.row + pc, b.col + jc};
            pcd_pack_b(kc, nc, bb, bpack);
            for (int ic = 0; ic < m; ic += PCD_MC) {
                int mc = m - ic < PCD_MC ? m - ic : PCD_MC;
                const float* ablock = pcd_a_block(a, &next_a, ic, mc, pc, kc, apack);
                pcd_slivers block_plan = pcd_sliver_plan(mc);
                for (int jr = 0; jr < nc; jr += PCD_NR)
                    pcd_sliver_tiles(kc, ablock, &block_plan, bpack + jr * kc, &c, ic, jc + jr,
                                     nc - jr < PCD_NR ? nc - jr : PCD_NR, kinds[jr / PCD_NR], pc == 0, pc + kc == k);
            }
        }
    }
}

#else   /* no AVX2 / FMA: never called (callers check PCD_SGEMM) */
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
