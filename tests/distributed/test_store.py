"""The parameter store against a real redis-server: blob round trips, bounded and checked reads, sharding over
two servers, messages, heartbeats, members and a job's keys."""
import os
import time

import numpy as np
import pytest

from pycaffe_dist.distributed import wire
from pycaffe_dist.distributed.launch import LocalRedis
from pycaffe_dist.distributed.redis_client import connect
from pycaffe_dist.distributed.data_parallel.keys import DataParallelStore
from pycaffe_dist.distributed.store import HEADER, job_ids
from pycaffe_dist.errors import StoreError

from .conftest import keys_of

pytestmark = pytest.mark.redis
SHAPES = [(20, 1, 5, 5), (20,), (500, 800), (3,)]


def _arrays(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def test_blobs_round_trip_bit_exact_with_their_version(store_for, redis_client):
    store = store_for("rt")
    arrays = _arrays(0)
    store.put_weights(arrays, count=7, current_step=2)
    got, version = store.get_weights(SHAPES)
    assert version == 7 and all(np.array_equal(a, b) for a, b in zip(arrays, got))
    assert store.master_state() == {"count": 7, "current_step": 2}       # written with W
    raw = redis_client.get("pcd:rt:W:0")
    assert len(raw) == HEADER + 4 * sum(a.size for a in arrays)  # raw little-endian float32 behind a uint64 version
    assert np.array_equal(np.frombuffer(raw, "<f4", offset=HEADER), np.concatenate([a.ravel() for a in arrays]))
    store.put_result("5", _arrays(1), round_id=3)
    assert np.array_equal(store.get_result("5", SHAPES)[0], _arrays(1)[0])
    assert redis_client.exists("pcd:rt:x:5:0")
    assert store.get_history(1, SHAPES) is None
    store.put_history(1, _arrays(2), count=7)
    assert np.array_equal(store.get_history(1, SHAPES)[3], _arrays(2)[3])
    store.remove_job()
    assert keys_of(redis_client, "rt") == []


def test_reads_are_checked_against_the_expected_shapes(store_for, redis_client):
    store = store_for("shapes")
    store.put_weights(_arrays(0), 0, 0)
    with pytest.raises(StoreError, match=r"pcd:shapes:W:0 holds 1602100 bytes but blobs 20x1x5x5, 20, 500x801, 3 "
                                         r"need 1604100 there"):
        store.get_weights(SHAPES[:2] + [(500, 801)] + SHAPES[3:])
    with pytest.raises(StoreError, match="pcd:shapes:x:1:0 is missing from Redis"):
        store.get_result("1", SHAPES)
    with pytest.raises(TypeError, match="a list of arrays, not one array"):      # not its rows as blobs
        store.put_result("1", np.zeros((3, 4), np.float32), 0)
    store.remove_job()
    assert keys_of(redis_client, "shapes") == []


@pytest.mark.parametrize("servers", [2, 3])
def test_blobs_shard_over_servers_in_equal_slices(redis_server, monkeypatch, servers):
    extra = [LocalRedis() for _ in range(servers - 1)]
    try:
        monkeypatch.setenv("PCD_REDIS_PASSWORD", redis_server.password)
        # Each server has its own password: give them in the URLs.
        urls = [s.url.replace("//", "//:%s@" % s.password) for s in [redis_server] + extra]
        clients = [connect(u) for u in urls]
        store = DataParallelStore(urls, "sharded")
        arrays = _arrays(2)
        store.put_weights(arrays, 4, 0)
        got, version = store.get_weights(SHAPES)
        assert version == 4 and all(np.array_equal(a, b) for a, b in zip(arrays, got))
        # One slice per server, of equal size, though one blob holds 99 % of the floats.
        total = sum(a.size for a in arrays)
        for k, client in enumerate(clients):
            assert abs(client.strlen("pcd:sharded:W:%d" % k) - HEADER - 4 * total / servers) <= 4
        assert not clients[1].exists("pcd:sharded:state")          # every key but the blobs: on the first
        store.put_result("7", _arrays(3), 1)
        assert all(np.array_equal(a, b) for a, b in zip(_arrays(3), store.get_result("7", SHAPES)))
        # A parameter server shard reads and writes its own server's slice: the blobs end to end, cut at the layout.
        flat = np.concatenate([a.reshape(-1) for a in arrays])
        layout, start = store.layout(SHAPES), 0
        for k, (count, pieces) in enumerate(layout):
            out = np.empty(count, np.float32)
            assert store.get_weights_slice(k, out) == 4 and np.array_equal(out, flat[start:start + count])
            assert pieces[0][3] == 0 and sum(stop - begin for _, begin, stop, _ in pieces) == count
            store.put_weights_slice(k, out + 1, 9, current_step=3)
            start += count
        got, version = store.get_weights(SHAPES)
        assert version == 9 and all(np.array_equal(a + 1, b) for a, b in zip(arrays, got))
        assert store.master_state() == {"count": 9, "current_step": 3}     # with the first shard's slice
        with pytest.raises(StoreError, match=r"W:1 holds \d+ bytes but its slice of \d+ floats needs"):
            store.get_weights_slice(1, np.empty(layout[1][0] + 1, np.float32))
        # A torn write (the slices of two versions) is not taken for W.
        clients[1].setrange("pcd:sharded:W:1", 0, np.uint64(5).tobytes())
        with pytest.raises(StoreError, match="keep changing while being read"):
            store.get_weights(SHAPES)
        store.remove_job()
        assert all(keys_of(client, "sharded") == [] for client in clients)
    finally:
        for server in extra:
            server.stop()


def test_messages_are_checked_and_a_bad_one_is_dropped_with_a_line(store_for, redis_client, caplog):
    store = store_for("msg")
    store.send_to_master({"type": "join", "worker": "3", "pid": 7, "extra": "dropped"})
    assert store.next_message(0, wire.INBOX) == {"type": "join", "worker": "3", "pid": 7}
    assert store.next_message(0, wire.INBOX) is None
    store.reply_to("3", {"status": "welcome"})
    assert store.next_reply("3", 0, wire.REPLY) == {"status": "welcome"}
    assert store.next_reply("3", 0, wire.REPLY) is None
    bad = [(b"\x80\x04pickle", "pcd:msg:inbox: a message that is not JSON"),
           (b"[1, 2]", "is not a JSON object"),
           (b" " * (2 << 20), "a message of 2097152 bytes"),
           (b'{"type": "result", "worker": "0", "round": 1, "epoch": "x"}',
            "whose 'epoch' is 'x', where a non-negative integer"),
           (b'{"type": "join", "worker": "0", "pid": "abc"}', "whose 'pid' is 'abc'"),
           (b'{"type": "join", "worker": "../0"}', "where a worker id"),
           (b'{"type": "result", "worker": "0", "epoch": 1}', "without its field 'round'"),
           (b'{"type": "hello", "worker": "0"}', "whose type is 'hello'")]
    for raw, line in bad:
        redis_client.lpush("pcd:msg:inbox", raw)
        with caplog.at_level("WARNING"):
            caplog.clear()
            assert store.next_message(0, wire.INBOX) is None          # dropped, not the end of the job
        assert line in caplog.text, caplog.text
    assert store.refused == len(bad)
    store.send_to_master({"type": "leave", "worker": 1})
    store.publish_job({"mode": "async"})                    # publishing empties the inbox
    assert store.next_message(0, wire.INBOX) is None
    for k in range(100):
        store.send_to_master({"type": "ready", "worker": k})
        if k == 10:
            store.send_to_master({"type": "ready", "worker": -1})   # dropped from the batch, the rest go on
    assert [m["worker"] for m in store.next_messages(1, 64, wire.INBOX)] == [str(k) for k in range(63)]
    assert [m["worker"] for m in store.next_messages(1, 64, wire.INBOX)] == [str(k) for k in range(63, 100)]
    assert store.next_messages(0, 64, wire.INBOX) == []
    store.reply_to_each([("3", {"status": "merged"}), ("4", {"status": "dropped"}), ("3", {"status": "stop"})])
    assert [store.next_reply("3", 0, wire.REPLY), store.next_reply("4", 0, wire.REPLY),
            store.next_reply("3", 0, wire.REPLY)] == [{"status": "merged"}, {"status": "dropped"}, {"status": "stop"}]
    store.remove_job()


def test_a_key_of_the_wrong_type_is_damaged_data_naming_the_key(store_for, redis_client):
    store = store_for("wrongtype")
    redis_client.hset("pcd:wrongtype:inbox", "a", "b")
    with pytest.raises(wire.DamagedData, match="pcd:wrongtype:inbox holds a value of the wrong type"):
        store.next_message(0, wire.INBOX)
    # a pipeline's failed command names the key too (a BRPOP that found a list, then LRANGE the hash put there)
    with pytest.raises(wire.DamagedData, match="pcd:wrongtype:inbox holds a value of the wrong type"):
        store._pipeline(lambda pipe: pipe.lrange("pcd:wrongtype:inbox", -63, -1))
    redis_client.rpush("pcd:wrongtype:W:0", "x")
    with pytest.raises(wire.DamagedData, match="pcd:wrongtype:W:0 holds a value of the wrong type"):
        store.get_weights(SHAPES)
    redis_client.set("pcd:wrongtype:W:0", b"\0" * 12)
    with pytest.raises(wire.DamagedData, match="pcd:wrongtype:W:0 holds 12 bytes .* damaged"):
        store.get_weights(SHAPES)
    store.remove_job()


def test_one_master_per_job(store_for):
    first, second = store_for("lease"), store_for("lease")
    first.claim_master(0.5)
    first.master_heartbeat(0.5)
    with pytest.raises(StoreError, match=r"job lease already has a live master \(pid %d on " % os.getpid()):
        second.claim_master(0.5)
    time.sleep(0.6)                             # the first stops renewing: its lease lapses
    second.claim_master(0.5, wait_s=1.0)
    with pytest.raises(StoreError, match="another master .* took the job's lease"):
        first.master_heartbeat(0.5)
    second.remove_job()


def test_heartbeats_expire(store_for):
    store = store_for("hb")
    store.worker_heartbeat("1", 0.2)
    store.master_heartbeat(0.2)
    assert store.workers_alive(["1", "2"]) == [True, False] and store.master_alive()
    time.sleep(0.3)
    assert store.workers_alive(["1"]) == [False] and not store.master_alive()
    store.worker_heartbeat("1", 5)
    store.reply_to("1", {"status": "stop"})
    store.leave("1")
    assert store.workers_alive(["1"]) == [False] and store.next_reply("1", 0, wire.REPLY) is None


def test_the_job_its_members_and_worker_ids(store_for, redis_server, monkeypatch):
    a, b = store_for("alpha"), store_for("beta")
    assert a.job_spec() is None and a.job_state() is None
    assert a.publish_job({"mode": "sync"}) == 1 and a.publish_job({"mode": "async"}) == 2     # epochs
    assert a.job_spec() == {"mode": "async"} and a.job_state() == "running"
    a.finish_job()
    assert a.job_state() == "done"
    b.publish_job({})
    monkeypatch.setenv("PCD_REDIS_PASSWORD", redis_server.password)
    assert {"alpha", "beta"} <= set(job_ids(redis_server.url))
    a.add_member("0", {"host": "h", "pid": 1, "slot": 0})
    assert a.members() == {"0": {"host": "h", "pid": 1, "slot": 0}}
    assert [a.claim_worker_id(), a.claim_worker_id(), a.claim_worker_id(7)] == ["0", "1", "7"]
    assert a.claim_worker_id() == "2"
    with pytest.raises(StoreError, match="job alpha already has a worker 7"):
        a.claim_worker_id(7)
    a.put_progress({"count": 3})
    assert a.progress() == {"count": 3}
    a.remove_job()
    b.remove_job()
    assert a.job_spec() is None
