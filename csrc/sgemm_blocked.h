/* The BLIS (Goto) blocking of sgemm.h's GEMM, written once and included once per instruction set by sgemm.h,
   each time with these defined by the including micro-kernel header (sgemm_avx2.h, sgemm_avx512.h):
     PCD_ISA                  the suffix of the functions made here (pcd_sgemm_avx2, ...)
     PCD_MR, PCD_NR           the micro-kernel's tile: MR rows (A values broadcast) x NR columns (B vectors)
     PCD_MC, PCD_NC           blocks of A's rows (packed, kept in L2) and of B's columns (packed, in L3)
     PCD_FN(pack_b)           B[0:kc, 0:nc] into slivers of NR columns (see pcd_pack_b_avx2)
     PCD_FN(store_kind)       how a tile's NR columns of C are laid out in memory (an int the tile decodes)
     PCD_FN(tile)             one tile of m <= MR rows, NR columns
   PCD_KC (the depth of a block) is the same for all: C is summed in KC-deep blocks, so that the sums, and with
   them the results, are the same on every path, bit for bit. C is computed in MR x NR tiles from packed slivers
   of A (MR rows) and B (NR columns). */
/* How an MC block's mc rows are cut into slivers (the micro-kernel's tiles), and sliver q's first row and rows. */
#if PCD_MR == 6
/* MR = 6 rows each, except at the end. A tile of 2 rows (the last of m = 20, 32, 50 or 500) runs its 4
   accumulators back to back, bound by the FMA latency (4 cycles on Zen 3) at a full tile's time per step for a
   third of its work; tiles of 4 or 5 rows keep both FMA pipes busy. So a remainder of 1, 2 or 3 rows takes rows
   from the last full slivers: ... 6 | 4 4, ... 6 | 5 4, ... 6 6 | 5 4 4, never more slivers than ceil(mc / 6). */
static inline pcd_slivers PCD_FN(sliver_plan)(int mc) {
    pcd_slivers s = {mc / PCD_MR, {0, 0, 0}, 0};
    int r = mc % PCD_MR;
    if (r == 2 && s.full >= 1) { s.full -= 1; s.tail[0] = 4; s.tail[1] = 4; s.tails = 2; }
    else if (r == 3 && s.full >= 1) { s.full -= 1; s.tail[0] = 5; s.tail[1] = 4; s.tails = 2; }
    else if (r == 1 && s.full >= 2) { s.full -= 2; s.tail[0] = 5; s.tail[1] = 4; s.tail[2] = 4; s.tails = 3; }
    else if (r) { s.tail[0] = r; s.tails = 1; }
    return s;
}

static inline int PCD_FN(sliver)(const pcd_slivers* s, int q, int* h) {
    if (q < s->full) { *h = PCD_MR; return q * PCD_MR; }
    int i0 = s->full * PCD_MR;
    for (int t = 0; t < q - s->full; t++) i0 += s->tail[t];
    *h = s->tail[q - s->full];
    return i0;
}
#else
/* A tall tile (MR = 14 rows of 2 vectors: 28 accumulators) leaves far more rows over than 6 does (m = 20 would
   be 14 | 6, m = 50 14 14 14 | 8): ceil(mc / MR) slivers of nearly equal height instead (10 10 10 10 10 for
   50), which keeps every tile at 8 accumulators or more, enough to cover the FMA latency. full: the slivers;
   tail[0]: how many of them (the first) have one row more than tail[1] = mc / full. */
static inline pcd_slivers PCD_FN(sliver_plan)(int mc) {
    pcd_slivers s = {(mc + PCD_MR - 1) / PCD_MR, {0, 0, 0}, 0};
    if (s.full) { s.tail[0] = mc % s.full; s.tail[1] = mc / s.full; }
    return s;
}

static inline int PCD_FN(sliver)(const pcd_slivers* s, int q, int* h) {
    *h = s->tail[1] + (q < s->tail[0]);
    return q * s->tail[1] + (q < s->tail[0] ? q : s->tail[0]);
}
#endif

/* A[0:mc, 0:kc] into slivers (the plan above), each MR values a step (dst[q * MR * kc + p * MR + i] for row i of
   sliver q), zero past the sliver's rows. */
static void PCD_FN(pack_a)(int mc, int kc, pcd_operand a, float* dst) {
    pcd_slivers plan = PCD_FN(sliver_plan)(mc);
    for (int q = 0; q < plan.full + plan.tails; q++, dst += PCD_MR * kc) {
        int h, i0 = PCD_FN(sliver)(&plan, q, &h);
        if (pcd_consecutive8_all(a.col, kc)) {
            /* rows that are consecutive in memory (an output diff y as dW's A): 8 values of each of 8 rows at
               once, laid out by an 8 x 8 transpose; the last p % 8 one by one */
            int p = 0;
            for (; p + 8 <= kc; p += 8)
                for (int r0 = 0; r0 < PCD_MR; r0 += 8) {
                    __m256 v[8];
                    for (int i = 0; i < 8; i++)
                        v[i] = r0 + i < h ? _mm256_loadu_ps(a.base + a.row[i0 + r0 + i] + a.col[p])
                                          : _mm256_setzero_ps();
                    pcd_transpose8(v);
                    for (int j = 0; j < 8; j++)
                        pcd_store_lanes(dst + (p + j) * PCD_MR + r0, v[j], PCD_MR - r0 < 8 ? PCD_MR - r0 : 8);
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

/* One packed B sliver (NR columns from j0, n of them valid) against every sliver of a packed A block whose rows
   start at row i0 of C (plan: the sliver plan of its rows). */
static inline __attribute__((always_inline)) void PCD_FN(sliver_tiles)(int kc, const float* ablock,
                                                                       const pcd_slivers* plan,
                                                                       const float* bsliver, const pcd_result* c,
                                                                       int i0, int j0, int n, int kind, int first,
                                                                       int last) {
    for (int q = 0; q < plan->full + plan->tails; q++) {
        int h, ir = PCD_FN(sliver)(plan, q, &h);
        PCD_FN(tile)(kc, ablock + q * PCD_MR * kc, bsliver, c, i0 + ir, j0, h, n, kind, first, last);
    }
}

/* The floats pack_a_all writes for an m x k A. */
static inline size_t PCD_FN(packed_a_floats)(int m, int k) {
    return (size_t)((m + PCD_MR - 1) / PCD_MR * PCD_MR) * (size_t)k;
}

/* All of A packed in the order the GEMM visits its blocks (KC blocks of k, within them MC blocks of m), for an A
   that several calls share (a convolution's weights across the chunks of a batch). */
static __attribute__((unused)) void PCD_FN(pack_a_all)(int m, int k, pcd_operand a, float* dst) {
    for (int pc = 0; pc < k; pc += PCD_KC) {
        int kc = k - pc < PCD_KC ? k - pc : PCD_KC;
        for (int ic = 0; ic < m; ic += PCD_MC) {
            int mc = m - ic < PCD_MC ? m - ic : PCD_MC;
            pcd_operand aa = {a.base, a.row + ic, a.col + pc};
            PCD_FN(pack_a)(mc, kc, aa, dst);
            dst += (size_t)((mc + PCD_MR - 1) / PCD_MR * PCD_MR) * kc;
        }
    }
}

/* The packed block of A's rows [ic, ic + mc), columns [pc, pc + kc): the next one of a prepacked A (*next, which
   then moves on), or packed into apack here (*next NULL). */
static inline const float* PCD_FN(a_block)(pcd_operand a, const float** next, int ic, int mc, int pc, int kc,
                                           float* apack) {
    const float* block = *next;
    if (block) {
        *next += PCD_FN(packed_a_floats)(mc, kc);
        return block;
    }
    pcd_operand aa = {a.base, a.row + ic, a.col + pc};
    PCD_FN(pack_a)(mc, kc, aa, apack);
    return apack;
}

/* C (m x n) = A (m x k) B (k x n) (+ C) (+ bias), through the operands' tables; pack: PCD_SGEMM_PACK_FLOATS.
   a_packed: A as pack_a_all wrote it, or NULL (then `a` is packed here). k > 0 (sgemm.h takes k = 0). */
static __attribute__((unused)) void PCD_FN(sgemm)(int m, int n, int k, pcd_operand a, const float* a_packed,
                                                  pcd_operand b, pcd_result c, float* pack) {
    float* apack = (float*)(((size_t)pack + 63) & ~(size_t)63);
    float* bpack = apack + PCD_MC * PCD_KC;
    int kinds[PCD_NC / PCD_NR];
    for (int jc = 0; jc < n; jc += PCD_NC) {
        int nc = n - jc < PCD_NC ? n - jc : PCD_NC;
        const float* next_a = a_packed;
        for (int jr = 0; jr < nc; jr += PCD_NR)
            kinds[jr / PCD_NR] = PCD_FN(store_kind)(c.col + jc + jr, nc - jr < PCD_NR ? nc - jr : PCD_NR);
        for (int pc = 0; pc < k; pc += PCD_KC) {
            int kc = k - pc < PCD_KC ? k - pc : PCD_KC;
            if (m <= PCD_MC) {
                /* A is one block: each B sliver serves only its MR x NR tiles, so it is packed just before them
                   and used from L1, instead of the whole nc block being packed out to L3 and read back */
                const float* ablock = PCD_FN(a_block)(a, &next_a, 0, m, pc, kc, apack);
                pcd_slivers plan = PCD_FN(sliver_plan)(m);
                for (int jr = 0; jr < nc; jr += PCD_NR) {
                    int w = nc - jr < PCD_NR ? nc - jr : PCD_NR;
                    pcd_operand sliver = {b.base, b.row + pc, b.col + jc + jr};
                    PCD_FN(pack_b)(kc, w, sliver, bpack);
                    PCD_FN(sliver_tiles)(kc, ablock, &plan, bpack, &c, 0, jc + jr, w, kinds[jr / PCD_NR], pc == 0,
                                         pc + kc == k);
                }
                continue;
            }
            pcd_operand bb = {b.base, b.row + pc, b.col + jc};
            PCD_FN(pack_b)(kc, nc, bb, bpack);
            for (int ic = 0; ic < m; ic += PCD_MC) {
                int mc = m - ic < PCD_MC ? m - ic : PCD_MC;
                const float* ablock = PCD_FN(a_block)(a, &next_a, ic, mc, pc, kc, apack);
                pcd_slivers block_plan = PCD_FN(sliver_plan)(mc);
                for (int jr = 0; jr < nc; jr += PCD_NR)
                    PCD_FN(sliver_tiles)(kc, ablock, &block_plan, bpack + jr * kc, &c, ic, jc + jr,
                                         nc - jr < PCD_NR ? nc - jr : PCD_NR, kinds[jr / PCD_NR], pc == 0,
                                         pc + kc == k);
            }
        }
    }
}

#undef PCD_ISA
#undef PCD_MR
#undef PCD_NR
#undef PCD_MC
#undef PCD_NC
