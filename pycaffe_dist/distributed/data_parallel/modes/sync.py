"""Synchronous SGD: a barrier per round; W += the mean of the deltas of the workers that delivered. A worker
that stops beating its heart is left out of the round after the heartbeat timeout (and the log says so); one
that joins takes part from the next round. The mean is over the deltas that arrived (SpeeDO divided by the
number of workers even when some were missing). Overlapped (the default), a worker computes round r+1 from the
W of round r-1 plus its own delta of round r while the barrier of round r closes: W itself only moves by the
barrier's mean, and the workers are at most one round behind it; `--no-overlap` waits at every barrier.

Backup workers (`--backup b`, Chen, Pan, Monga, Bengio and Jozefowicz 2016): a round closes as soon as all but b
of its workers have delivered, so the slowest b never hold it up. A straggler's result that arrives after its
round closed is dropped (the reply says so, and the worker starts again from the new W); its next result counts
in the round open then.

The learning rate: a round merges the mean of N deltas, one step of a batch N times larger, so the workers' rate
is the solver's times N (the linear scaling rule, lr_scaling.py): the round is then worth N of one process's steps.

The deltas are summed in the order of the workers' data slots, whatever order they arrive in (SlotOrderSum):
float32 addition is not associative, and a sum in arrival order made two runs of one job differ in the last bits
from 3 workers on (and local-sgd's plain averaging could not be held to sync's bit for bit)."""
import numpy as np
import logging

from .base import COMPRESS, OVERLAP, SCALING, TAU, DeltaRoundRule, Drop, Merge, Option, Reply, Rule, at_least

BACKUP = Option("backup", int, 0, "close each round when all but B workers have delivered, and drop the late "
                "results (backup workers)", at_least(0))
OPTIONS = (TAU, BACKUP, OVERLAP, COMPRESS) + SCALING
RoundRule = DeltaRoundRule       # this mode's worker side
log = logging.getLogger("pycaffe_dist.solver")


class SlotOrderSum:
    """The sum of a round's results in slot order (`key`: a worker's place in it). A result is added as it comes
    when no worker before it is still awaited, straight from the reader's arrays; one that comes early is kept (a
    copy) until those before it are in or out of the round."""

    def __init__(self, key):
        self.key, self.sum, self.early = key, None, {}

    def add(self, worker, arrays, waiting):
        """`worker`'s result; `waiting`: the workers whose results the round still awaits (members all: a worker
        that is gone may have delivered, so an early result keeps its place with it)."""
        place = self.key(worker)
        if any(self.key(w) < place for w in waiting):
            self.early[place] = [np.array(a, dtype=np.float32) for a in arrays]
        else:
            self._accumulate(arrays)
            self.drain(waiting)

    def drain(self, waiting=()):
        """Add the early results that no awaited worker comes before any more (all of them, with none awaited)."""
        first = min(map(self.key, waiting), default=None)
        for place in sorted(self.early):
            if first is not None and place > first:
                break
            self._accumulate(self.early.pop(place))

    def _accumulate(self, arrays):
        if self.sum is None:
            self.sum = [np.array(a, dtype=np.float32) for a in arrays]
        else:
            for t, a in zip(self.sum, arrays):
                t += a


class MergeRule(Rule):
    advice = "lower the solver's base_lr"
    broadcasts_updates = True

    def __init__(self, view, options):
        super().__init__(view, options)
        self.backup = options["backup"]
        self.round = 0
        self.due = {}              # worker -> the round its next result counts in
        self.waiting, self.delivered, self.joining = set(), [], []
        self.total, self.results = None, []

    def start(self, workers):
        self._open_round(workers)
        for w in workers:
            self.due[w] = self.round
        return [Reply(w, "welcome") for w in workers]

    def _open_round(self, workers):
        self.round += 1
        self.waiting, self.delivered, self.results = set(workers), [], []
        self.total = SlotOrderSum(lambda w: (self.view.slot(w), int(w)))

    def on_join(self, worker):
        if not self.waiting and not self.delivered:
            self.waiting.add(worker)
            self.due[worker] = self.round
            return [Reply(worker, "welcome")]
        self.joining.append(worker)
        return []

    def on_lost(self, worker):
        self.due.pop(worker, None)
        if worker in self.joining:
            self.joining.remove(worker)
        if worker not in self.waiting:
            return []
        self.waiting.discard(worker)
        log.warning("Synchronous round: worker %s is gone; the round goes on with %d worker(s)",
                    worker, len(self.delivered) + len(self.waiting))
        return self._maybe_close()

    def on_result(self, result):
        worker = result.worker
        if worker not in self.waiting:
            return []
        if self.due[worker] < self.round:
            # Computed for a round that closed without it: the others' mean has moved W on.
            self.due[worker] = self.round
            return [Drop(result), Reply(worker, "dropped")]
        self.waiting.discard(worker)
        self.total.add(worker, result.arrays, self.waiting)
        self.delivered.append(worker)
        self.results.append(result)
        return self._maybe_close()

    def _maybe_close(self):
        """The round's merge and replies, once all but --backup of its workers have delivered; else nothing."""
        if self.waiting and not (self.delivered and len(self.waiting) <= self.backup):
            return []
        actions = []
        if self.delivered:
            self.total.drain()
            finite = all(r.non_finite is None for r in self.results)     # (else the master refuses the merge)
            actions.append(Merge(self.results, adds=self.step(self.total.sum, len(self.delivered), finite)))
        stragglers, everyone = sorted(self.waiting), self.delivered + self.joining
        self.joining = []
        status = {w: "merged" for w in self.delivered}
        self._open_round(everyone + stragglers)
        for w in everyone:
            self.due[w] = self.round
            actions.append(Reply(w, status.get(w, "welcome")))
        return actions

    def step(self, total, count, finite=True):
        """How W moves by the round's `count` results, summed in `total` (the Merge's adds): by their mean
        (local-sgd: its outer step). `finite`: whether every result is finite (a merge of one that is not, the
        master refuses: a rule's own state must not take it in)."""
        return [(total, 1.0 / count)]
