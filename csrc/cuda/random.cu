// Counter-based random numbers on the device: numpy's Philox bit generator (Philox4x64-10, numpy/random/src/philox/
// philox.h), so that a kernel draws, with no host round trip, exactly the numbers the CPU code draws with
// np.random.Generator(np.random.Philox(key=key, counter=counter)) (pycaffe_dist/random_stream.py holds the keys
// and counters of the layers that draw).
//
// numpy's stream from (key, counter): block b (b = 0, 1, ...) is Philox4x64-10 of the counter counter + 1 + b
// (philox_next increments the counter before it generates), four uint64 words; next_uint32 returns the low half of a
// word, then its high half. uint32 number j is therefore half j % 2 of word (j / 2) % 4 of block j / 8, and numpy's
// random(dtype=float32) is (uint32 >> 8) * 2^-24. Here one thread computes one block: the 8 numbers j = 8b .. 8b + 7.
//
// Every kernel here takes (blocks, count, key0_lo, key0_hi, key1_lo, key1_hi, counter_lo, counter_hi) first
// (RandomStream.kernel_arguments): the 128-bit key and the 64-bit counter arrive as 32-bit halves, since kernel
// parameters are int, float or pointers (backend/kernel_source.py). The counter's carry into the second counter
// word is kept, as numpy keeps it.
#include "common.cuh"

typedef unsigned long long philox_u64;

struct philox_block { philox_u64 v[4]; };

PCD_DEVICE philox_u64 philox_join(const unsigned lo, const unsigned hi) {
  return ((philox_u64)hi << 32) | (philox_u64)lo;
}

// The high 64 bits of the 128-bit product a * b (numpy's mulhilo64).
PCD_DEVICE philox_u64 philox_mulhi(const philox_u64 a, const philox_u64 b) {
#ifdef __CUDACC__
  return __umul64hi(a, b);
#else
  return (philox_u64)(((unsigned __int128)a * (unsigned __int128)b) >> 64);
#endif
}

// Philox4x64-10 of the counter (c0, c1, 0, 0) under the key (k0, k1): numpy's philox4x64_R(10, ctr, key).
PCD_DEVICE philox_block philox4x64_10(philox_u64 c0, philox_u64 c1, philox_u64 k0, philox_u64 k1) {
  philox_u64 c2 = 0, c3 = 0;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {      // the key bump (Weyl constants) between rounds
      k0 += 0x9E3779B97F4A7C15ULL;
      k1 += 0xBB67AE8584CAA73BULL;
    }
    const philox_u64 hi0 = philox_mulhi(0xD2E7470EE14C6C93ULL, c0), lo0 = 0xD2E7470EE14C6C93ULL * c0;
    const philox_u64 hi1 = philox_mulhi(0xCA5A826395121157ULL, c2), lo1 = 0xCA5A826395121157ULL * c2;
    const philox_u64 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  philox_block out = {{c0, c1, c2, c3}};
  return out;
}

// Block b of the stream that starts at `counter`: Philox of counter + 1 + b (with the carry into word 1).
PCD_DEVICE philox_block philox_stream_block(const philox_u64 counter, const int b, const philox_u64 k0,
                                            const philox_u64 k1) {
  const philox_u64 c0 = counter + 1 + (philox_u64)b;
  return philox4x64_10(c0, c0 < counter ? 1ULL : 0ULL, k0, k1);
}

// uint32 number k (0..7) of a block: the low half of word k / 2 when k is even, else its high half.
PCD_DEVICE unsigned philox_uint32_of(const philox_block& block, const int k) {
  const philox_u64 word = block.v[k >> 1];
  return (unsigned)((k & 1) ? (word >> 32) : (word & 0xffffffffULL));
}

// For each number j = 8b + k (k = 0..7) of block b below count. On the device the loop is unrolled, so that k is a
// constant and the block's words stay in registers (indexed by a variable, they would go to local memory).
#ifdef __CUDACC__
#define PHILOX_UNROLL _Pragma("unroll")
#else
#define PHILOX_UNROLL
#endif
#define PHILOX_FOR_EACH_NUMBER(j, k, b, count) \
  PHILOX_UNROLL for (int k = 0, j = 8 * (b); k < 8; ++k, ++j) if (j < (count))

// numpy's next_float: the top 24 bits, times 2^-24 (exact in float32): a value in [0, 1).
PCD_DEVICE float philox_float_of(const unsigned bits) { return (float)(bits >> 8) * (1.0f / 16777216.0f); }

// out[j] = uint32 number j of the stream (key, counter), j < count; launched with blocks = ceil(count / 8) threads.
PCD_KERNEL void philox_uint32(const int blocks, const int count, const unsigned key0_lo, const unsigned key0_hi,
                              const unsigned key1_lo, const unsigned key1_hi, const unsigned counter_lo,
                              const unsigned counter_hi, unsigned* out) {
  const philox_u64 k0 = philox_join(key0_lo, key0_hi), k1 = philox_join(key1_lo, key1_hi);
  CUDA_KERNEL_LOOP(b, blocks) {
    const philox_block block = philox_stream_block(philox_join(counter_lo, counter_hi), b, k0, k1);
    PHILOX_FOR_EACH_NUMBER(j, k, b, count) { out[j] = philox_uint32_of(block, k); }
  }
}

// out[j] = float32 uniform number j of the stream in [0, 1) (numpy's Generator.random(dtype=float32)).
PCD_KERNEL void philox_uniform(const int blocks, const int count, const unsigned key0_lo, const unsigned key0_hi,
                               const unsigned key1_lo, const unsigned key1_hi, const unsigned counter_lo,
                               const unsigned counter_hi, float* out) {
  const philox_u64 k0 = philox_join(key0_lo, key0_hi), k1 = philox_join(key1_lo, key1_hi);
  CUDA_KERNEL_LOOP(b, blocks) {
    const philox_block block = philox_stream_block(philox_join(counter_lo, counter_hi), b, k0, k1);
    PHILOX_FOR_EACH_NUMBER(j, k, b, count) { out[j] = philox_float_of(philox_uint32_of(block, k)); }
  }
}

// Dropout's TRAIN forward with its draws made here: rand[j] = uniform number j of the stream, kept for the backward
// (dropout_apply in neuron.cu, with the same draws), and y[j] = x[j] * (rand[j] < keep ? scale : 0), the comparison
// of the CPU code (csrc/neuron.pyx dropout). y may be x (in place): each element is read before it is written.
PCD_KERNEL void dropout_philox_forward(const int blocks, const int count, const unsigned key0_lo,
                                       const unsigned key0_hi, const unsigned key1_lo, const unsigned key1_hi,
                                       const unsigned counter_lo, const unsigned counter_hi, const float* x,
                                       const float keep, const float scale, float* rand, float* y) {
  const philox_u64 k0 = philox_join(key0_lo, key0_hi), k1 = philox_join(key1_lo, key1_hi);
  CUDA_KERNEL_LOOP(b, blocks) {
    const philox_block block = philox_stream_block(philox_join(counter_lo, counter_hi), b, k0, k1);
    PHILOX_FOR_EACH_NUMBER(j, k, b, count) {
      const float u = philox_float_of(philox_uint32_of(block, k));
      rand[j] = u;
      y[j] = x[j] * (u < keep ? scale : 0.0f);
    }
  }
}
