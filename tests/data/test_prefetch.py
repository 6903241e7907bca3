"""The prefetch thread: order, depth, errors handed to the consumer, and stopping when its owner goes away."""
import gc
import threading
import time

import pytest

from pycaffe_dist.data.prefetch import Prefetcher
from pycaffe_dist.errors import DataError


def counter():
    state = {"n": 0}

    def make_batch():
        state["n"] += 1
        return state["n"]
    return make_batch, state


def test_batches_come_in_order_and_at_most_depth_ahead():
    make_batch, state = counter()
    p = Prefetcher(make_batch, depth=3)
    assert [p.next() for _ in range(5)] == [1, 2, 3, 4, 5]
    time.sleep(0.3)
    # 5 taken, 3 queued, and one more made that waits for room in the queue.
    assert state["n"] <= 5 + 3 + 1
    p.close()
    assert not p.thread.is_alive()


def test_an_error_reaches_the_consumer_at_the_batch_it_spoiled():
    calls = {"n": 0}

    def make_batch():
        calls["n"] += 1
        if calls["n"] == 3:
            raise DataError("file x: truncated record at byte 96")
        return calls["n"]
    p = Prefetcher(make_batch, depth=4)
    assert p.next() == 1 and p.next() == 2
    with pytest.raises(DataError, match="truncated record at byte 96"):
        p.next()
    p.thread.join(timeout=2)
    assert not p.thread.is_alive()      # the thread stops after an error: nothing read past it


def test_waiting_time_is_measured():
    def slow_batch():
        time.sleep(0.05)
        return 0
    p = Prefetcher(slow_batch, depth=1)
    for _ in range(4):
        p.next()
    assert p.batches_taken == 4 and p.wait_s >= 0.1
    p.close()


def test_thread_stops_when_its_owner_is_collected():
    class Owner:
        pass
    owner = Owner()
    make_batch, _ = counter()
    p = Prefetcher(make_batch, depth=2, owner=owner)
    thread = p.thread
    del owner
    gc.collect()
    thread.join(timeout=2)
    assert not thread.is_alive()
    assert thread not in threading.enumerate()
