"""What worker 0 of an all-reduce job does besides training, on a thread of its own so that training goes on: the
tests (with Caffe's log lines), the snapshots, the checkpoint on the job's store (keys.py: where the workers start
again after one is lost), the progress record the launcher and `dist_caffe status` show, and the coordinator's
requests (stop). Each job is handed over with copies of the arrays it needs, taken on the training thread at the
iteration it belongs to; the thread does them one at a time, in order, on a solver of its own (the test nets and
the snapshots' files)."""
import logging
import os
import queue
import threading
import time

from ...errors import StoreError
from ...solver.solver import Solver
from .. import wire

log = logging.getLogger("pycaffe_dist.solver")
PROGRESS_S = 0.5                # how often the progress record is written
SNAPSHOTS_KEPT = 10


class Keeper:
    def __init__(self, param, store, name, progress):
        """`param`: the job's solver (with its tests and snapshot settings); `name`: worker 0's control queue;
        `progress()`: the progress record's fields the training thread knows now."""
        self.solver = Solver(param)
        self.store, self.name, self.progress = store, name, progress
        self.stop_requested = False
        self.test_results, self.snapshots = [], []
        self.error = None
        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="keeper", daemon=True)
        self._thread.start()

    # --- what the training thread hands over -------------------------------------------------------------------------

    def test(self, weights, iteration):
        self._put(("test", [w.copy() for w in weights], None, iteration, 0))

    def snapshot(self, weights, history, iteration, current_step):
        self._put(("snapshot", [w.copy() for w in weights], [h.copy() for h in history], iteration, current_step))

    def checkpoint(self, weights, history_sets, iteration, current_step):
        self._put(("checkpoint", [w.copy() for w in weights], [[h.copy() for h in s] for s in history_sets],
                   iteration, current_step))

    def _put(self, job):
        self._raise()
        self._jobs.put(job)

    def finish(self):
        """Wait for every job handed over; the thread's error, if it had one, is raised here."""
        self._jobs.put(None)
        self._thread.join()
        self._raise()
        self._write_progress()

    def _raise(self):
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    # --- the thread ------------------------------------------------------------------------------------------------

    def _run(self):
        written = 0.0
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=0.1)
                except queue.Empty:
                    job = False
                if job is None:
                    return
                if job:
                    self._do(*job)
                if time.monotonic() - written > PROGRESS_S:
                    self._poll_control()
                    self._write_progress()
                    written = time.monotonic()
        except BaseException as exc:             # handed to the training thread
            self.error = exc

    def _do(self, kind, weights, history, iteration, current_step):
        if kind == "checkpoint":
            self.store.put_checkpoint(weights, history, iteration, current_step)
            return
        for mine, w in zip(self.solver.weights, weights):
            mine[...] = w
        if kind == "test":
            scores = self.solver.test_at(iteration)
            elapsed = self.progress().get("elapsed_s", 0.0)
            for i, net_scores in enumerate(scores):
                self.test_results.append({"iter": iteration, "time_s": elapsed, "net": i,
                                          "scores": dict(net_scores)})
        elif kind == "snapshot":
            for mine, h in zip(self.solver.history, history):
                mine[...] = h
            self.solver.set_position(iteration, current_step)
            model = self.solver.snapshot_at(iteration)[0]
            self.snapshots = (self.snapshots + [os.path.abspath(model)])[-SNAPSHOTS_KEPT:]

    def _poll_control(self):
        while True:
            message = self.store.next_reply(self.name, 0, wire.CONTROL)
            if message is None:
                return
            if message["status"] == "stop":
                self.stop_requested = True

    def _write_progress(self):
        try:
            self.store.put_progress(dict(self.progress(), test=self.test_results[-1] if self.test_results else None,
                                         tests=self.test_results, snapshots=self.snapshots))
        except StoreError:
            pass                    # a display's record; the checkpoint's failure is the one that counts
