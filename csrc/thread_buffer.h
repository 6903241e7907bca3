/* Per-thread scratch buffers of the float32 convolution passes (csrc/conv_fused.pyx): the GEMM's packing space
   and the padded copies of images and output diffs. A header, declared to Cython where it is used, so that the C
   reads and compiles as C. */
#ifndef PCD_THREAD_BUFFER_H
#define PCD_THREAD_BUFFER_H
#include <stdio.h>
#include <stdlib.h>
/* This thread's buffer of at least `floats` floats (slot 0: sgemm.h's packing space, slot 1: padded
   images, slot 2: padded output diffs), kept for the thread's life: a convolution calls the GEMM per chunk,
   and fresh megabytes per call would cost their page faults every time. */
static float* pcd_thread_buffer(int slot, size_t floats) {
    static __thread float* buffers[3];
    static __thread size_t sizes[3];
    if (sizes[slot] < floats) {
        free(buffers[slot]);
        buffers[slot] = (float*)malloc(floats * sizeof(float));
        sizes[slot] = buffers[slot] ? floats : 0;
        if (!buffers[slot]) { fprintf(stderr, "pycaffe_dist conv_fused: out of memory\n"); abort(); }
    }
    return buffers[slot];
}
#endif
