/* Copies and adds of runs of consecutive float or double values, for the 2-D unroll (im2col) and fold (col2im)
   of one image in csrc/conv_pass.pxi, where each output row of a kernel tap is one run. A header, declared to
   Cython where it is used, so that the C reads and compiles as C. */
#ifndef PCD_ROW_RUNS_H
#define PCD_ROW_RUNS_H
/* Runs of the 2-D unroll and fold: whole 32-byte blocks as one unaligned vector load and store (or add)
   each, then the tail. A runtime-length loop costs an alias check, a vector loop and an epilogue per run,
   too much for LeNet's 8-value runs. __restrict: a run never overlaps its source. */
#define PCD_RUNS(copy, add, real)                                                                            \
static inline void copy(real* __restrict dst, const real* __restrict src, int n) {                          \
    int i = 0;                                                                                              \
    for (; i + (int)(32 / sizeof(real)) <= n; i += 32 / sizeof(real)) __builtin_memcpy(dst + i, src + i, 32); \
    for (; i < n; i++) dst[i] = src[i];                                                                     \
}                                                                                                           \
static inline void add(real* __restrict dst, const real* __restrict src, int n) {                           \
    typedef real block __attribute__((vector_size(32), aligned(sizeof(real)), may_alias));                 \
    int i = 0;                                                                                              \
    for (; i + (int)(32 / sizeof(real)) <= n; i += 32 / sizeof(real))                                       \
        *(block*)(dst + i) = *(const block*)(dst + i) + *(const block*)(src + i);                           \
    for (; i < n; i++) dst[i] += src[i];                                                                    \
}
PCD_RUNS(pcd_copy_run_f, pcd_add_run_f, float)
PCD_RUNS(pcd_copy_run_d, pcd_add_run_d, double)
#endif
