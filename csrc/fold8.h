/* col2im of one image for maps of at most 8 output columns (LeNet's conv2: 8 x 8 outputs, 12-wide inputs), width
   stride 1, padded width at most 16: each (padded) input row is summed in two vector registers and stored once.

   The general fold adds every 8-wide column row into the image at offset kw: the next kw's load then overlaps
   the store just made by one float, cannot take its data from the store buffer, and waits for it to reach the
   cache (most of the fold's time). Here a column row is instead shifted by kw * dilation lanes with a
   permute, and its lanes fall into the low or high register by a mask.

   The order of the sums differs from Caffe's col2im (kh, then kw, for each output row here; kh, kw, then rows
   there): the results agree to float32 rounding. On the AVX-512 path (pcd_simd, sgemm.h) a padded row is one
   16-float register: the shifted column row falls into it by one zero-masking permute, and one add instead of two
   masks and two adds (pcd_fold8_avx512: the same sums, lane for lane). Only built with AVX2 (PCD_SGEMM,
   sgemm.h). */
#ifndef PCD_FOLD8_H
#define PCD_FOLD8_H
#include "sgemm.h"

#if PCD_SGEMM

/* Whether pcd_fold8 serves this geometry. */
static inline int pcd_fold8_fits(int output_w, int stride_w, int padded_w) {
    return output_w <= 8 && stride_w == 1 && padded_w <= 16;
}

/* padded[c][h][0:padded_w] = the sum of the column rows that fall on it, for every channel c and padded row h
   (padded: channels x padded_h x padded_w, written whole). col: the image's first column, rows ld apart, in
   Caffe's (c, kh, kw) order; within a row, output_h x output_w values. */
static void pcd_fold8_avx2(const float* col, ptrdiff_t ld, float* padded, int channels, int padded_h, int padded_w,
                      int kernel_h, int kernel_w, int stride_h, int dilation_h, int dilation_w, int output_h,
                      int output_w) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(output_w), lane);
    /* per kw: the permute taking lane j from (j - shift) mod 8, and the lanes j < shift (those go high) */
    __m256i at[16];
    __m256 low[16];
    for (int kw = 0; kw < kernel_w; kw++) {
        __m256i shift = _mm256_set1_epi32(kw * dilation_w);
        at[kw] = _mm256_and_si256(_mm256_sub_epi32(lane, shift), _mm256_set1_epi32(7));
        low[kw] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(shift, lane));
    }
    const float* end = padded + (ptrdiff_t)channels * padded_h * padded_w;
    for (int c = 0; c < channels; c++) {
        for (int h = 0; h < padded_h; h++) {
            /* two pairs of sums (even and odd kw): shorter chains of dependent adds */
            __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
            for (int kh = 0; kh < kernel_h; kh++) {
                int from_top = h - kh * dilation_h, oh = from_top;
                if (from_top < 0) break;
                if (stride_h != 1) {
                    if (from_top % stride_h) continue;
                    oh = from_top / stride_h;
                }
                if (oh >= output_h) continue;
                const float* src = col + ((ptrdiff_t)(c * kernel_h + kh) * kernel_w) * ld + (ptrdiff_t)oh * output_w;
                int kw = 0;
                for (; kw < kernel_w; kw++, src += ld) {
                    /* lanes past output_w (the next output row, or past the buffer) are not loaded: zeros */
                    __m256 p = _mm256_permutevar8x32_ps(_mm256_maskload_ps(src, valid), at[kw]);
                    if (kw & 1) {
                        lo1 = _mm256_add_ps(lo1, _mm256_andnot_ps(low[kw], p));   /* lanes j >= shift */
                        hi1 = _mm256_add_ps(hi1, _mm256_and_ps(low[kw], p));      /* lanes 8 + j, j < shift */
                    } else {
                        lo0 = _mm256_add_ps(lo0, _mm256_andnot_ps(low[kw], p));
                        hi0 = _mm256_add_ps(hi0, _mm256_and_ps(low[kw], p));
                    }
                }
            }
            float* dst = padded + ((ptrdiff_t)c * padded_h + h) * padded_w;
            if (end - dst >= 16) {
                /* lanes past padded_w hold zeros and spill onto the rows after this one, which are stored
                   later (rows go in address order); a copy through a stack buffer instead cost a libc call
                   and a store-forwarding stall per row */
                _mm256_storeu_ps(dst, _mm256_add_ps(lo0, lo1));
                _mm256_storeu_ps(dst + 8, _mm256_add_ps(hi0, hi1));
            } else {   /* the last rows: nothing past `end` is written */
                float row[16] __attribute__((aligned(32)));
                _mm256_store_ps(row, _mm256_add_ps(lo0, lo1));
                _mm256_store_ps(row + 8, _mm256_add_ps(hi0, hi1));
                memcpy(dst, row, (size_t)padded_w * sizeof(float));
            }
        }
    }
}

#if PCD_SGEMM_AVX512
static void pcd_fold8_avx512(const float* col, ptrdiff_t ld, float* padded, int channels, int padded_h,
                             int padded_w, int kernel_h, int kernel_w, int stride_h, int dilation_h, int dilation_w,
                             int output_h, int output_w) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __mmask16 valid = (__mmask16)((1u << output_w) - 1);
    /* per kw: the permute taking lane j from j - shift, and the lanes it fills (shift .. shift + output_w) */
    __m512i at[16];
    __mmask16 fill[16];
    for (int kw = 0; kw < kernel_w; kw++) {
        int shift = kw * dilation_w;
        at[kw] = _mm512_and_si512(_mm512_sub_epi32(lane, _mm512_set1_epi32(shift)), _mm512_set1_epi32(15));
        fill[kw] = shift < 16 ? (__mmask16)(valid << shift) : 0;
    }
    const float* end = padded + (ptrdiff_t)channels * padded_h * padded_w;
    for (int c = 0; c < channels; c++) {
        for (int h = 0; h < padded_h; h++) {
            __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;   /* even and odd kw, as the AVX2 sums */
            for (int kh = 0; kh < kernel_h; kh++) {
                int from_top = h - kh * dilation_h, oh = from_top;
                if (from_top < 0) break;
                if (stride_h != 1) {
                    if (from_top % stride_h) continue;
                    oh = from_top / stride_h;
                }
                if (oh >= output_h) continue;
                const float* src = col + ((ptrdiff_t)(c * kernel_h + kh) * kernel_w) * ld + (ptrdiff_t)oh * output_w;
                for (int kw = 0; kw < kernel_w; kw++, src += ld) {
                    __m512 p = _mm512_maskz_permutexvar_ps(fill[kw], at[kw], _mm512_maskz_loadu_ps(valid, src));
                    if (kw & 1)
                        acc1 = _mm512_add_ps(acc1, p);
                    else
                        acc0 = _mm512_add_ps(acc0, p);
                }
            }
            float* dst = padded + ((ptrdiff_t)c * padded_h + h) * padded_w;
            /* lanes past padded_w hold zeros and spill onto the rows after this one (see pcd_fold8_avx2) */
            __mmask16 keep = end - dst >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << padded_w) - 1);
            _mm512_mask_storeu_ps(dst, keep, _mm512_add_ps(acc0, acc1));
        }
    }
}
#endif

/* padded = the fold of col (see pcd_fold8_avx2), on the pcd_simd path. */
static void pcd_fold8(const float* col, ptrdiff_t ld, float* padded, int channels, int padded_h, int padded_w,
                      int kernel_h, int kernel_w, int stride_h, int dilation_h, int dilation_w, int output_h,
                      int output_w) {
#if PCD_SGEMM_AVX512
    if (pcd_simd == PCD_SIMD_AVX512) {
        pcd_fold8_avx512(col, ld, padded, channels, padded_h, padded_w, kernel_h, kernel_w, stride_h, dilation_h,
                         dilation_w, output_h, output_w);
        return;
    }
#endif
    pcd_fold8_avx2(col, ld, padded, channels, padded_h, padded_w, kernel_h, kernel_w, stride_h, dilation_h,
                   dilation_w, output_h, output_w);
}

#else
static inline int pcd_fold8_fits(int output_w, int stride_w, int padded_w) {
    (void)output_w; (void)stride_w; (void)padded_w;
    return 0;
}
static void pcd_fold8_avx2(const float* col, ptrdiff_t ld, float* padded, int channels, int padded_h, int padded_w,
                      int kernel_h, int kernel_w, int stride_h, int dilation_h, int dilation_w, int output_h,
                      int output_w) {
    (void)col; (void)ld; (void)padded; (void)channels; (void)padded_h; (void)padded_w; (void)kernel_h;
    (void)kernel_w; (void)stride_h; (void)dilation_h; (void)dilation_w; (void)output_h; (void)output_w;
}
#endif
#endif
