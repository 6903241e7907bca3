"""The parameter store against a real redis-server: blob round trips, bounded and checked reads, sharding over
two servers, messages, and a job's keys."""
import numpy as np
import pytest

from pycaffe_dist.distributed.launch import LocalRedis
from pycaffe_dist.distributed.store import HEADER, Store, connect
from pycaffe_dist.errors import StoreError

pytestmark = pytest.mark.redis
SHAPES = [(20, 1, 5, 5), (20,), (500, 800), (3,)]


def _arrays(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def test_blobs_round_trip_bit_exact_with_their_version(store_for):
    store = store_for("rt")
    arrays = _arrays(0)
    store.put_blobs("W", arrays, version=7)
    got, version = store.get_blobs("W", SHAPES)
    assert version == 7 and all(np.array_equal(a, b) for a, b in zip(arrays, got))
    raw = store.control.get(store.key("W", 2))
    assert len(raw) == HEADER + 4 * 500 * 800            # raw little-endian float32 behind a uint64 version
    assert np.array_equal(np.frombuffer(raw, "<f4", offset=HEADER).reshape(500, 800), arrays[2])
    store.put_blobs("x", _arrays(1), version=3, owner="5")
    got, _ = store.get_blobs("x", SHAPES, owner="5")
    assert np.array_equal(got[0], _arrays(1)[0])
    store.remove_job()


def test_reads_are_checked_against_the_expected_shapes(store_for):
    store = store_for("shapes")
    store.put_blobs("W", _arrays(0))
    with pytest.raises(StoreError, match=r"pcd:shapes:W:2 holds 1600008 bytes but blob 2 of shape 500x801 needs "
                                         r"1602008"):
        store.get_blobs("W", SHAPES[:2] + [(500, 801)] + SHAPES[3:])
    with pytest.raises(StoreError, match="pcd:shapes:d:0 is missing from Redis"):
        store.get_blobs("d", SHAPES)
    assert store.get_blobs("d", SHAPES, missing_ok=True) == (None, None)
    store.remove_job()
    assert not list(store.control.scan_iter(match="pcd:shapes:*"))


def test_blobs_shard_over_two_servers(redis_server, monkeypatch):
    second = LocalRedis()
    try:
        monkeypatch.setenv("PCD_REDIS_PASSWORD", redis_server.password)
        first_client = connect(redis_server.url)
        # Each server has its own password: give them in the URLs.
        urls = [redis_server.url.replace("//", "//:%s@" % redis_server.password),
                second.url.replace("//", "//:%s@" % second.password)]
        store = Store(urls, "sharded")
        arrays = _arrays(2)
        store.put_blobs("W", arrays, version=4)
        got, version = store.get_blobs("W", SHAPES)
        assert version == 4 and all(np.array_equal(a, b) for a, b in zip(arrays, got))
        assert first_client.exists("pcd:sharded:W:0", "pcd:sharded:W:2") == 2
        assert first_client.exists("pcd:sharded:W:1", "pcd:sharded:W:3") == 0
        assert store.clients[1].exists("pcd:sharded:W:1", "pcd:sharded:W:3") == 2
        store.remove_job()
        assert not list(store.clients[1].scan_iter(match="pcd:sharded:*"))
    finally:
        second.stop()


def test_messages_are_json_objects_of_bounded_size(store_for):
    store = store_for("msg")
    queue = store.key("inbox")
    store.send(queue, {"type": "join", "worker": "3"})
    assert store.receive(queue, 0) == {"type": "join", "worker": "3"}
    assert store.receive(queue, 0) is None
    store.control.lpush(queue, b"\x80\x04pickle")
    with pytest.raises(StoreError, match="a message on pcd:msg:inbox is not JSON"):
        store.receive(queue, 0)
    store.control.lpush(queue, b"[1, 2]")
    with pytest.raises(StoreError, match="is not a JSON object"):
        store.receive(queue, 0)
    store.control.lpush(queue, b" " * (2 << 20))
    with pytest.raises(StoreError, match="a message of 2097152 bytes"):
        store.receive(queue, 0)
    store.remove_job()


def test_heartbeats_expire(store_for):
    import time
    store = store_for("hb")
    store.heartbeat("hb:1", 0.2)
    assert store.alive(["hb:1", "hb:2"]) == [True, False]
    time.sleep(0.3)
    assert store.alive(["hb:1"]) == [False]


def test_job_ids_lists_published_jobs(store_for):
    a, b = store_for("alpha"), store_for("beta")
    a.control.hset(a.key("job"), "spec", "{}")
    b.control.hset(b.key("job"), "spec", "{}")
    assert {"alpha", "beta"} <= set(Store.job_ids(a.control))
    a.remove_job()
    b.remove_job()
