"""Counter-based random streams: the draws of the layers that draw at every forward (Dropout, stochastic pooling),
the same numbers on the CPU and on the device, made where they are used.

A stream is numpy's Philox bit generator (Philox4x64-10) at a 128-bit key and a counter. The CPU path draws with
np.random.Generator(np.random.Philox(key=key, counter=counter)); the device path gives the key and the counter to
a kernel of csrc/cuda/random.cu, which computes numpy's numbers itself, so no draw is uploaded from the host (the
draws used to be made with numpy and uploaded at every forward: a stall of milliseconds in AlexNet's drop6/drop7).

Every draw starts at a fresh Philox block (4 uint64, that is 8 uint32 or 8 float32 uniforms) and moves the
counter past the ceil(count / 8) blocks it used, so draw after draw gets new numbers; number j of a draw is numpy's
number j from that counter (random_raw's words, low half first; random(dtype=float32) is (uint32 >> 8) * 2^-24).

Keys. Each layer that draws owns one stream, named after the layer:
- after common.set_random_seed (the solver's random_seed), the key is a hash of the seed and the name: reproducible,
  and different for every layer of a net and for every seed;
- never seeded, the key comes from common.rng() (fresh entropy), as the draws did before.
set_random_seed restarts every stream (key again, counter 0), as caffe.set_random_seed restarts Caffe's one
generator: seeding before a forward repeats its draws, which the gradient checker and the CPU/GPU comparisons use.
Two layers of one name (the same layer in a CPU net and a GPU net) draw the same numbers after the same seed.
"""
import hashlib

import numpy as np

from . import common

UINT32_PER_BLOCK = 8     # a Philox4x64 block: 4 uint64 words, each two uint32 numbers (low half first)
_U64 = (1 << 64) - 1


def blocks_for(count):
    """The Philox blocks a draw of `count` numbers uses (one device thread each)."""
    return -(-int(count) // UINT32_PER_BLOCK)


def seeded_key(seed, name):
    """The 128-bit Philox key of the stream `name` under `seed`: the first 16 bytes of BLAKE2b over both."""
    digest = hashlib.blake2b(("%d/%s" % (seed, name)).encode(), digest_size=16).digest()
    return int.from_bytes(digest, "little")


def _int32(value):
    """A 32-bit word as the signed int a kernel's int parameter carries (pycuda packs 'i', ctypes c_int)."""
    return value - (1 << 32) if value >= (1 << 31) else value


class RandomStream:
    """The uniform draws of one layer (see the module's docstring); `name` is the layer's name."""

    def __init__(self, name):
        self.name = name
        self.key = None          # 128-bit int, set at the first draw after each seeding
        self.counter = 0         # numpy's Philox counter (its first word) where the next draw starts
        self._seed_version = None

    def _restart_if_reseeded(self):
        version = common.random_seed_version()
        if version != self._seed_version:
            seed = common.random_seed()
            self.key = (seeded_key(seed, self.name) if seed is not None
                        else int.from_bytes(common.rng().bytes(16), "little"))
            self.counter = 0
            self._seed_version = version

    def take(self, count):
        """(key, counter) at which a draw of `count` numbers starts; the stream moves past its blocks.
        The counter stays in numpy's first counter word: 2^64 blocks, more than any training draws."""
        self._restart_if_reseeded()
        start = self.counter
        self.counter = (start + blocks_for(count)) & _U64
        return self.key, start

    def generator(self, count):
        """A numpy Generator positioned at the next draw of `count` numbers (which it takes from the stream)."""
        key, counter = self.take(count)
        return np.random.Generator(np.random.Philox(key=key, counter=counter))

    def uniform(self, out):
        """Fill `out` (a contiguous float32 array, in memory order) with uniforms in [0, 1); returns it."""
        if out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError("RandomStream.uniform fills a contiguous float32 array, got %s %s"
                             % (out.dtype, "contiguous" if out.flags.c_contiguous else "strided"))
        self.generator(out.size).random(out=out.reshape(-1), dtype=np.float32)
        return out

    def kernel_arguments(self, count):
        """The leading arguments of csrc/cuda/random.cu's kernels for the next draw of `count` numbers:
        (blocks, count, key0_lo, key0_hi, key1_lo, key1_hi, counter_lo, counter_hi); launch over `blocks` threads."""
        key, counter = self.take(count)
        halves = [(word >> shift) & 0xFFFFFFFF for word in (key & _U64, key >> 64, counter) for shift in (0, 32)]
        return (blocks_for(count), int(count)) + tuple(_int32(h) for h in halves)

    def uniform_gpu(self, dev, out, count=None):
        """Fill the first `count` elements (all by default) of the float32 device array `out` with the uniforms
        that `uniform` would draw, on the device."""
        count = out.size if count is None else int(count)
        dev.launch("philox_uniform", *self.kernel_arguments(count), out)
        return out
