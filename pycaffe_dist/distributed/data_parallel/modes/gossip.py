"""Gossip SGD (Jin, Yuan, Iandola and Keutzer 2016, "How to scale distributed deep learning?"): there is no central
W to merge into. Every worker keeps its own weights; after each round of tau local steps it publishes them (its
result key, x:{worker}, the store's zero-copy blobs), reads the weights one peer last published, the peer chosen
at random among the live workers the master listed in its reply, and moves to the average of the two.

One-sided push-pull, without locks. The classic exchange, where both of a pair end at the pair's mean, needs the
two copies swapped at one instant: through Redis that takes a lock or a second message. Here only the worker that
pulls moves; its peer moves when it pulls in turn. What that guarantees:
  - every read is a whole copy of one state the peer published (a SET is atomic; slices on several servers are
    read again until their versions agree), and no worker ever waits for another;
  - the workers' mean is kept only approximately: one averaging moves the sum by (x_peer - x_self) / 2, but with
    every worker pulling from a uniformly random other, the expected change of the sum over a round is zero;
  - the spread shrinks: each averaging halves the distance between a worker and the copy it read (overlapped: see
    below), which is why the workers stay close enough for their mean (what the master tests and snapshots) to be a
    good model;
  - a worker overlapped with its exchange (the default; --no-overlap waits for it) read the peer's copy when it
    published its own weights of a round ago: it moves by a quarter of (that copy - those weights of its own), two
    states of one age, added to where it is now (next_start). Averaged with where it is now instead, as it was, the
    stale copy took back half of every round's step: LeNet's images to 0.85 at 8 and 16 workers were 1.67-1.83x and
    2.5x one process's, against 1.17-1.33x and 1.83x now (bench/scaling.py --images, 2-3 runs each; without the
    overlap 1.33x and 1.83x). A quarter, not a half: with half, two workers' spread follows d' = d - d_before, whose
    roots have modulus 1, so it never shrinks (a job at 2 workers diverged); with a quarter it shrinks by 0.71 a
    round, as the plain half-average's does;
  - a worker with no live peer, or whose peer was counted out between the reply and the read (the master removes
    a lost worker's key), skips that round's averaging.

The master only keeps the job: membership, the live list, and the count. One global iteration is one round of
every live worker (as in sync: the learning-rate schedule, max_iter, display, test_interval and snapshot count
rounds of the N workers, so the images of B batches are B / N iterations): each worker's local steps run at the
rate of that count, which stays the same for a worker that joins late. Every test_interval, and for each
snapshot, the master reads the live workers' weights and tests their mean; a worker that joins starts from that
mean too. Nothing else is read centrally: no process sees every worker's weights between tests. The master
writes W (the mean) and its count to Redis only then, so a master restarted with --resume goes on from the count
of its last test, snapshot or join, and resets the live workers to their mean.

The learning rate: the workers' mean moves by the mean of their steps, one step of N batches per round, so the
local rate is the solver's times N (lr_scaling.py), as in sync. After a backoff of that rate the workers restart
from W, the last good mean, none of their own weights averaged in (restart)."""
import math
import random

import numpy as np

from ....errors import DivergedError
from .base import OVERLAP, SCALING, TAU, Average, Forget, Merge, Reply, Rule

OPTIONS = (TAU, OVERLAP) + SCALING


class RoundRule:
    gradients = False

    @staticmethod
    def result(x_start, x_end, gradients, centre, options, workers):
        # What it publishes: its own weights, copied because the exchange sends them while the next round runs.
        return [np.array(x, dtype=np.float32) for x in x_end]

    @staticmethod
    def choose_peer(peers):
        """The peer to average with: one of the live others the master listed, uniformly, or None."""
        return str(random.choice(peers)) if peers else None

    @staticmethod
    def next_start(status, pulled, x_end, result, in_flight, answered=None):
        if status == "peer":
            if in_flight and answered is not None:
                # Overlapped: the peer's copy was read when this worker published `answered`, a round before
                # x_end; the move is taken between those two, of one age, and added to x_end (the docstring: why a
                # quarter, and what averaging with x_end itself cost)
                return [x + np.float32(0.25) * (p - a) for x, p, a in zip(x_end, pulled, answered)]
            return [np.float32(0.5) * (x + p) for x, p in zip(x_end, pulled)]
        if status in ("alone", "merged"):       # no peer this round; or the first round, started from W itself
            return x_end
        return pulled                           # a reset: start again from W, the mean the master gathered

    @staticmethod
    def base(version, status, in_flight):
        return version


class MergeRule(Rule):
    reads_results = False                       # the weights go from worker to worker, not through the master
    advice = "lower the solver's base_lr"

    def __init__(self, view, options):
        super().__init__(view, options)
        self.live = []                          # the workers peers are chosen from
        self.pending = []                       # the results of the global iteration under way
        self.rounds, self.averagings = {}, {}   # worker -> its rounds, and the averagings it reported
        self.unsettled = False                  # whether the workers moved since W was last made their mean

    def start(self, workers):
        # A restarted master's workers are reset to the mean of their weights (none on a first start).
        self.live, self.unsettled = list(workers), True
        return self.settle_weights() + super().start(workers)

    def restart(self, workers, from_weights=False):
        if from_weights:            # W is the last good mean; the workers' own weights may hold NaN: none averaged
            self.live, self.unsettled, self.pending = list(workers), False, []
            # nor may a peer pull them: each publishes its own again after its next round
            return [Forget(worker) for worker in workers] + Rule.start(self, workers)
        return self.start(workers)  # a restarted master has no W of its own: their mean, as at its start

    def on_join(self, worker):
        self.unsettled = True
        actions = self.settle_weights()         # the newcomer starts from the others' mean
        self.live.append(worker)
        return actions + [Reply(worker, "welcome")]

    def on_lost(self, worker):
        if worker in self.live:
            self.live.remove(worker)
        # a peer that chose it before the news skips its averaging
        return [Forget(worker)] + self._count()

    def on_result(self, result):
        worker, message = result.worker, result.message
        loss = float(message.get("loss", 0.0))
        if not math.isfinite(loss):
            # Its weights would spread to its peers; the master reads none between tests to check them.
            raise DivergedError("worker %s's loss is %s" % (worker, loss))
        self.rounds[worker] = self.rounds.get(worker, 0) + 1
        self.averagings[worker] = int(message.get("averagings", 0))
        self.unsettled = True
        self.pending.append(result)
        return self._count() + [Reply(worker, "merged", {"peers": [w for w in self.live if w != worker]})]

    def _count(self):
        if self.pending and len(self.pending) >= len(self.live):
            results, self.pending = self.pending, []
            return [Merge(results)]             # one global iteration: a round of each live worker
        return []

    def settle_weights(self):
        actions = [Average(list(self.live))] if self.unsettled and self.live else []
        self.unsettled = False
        return actions

    def summary(self):
        live = [w for w in self.live if self.rounds.get(w)]
        rounds = sum(self.rounds[w] for w in live)
        averagings = sum(self.averagings.get(w, 0) for w in live)
        return {"averagings_per_worker": averagings / max(1, len(live)),
                "averaged_share": averagings / max(1, rounds)}
