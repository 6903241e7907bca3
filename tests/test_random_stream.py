"""pycaffe_dist/random_stream.py on the CPU: a stream's draws are numpy's Philox numbers at its key and counter, each
draw starting at a fresh block; keys from the seed and the name, or from common.rng() when never seeded; reseeding
restarts; the kernels' arguments carry the key and the counter whole. The device's side: tests/gpu/
test_random_stream_gpu.py."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.random_stream import RandomStream, blocks_for, seeded_key


def philox(key, counter, count):
    return np.random.Generator(np.random.Philox(key=key, counter=counter)).random(count, dtype=np.float32)


def test_blocks_for_counts_eight_numbers_a_block():
    assert [blocks_for(n) for n in (0, 1, 8, 9, 16, 17)] == [0, 1, 1, 2, 2, 3]


def test_draws_are_numpys_philox_from_a_fresh_block_each_time():
    common.set_random_seed(12)
    stream = RandomStream("drop6")
    key, counter = seeded_key(12, "drop6"), 0
    for count in (13, 8, 1, 300):
        got = stream.uniform(np.empty(count, np.float32))
        np.testing.assert_array_equal(got, philox(key, counter, count))
        counter += blocks_for(count)
        assert (stream.key, stream.counter) == (key, counter)


def test_uniform_fills_a_shaped_array_in_memory_order():
    common.set_random_seed(1)
    out = RandomStream("x").uniform(np.empty((3, 4, 5), np.float32))
    np.testing.assert_array_equal(out.reshape(-1), philox(seeded_key(1, "x"), 0, 60))


def test_uniform_refuses_what_it_cannot_fill_in_place():
    stream = RandomStream("x")
    with pytest.raises(ValueError, match="contiguous float32"):
        stream.uniform(np.empty(10, np.float64))
    with pytest.raises(ValueError, match="contiguous float32"):
        stream.uniform(np.empty((4, 4), np.float32)[:, ::2])


def test_reseeding_restarts_every_stream():
    common.set_random_seed(3)
    stream = RandomStream("a")
    first = stream.uniform(np.empty(20, np.float32)).copy()
    assert (stream.uniform(np.empty(20, np.float32)) != first).any()
    common.set_random_seed(3)
    np.testing.assert_array_equal(stream.uniform(np.empty(20, np.float32)), first)
    assert stream.counter == blocks_for(20)


def test_keys_differ_by_seed_and_by_name_and_fill_128_bits():
    keys = {seeded_key(seed, name) for seed in (0, 1, 2 ** 40) for name in ("", "drop6", "drop7")}
    assert len(keys) == 9
    assert all(0 <= k < 2 ** 128 for k in keys) and max(keys) >= 2 ** 64
    assert seeded_key(5, "drop6") == seeded_key(5, "drop6")


def test_without_a_seed_the_key_comes_from_common_rng(monkeypatch):
    generator = np.random.default_rng(77)
    monkeypatch.setattr(common, "random_seed", lambda: None)
    monkeypatch.setattr(common, "rng", lambda: generator)
    stream = RandomStream("drop6")
    stream.take(1)
    assert stream.key == int.from_bytes(np.random.default_rng(77).bytes(16), "little")


def test_kernel_arguments_carry_the_key_and_the_counter_as_signed_halves():
    common.set_random_seed(9)
    stream = RandomStream("n")
    stream.take(8 * 5)
    args = stream.kernel_arguments(17)
    assert args[:2] == (3, 17) and stream.counter == 5 + 3
    assert all(-2 ** 31 <= a < 2 ** 31 for a in args)
    k0_lo, k0_hi, k1_lo, k1_hi, c_lo, c_hi = (a & 0xFFFFFFFF for a in args[2:])
    assert (k1_hi << 96) | (k1_lo << 64) | (k0_hi << 32) | k0_lo == seeded_key(9, "n")
    assert (c_hi << 32) | c_lo == 5
