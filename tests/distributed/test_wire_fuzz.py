"""The wire fuzzed: mutations of valid messages (tests/fixtures/wire/corpus.json), of a real job spec and of the
blob framing, seeded and bounded, fed through the real readers (a real redis-server) and, for the inbox, through a
real master's handling of each message; kept regressions (tests/fixtures/wire/regressions) first. The rule is
the faults': only our own error types, one line, no hang."""
import json
import math
import random
import time

import numpy as np
import pytest

from pycaffe_dist.distributed import job as jobs
from pycaffe_dist.distributed import wire
from pycaffe_dist.distributed.data_parallel.keys import SPEC as DATA_PARALLEL
from pycaffe_dist.distributed.data_parallel.master import Master, Settings
from pycaffe_dist.errors import PycaffeDistError, StoreError

from .conftest import REPO

pytestmark = [pytest.mark.redis]

WIRE = REPO / "tests" / "fixtures" / "wire"
CORPUS = json.loads((WIRE / "corpus.json").read_text())
REGRESSIONS = sorted(WIRE.glob("regressions/*.json"))
MUTATIONS = 300                 # per schema: a few seconds in all
SLOWEST_S = 2.0                 # a reader or a handler that takes longer has hung
ODD_VALUES = [None, True, False, -1, 0, 1 << 70, -(1 << 70), 1e308, -1e308, math.nan, math.inf, "", "x" * 300,
              "0", "-1", "1e9", [], {}, [1, "a", None], {"a": {"b": []}}, 3.5, "\u0000\ud7ff", "../0"]


def mutate(message, rng):
    """A mutated copy of `message`, as the bytes a writer would push."""
    message = json.loads(json.dumps(message))
    for _ in range(rng.randint(1, 3)):
        choice = rng.random()
        keys = list(message)
        if choice < 0.45 and keys:
            message[rng.choice(keys)] = rng.choice(ODD_VALUES)
        elif choice < 0.55 and keys:
            del message[rng.choice(keys)]
        elif choice < 0.65:
            message[rng.choice(keys + ["x", "type", "status"])] = rng.choice(ODD_VALUES)
        elif choice < 0.7:
            message = rng.choice(ODD_VALUES)
            break
    raw = json.dumps(message).encode()
    choice = rng.random()
    if choice < 0.1:
        raw = raw[:rng.randrange(len(raw) + 1)]
    elif choice < 0.2:
        position = rng.randrange(len(raw))
        raw = raw[:position] + bytes([rng.randrange(256)]) + raw[position + 1:]
    elif choice < 0.25:
        raw = raw * rng.randint(2, 4)
    return raw


def within(seconds, work, *args):
    started = time.monotonic()
    try:
        return work(*args)
    finally:
        assert time.monotonic() - started < seconds, "%s hung on %r" % (work.__name__, args)


def checked_pop(store, queue, raw, schema, client):
    """Push raw bytes on `queue`, pop them through the store's reader: a checked message or None, never an
    exception."""
    client.lpush(store.key(queue), raw)
    if queue == "inbox":
        return within(SLOWEST_S, store.next_message, 0, schema)
    return within(SLOWEST_S, store.next_reply, queue.split(":", 1)[1], 0, schema)


@pytest.fixture
def master(make_solver, redis_server, monkeypatch):
    """A real master of an async job on the tiny net, published, with worker 0 a member whose result is on
    Redis (so that results merge)."""
    monkeypatch.setenv("PCD_REDIS_PASSWORD", redis_server.password)
    m = Master(Settings(redis=redis_server.url, solver=str(make_solver(max_iter=1 << 30)), job="fuzz",
                        workers=1, mode="async", heartbeat_s=5.0))
    m.publish()
    m._handle({"type": "join", "worker": "0"})
    m._handle({"type": "ready", "worker": "0"})
    m.store.put_result("0", [np.zeros(s, np.float32) for s in m.shapes], 0)
    yield m
    m.reader.close()
    m.publisher.close()
    m.store.remove_job()


def handle(master, message):
    """The master's own handling of one checked message: only our errors may come out."""
    try:
        within(SLOWEST_S, master._guarded, master._handle, message)
        within(SLOWEST_S, master._flush)
    except PycaffeDistError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_fuzzed_messages_are_checked_or_dropped_and_the_master_handles_what_passes(name, master, redis_client):
    schema, rng = getattr(wire, name), random.Random(name)
    queue = "inbox" if name.endswith("INBOX") else "go:5"
    passed = 0
    for case in range(MUTATIONS):
        raw = mutate(rng.choice(CORPUS[name]), rng)
        message = checked_pop(master.store, queue, raw, schema, redis_client)
        if message is None:
            continue
        passed += 1
        assert schema.check(message, "again") == message            # what passes is normalised once for all
        if schema is wire.INBOX:
            handle(master, message)
    for message in CORPUS[name]:                                     # the corpus itself passes
        assert checked_pop(master.store, queue, json.dumps(message), schema, redis_client) is not None
    assert 0 < passed < MUTATIONS
    assert master.store.refused >= MUTATIONS - passed


@pytest.mark.parametrize("path", [p for p in REGRESSIONS if "raw" in json.loads(p.read_text())],
                         ids=lambda p: p.stem)
def test_kept_message_regressions_are_dropped(path, master, redis_client):
    case = json.loads(path.read_text())
    raw = case["raw"].encode("latin-1")
    assert checked_pop(master.store, "inbox", raw, getattr(wire, case["schema"]), redis_client) is None


def _real_spec(master):
    return json.loads(json.dumps(master.spec))


def test_fuzzed_specs_are_checked_or_refused_in_one_line(master, redis_client):
    spec, rng = _real_spec(master), random.Random(7)
    key = master.store.key("job")
    for case in range(MUTATIONS):
        raw = mutate(spec, rng)
        redis_client.hset(key, "spec", raw)
        try:
            checked = within(SLOWEST_S, jobs.wait_for_spec, master.store, "fuzz", 0, DATA_PARALLEL)
        except StoreError as exc:
            assert "\n" not in str(exc) and key in str(exc) or "is not a data-parallel job" in str(exc), str(exc)
            continue
        jobs.worker_solver(checked["solver"], 0)                     # what passes builds a worker's solver


@pytest.mark.parametrize("path", [p for p in REGRESSIONS if "spec" in json.loads(p.read_text())],
                         ids=lambda p: p.stem)
def test_kept_spec_regressions_are_refused(path, master, redis_client):
    spec, fields = _real_spec(master), json.loads(path.read_text())["spec"]
    module = fields.pop("python_module", None)
    spec.update(fields)
    if module:
        spec["solver"] = spec["solver"].replace("net_param {", 'net_param { layer { name: "p" type: '
                                                '"Python" python_param { module: "%s" layer: "L" } }' % module, 1)
    redis_client.hset(master.store.key("job"), "spec", json.dumps(spec))
    with pytest.raises(StoreError, match=master.store.key("job")):
        jobs.wait_for_spec(master.store, "fuzz", 0, DATA_PARALLEL)


def test_fuzzed_blob_framing_is_read_or_refused_as_damaged(master, redis_client):
    rng = random.Random(11)
    key, shapes = master.store.key("W", 0), master.shapes
    good = redis_client.get(key)
    for case in range(MUTATIONS):
        raw = bytearray(good)
        choice = rng.random()
        if choice < 0.3:
            raw = raw[:rng.randrange(len(raw))]
        elif choice < 0.5:
            raw += bytes(rng.randrange(1, 64))
        else:
            for _ in range(rng.randint(1, 16)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        redis_client.set(key, bytes(raw))
        try:
            arrays, version = within(SLOWEST_S, master.store.get_weights, shapes)
        except StoreError as exc:               # DamagedData; "missing" for an empty value
            assert len(raw) != len(good) and key in str(exc), str(exc)
            continue
        assert len(raw) == len(good) and [a.shape for a in arrays] == [tuple(s) for s in shapes]


def test_fuzzed_replies_go_through_a_real_workers_handling(master, redis_client):
    """A worker of the fuzz job (its id claimed, its spec read as any worker's) takes fuzzed replies through its own
    wait for a reply and makes its Outcome of what passes; the rest are dropped, and only our errors come out."""
    from pycaffe_dist.distributed.data_parallel.worker import Outcome, Rejoin, Stopped, Worker
    worker = Worker(master.store.urls[0], "fuzz", wait_for_job_s=1.0, worker_id=5)
    worker.store.worker_heartbeat(worker.id, 5.0)
    rng, taken, queue = random.Random(13), 0, worker.store.key("go", worker.id)
    sentinel = {"status": "dropped", "iter": 424242}        # after each fuzzed reply: what a dropped one leaves
    for case in range(MUTATIONS):
        redis_client.delete(queue)
        redis_client.lpush(queue, mutate(rng.choice(CORPUS["REPLY"]), rng), json.dumps(sentinel))
        try:
            reply = within(SLOWEST_S, worker._await, lambda m: True)
        except (Stopped, Rejoin):
            continue
        except PycaffeDistError as exc:
            assert "\n" not in str(exc)
            continue
        if reply == sentinel:
            continue
        outcome = Outcome.of(reply, (None, 0))
        assert outcome.workers >= 1 and outcome.rate_scale > 0 and isinstance(outcome.iteration, int)
        taken += 1
    assert 0 < taken < MUTATIONS
