"""The master's reads of the workers' results: ahead of their merges on threads of their own, into scratch arrays
that come back, with the check for NaN and Inf."""
import numpy as np
import pytest

from pycaffe_dist.distributed.data_parallel.results import ResultReader, first_non_finite

SHAPES = [(4, 3), (5,)]


def test_non_finite_values_are_found_in_any_blob():
    arrays = [np.ones(5, np.float32), np.ones((3, 4), np.float32)]
    assert first_non_finite(arrays) is None
    arrays[1][2, 1] = np.inf
    assert first_non_finite(arrays) == 1
    arrays[0][0] = np.nan
    assert first_non_finite(arrays) == 0
    big = np.full(10, 3e38, np.float32)                 # finite, but the float32 sum overflows
    assert first_non_finite([big]) is None


@pytest.mark.redis
def test_reads_run_ahead_and_their_arrays_come_back(store_for):
    store = store_for("reader")
    results = {w: [np.full(s, float(k), np.float32) for s in SHAPES] for k, w in enumerate("abc")}
    for worker, arrays in results.items():
        store.put_result(worker, arrays, 1)
    bad = [np.zeros(s, np.float32) for s in SHAPES]
    bad[1][3] = np.nan
    store.put_result("d", bad, 1)
    reader = ResultReader(store, SHAPES, threads=2)
    try:
        for worker in "abcd":
            reader.start(worker)
        got, flaw = reader.take("b")
        assert flaw is None and all(np.array_equal(g, r) for g, r in zip(got, results["b"]))
        assert reader.take("d")[1] == 1                 # blob 1 holds a NaN
        reader.discard("c")                             # read, not taken: its arrays are free again
        reader.release(got)
        assert len(reader.free) == 2
        again, _ = reader.take("a")                     # never started: read now, into a free set
        assert np.array_equal(again[0], results["a"][0])
        reader.discard("nobody")                        # nothing started: nothing to do
    finally:
        reader.close()
        store.remove_job()
