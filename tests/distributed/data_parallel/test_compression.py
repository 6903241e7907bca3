"""Compressed results: the codecs round trip with error feedback, the wire format is checked on read (a damaged or
foreign payload is one line naming the key), and LeNet trains with 1-bit results at 8 workers."""
import json
import math

import numpy as np
import pytest

from pycaffe_dist.distributed.data_parallel.compression import (BLOCK, ENTRY, HEADER, Damaged, ErrorFeedback, Format,
                                                                OneBit, TopK, check, codec)
from pycaffe_dist.distributed.data_parallel.results import ResultReader
from pycaffe_dist.errors import PycaffeDistError, StoreError

from ..conftest import needs_fashion_mnist, train_on_workers

LENET = [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,)]
SHAPES = [(3, 700), (5,), (1,), (2, 2, 300)]         # a partial block, blobs smaller than a byte of signs


def _values(rng, shapes, scale=1.0):
    return [(scale * rng.standard_normal(s)).astype(np.float32) for s in shapes]


def _decoded(format, sent, shapes):
    """The blobs of what ErrorFeedback.encode sent: [payload]."""
    (payload,) = sent
    return format.decode(payload, [np.empty(s, np.float32) for s in shapes])


def test_topk_sends_the_largest_values_and_keeps_the_rest_exactly():
    rng = np.random.default_rng(1)
    feedback = ErrorFeedback(Format(TopK(0.05), SHAPES))
    feedback.encode(_values(rng, SHAPES))
    for _ in range(3):
        x = _values(rng, SHAPES)
        owed = [r + v for r, v in zip(feedback.residual, x)]            # x + the old residual, in float32
        decoded = _decoded(feedback.format, feedback.encode(x), SHAPES)
        for d, r, o in zip(decoded, feedback.residual, owed):
            np.testing.assert_array_equal(d + r, o)
            k = max(1, math.ceil(0.05 * o.size))
            assert np.count_nonzero(d) == k and np.count_nonzero(r) == o.size - k
            assert np.abs(d).min(initial=np.inf, where=d != 0) >= np.abs(r).max()


def test_one_bit_keeps_the_signs_and_each_blocks_sum_and_owes_the_rest():
    rng = np.random.default_rng(2)
    feedback = ErrorFeedback(Format(OneBit(), SHAPES))
    x = _values(rng, SHAPES)
    decoded = _decoded(feedback.format, feedback.encode(x), SHAPES)
    for d, r, v in zip(decoded, feedback.residual, x):
        np.testing.assert_allclose(d + r, v, rtol=1e-6, atol=1e-7)       # the residual is x - decode(payload)
        assert ((d >= 0) == (v >= 0)).all()
        flat_d, flat_v = d.reshape(-1), v.reshape(-1)
        for start in range(0, flat_v.size, BLOCK):
            block_d, block_v = flat_d[start:start + BLOCK], flat_v[start:start + BLOCK]
            np.testing.assert_allclose(block_d.sum(), block_v.sum(), rtol=1e-4, atol=1e-4)
            assert len(np.unique(block_d)) <= 2


def test_one_bit_error_feedback_loses_nothing_over_rounds():
    """What was sent over the rounds plus what is still owed is what there was to send."""
    rng = np.random.default_rng(3)
    feedback = ErrorFeedback(Format(OneBit(), SHAPES))
    total = [np.zeros(s, np.float64) for s in SHAPES]
    sent = [np.zeros(s, np.float64) for s in SHAPES]
    for _ in range(50):
        x = _values(rng, SHAPES, 0.01)
        for t, v in zip(total, x):
            t += v
        for s, d in zip(sent, _decoded(feedback.format, feedback.encode(x), SHAPES)):
            s += d
    for t, s, r in zip(total, sent, feedback.residual):
        np.testing.assert_allclose(s + r, t, atol=1e-5)
        assert np.abs(r).max() < 0.1                # bounded: the residual does not grow with the rounds


def test_forget_drops_what_was_owed():
    feedback = ErrorFeedback(Format(TopK(0.1), SHAPES))
    feedback.encode(_values(np.random.default_rng(4), SHAPES))
    feedback.forget()
    x = _values(np.random.default_rng(5), SHAPES)
    decoded = _decoded(feedback.format, feedback.encode(x), SHAPES)
    for d, r, v in zip(decoded, feedback.residual, x):
        np.testing.assert_array_equal(d + r, v)


@pytest.mark.parametrize("spec, ratio", [("1bit", 1 / 25), ("topk:0.01", 0.021)])
def test_lenets_results_shrink(spec, ratio):
    format = Format(codec(spec), LENET)
    assert format.nbytes <= ratio * format.dense_nbytes and format.nbytes % 4 == 0
    assert format.dense_nbytes == 4 * 431080


def test_the_compress_values():
    assert codec("none") is None and codec(None) is None
    assert isinstance(codec("1bit"), OneBit) and codec("topk:0.25").fraction == 0.25
    for bad in ("2bit", "topk", "topk:0", "topk:1.5", "topk:nan", "topk:x"):
        assert check(bad) is not None
        with pytest.raises(PycaffeDistError, match="--compress must be none, 1bit or topk:FRACTION"):
            codec(bad)


def test_a_nan_is_sent_and_decodes_to_nan():
    """A worker's NaN is not damage: it reaches the master's NaN check, which stops the job naming worker and blob."""
    for spec in ("1bit", "topk:0.01"):
        format = Format(codec(spec), SHAPES)
        x = _values(np.random.default_rng(6), SHAPES)
        x[0][1, 2] = np.nan
        assert np.isnan(_decoded(format, ErrorFeedback(format).encode(x), SHAPES)[0]).any()


# --- damage ----------------------------------------------------------------------------------------------------

def _payload(spec="topk:0.05"):
    format = Format(codec(spec), SHAPES)
    return format, ErrorFeedback(format).encode(_values(np.random.default_rng(7), SHAPES))[0]


def _header(payload):
    return payload.view(np.uint8)[:HEADER.itemsize].view(HEADER)


def _table(payload):
    return payload.view(np.uint8)[HEADER.itemsize:HEADER.itemsize + ENTRY.itemsize * len(SHAPES)].view(ENTRY)


def _first_index(payload):
    return payload.view(np.uint8)[HEADER.itemsize + ENTRY.itemsize * len(SHAPES):].view("<u4")


def _spoil(field, value):
    def spoil(payload):
        _header(payload)[field] = value
    return spoil


@pytest.mark.parametrize("spoil, message", [
    (_spoil("magic", b"XXXX"), "no compressed result"),
    (_spoil("version", 2), "format version 2, not 1"),
    (_spoil("codec", 1), "codec 1 with 4 blobs .* where the job's topk has 4 blobs"),
    (_spoil("count", 3), "codec 2 with 3 blobs"),
    (lambda p: _table(p)["values"].__setitem__(1, 6), "blob lengths are not those of the job's blobs"),
    (lambda p: _first_index(p).__setitem__(0, 1 << 30), "indices out of range or not strictly ascending"),
    (lambda p: _first_index(p).__setitem__(1, _first_index(p)[0]), "indices out of range or not strictly"),
])
def test_a_damaged_payload_is_refused(spoil, message):
    format, payload = _payload()
    _decoded(format, [payload.copy()], SHAPES)                 # the undamaged one decodes
    spoil(payload)
    with pytest.raises(Damaged, match=message):
        _decoded(format, [payload], SHAPES)


def test_a_payload_of_another_codec_is_refused():
    format, _ = _payload("topk:0.05")
    _, other = _payload("topk:0.5")
    with pytest.raises(Damaged, match="bytes, not"):
        _decoded(format, [other], SHAPES)


@pytest.mark.redis
def test_the_master_refuses_a_damaged_or_foreign_payload_in_one_line_naming_the_key(store_for):
    store = store_for("damaged")
    format, payload = _payload()
    reader = ResultReader(store, SHAPES, format=format)
    try:
        store.put_result("3", [payload], 1)
        arrays, bad = reader.take("3")
        assert bad is None and [a.shape for a in arrays] == SHAPES
        _header(payload)["magic"] = b"XXXX"
        store.put_result("3", [payload], 2)
        with pytest.raises(StoreError, match=r"^job damaged: pcd:damaged:x:3:\* holds a damaged or foreign "
                                             r"compressed result: no compressed result \(magic b'XXXX'\)$"):
            reader.take("3")
        store.put_result("3", [np.zeros(s, np.float32) for s in SHAPES], 3)       # a float32 result
        with pytest.raises(StoreError, match=r"^job damaged: pcd:damaged:x:3:0 holds (more than )?\d+ bytes but "):
            reader.take("3")
        assert reader.sizes() == {"bytes_per_result": format.nbytes, "float32_bytes_per_result": 4 * 3306}
    finally:
        reader.close()
        store.remove_job()


# --- training ------------------------------------------------------------------------------------------------------

@pytest.mark.redis
@pytest.mark.slow
@needs_fashion_mnist
@pytest.mark.parametrize("mode, merges", [("sync", 250), ("local-sgd", 31)])
def test_lenet_trains_at_8_workers_on_1_bit_results(mode, merges, lenet_solver, tmp_path):
    """As test_modes_scale.py, with --compress 1bit: the images of 2000 batches, >= 0.78, 1/28 of the bytes."""
    run = train_on_workers(lenet_solver(max_iter=merges), 8, mode, tmp_path / "stats.json", "--compress", "1bit")
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    final = stats["tests"][-1]["scores"]
    assert math.isfinite(final["loss"]) and final["accuracy"] >= 0.78, final
    assert stats["bytes_per_result"] <= stats["float32_bytes_per_result"] / 25, stats
