"""What the master sends, on a thread of its own while merging goes on: W (with the master's state, in one
transaction), the compressed change of W (broadcast.py) and the replies. They go out in the order they were
queued, and a reply only after the W it speaks of, so that a worker that pulls after its reply sees its merge."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class Publisher:
    def __init__(self, store, shapes):
        self.store = store
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="publish")
        self.copy = [np.empty(s, np.float32) for s in shapes]     # W as it is written: merging goes on meanwhile
        self.in_flight = None                   # the publish under way
        self.replies = []                       # [(worker, message)] queued since the last publish

    def reply(self, worker, message):
        self.replies.append((worker, message))

    def restamp(self, fields):
        """Every queued reply with `fields` over its own (a reset: whatever it said, the worker starts from W)."""
        self.replies = [(w, dict(m, **fields)) for w, m in self.replies]

    def publish(self, weights=None, state=None, update=None):
        """Send W at `state` (merge count, current_step) where `weights` are given, `update` (W's compressed
        change, a payload of its own) before it, then the queued replies. The last publish is waited for first."""
        self.wait()
        if weights is not None:
            for copy, w in zip(self.copy, weights):
                copy[...] = w
        replies, self.replies = self.replies, []
        self.in_flight = self.thread.submit(self._send, state if weights is not None else None, replies, update)

    def _send(self, state, replies, update):
        if update is not None:
            self.store.put_update(update, state[0])     # before the replies, as W: a worker pulls after its reply
        if state is not None:
            self.store.put_weights(self.copy, *state)
        self.store.reply_to_each(replies)

    def wait(self):
        """Until the last publish is done (its error, if it had one, raised here)."""
        if self.in_flight is not None:
            in_flight, self.in_flight = self.in_flight, None
            in_flight.result()

    def close(self):
        self.thread.shutdown(wait=True)
