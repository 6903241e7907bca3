"""W on the data-parallel master and what moves it: the workers' results read for the rule (results.py's reader), a
rule's Merge carried out on W (its adds, or the solver's update rule from a gradient), the mean of the workers' own
weights (gossip), each round's compressed change (broadcast.py), and the staleness results are merged by."""
import numpy as np
from scipy.linalg.blas import saxpy

from ...errors import DivergedError
from .. import wire
from .modes.base import Result
from .results import first_non_finite

STALENESS_WEIGHT = 0.02     # of each result in the running average of the staleness


def add_scaled(weights, arrays, scale):
    """weights += scale * arrays, array by array (BLAS's saxpy: one pass, without the GIL); a parameter server
    shard (shard.py) moves its slice of W by the same function, to the same bits."""
    for w, a in zip(weights, arrays):
        if scale == 1:
            w += a
        else:
            saxpy(a.reshape(-1), w.reshape(-1), a=scale)


class ResultLost(Exception):
    """A worker's result is not on Redis (a server restarted empty between its write and its notice), or is
    damaged there."""


class Staleness:
    """The staleness of the results merged at 1/their staleness: summed for the summary's mean, and averaged over
    the last ~50 results for the rate's scale (it follows the workers as they join, leave or change speed)."""

    def __init__(self):
        self.total = self.count = 0
        self.recent = None

    @staticmethod
    def of(message, merges):
        """Merges W took since the weights the result of `message` started from ('base', a merge count), its own
        merge included: 1 for a result computed on the latest W."""
        return max(1, merges - int(message.get("base", merges)) + 1)

    def record(self, stale):
        self.total += stale
        self.count += 1
        self.recent = stale if self.recent is None else self.recent + STALENESS_WEIGHT * (stale - self.recent)

    def mean(self):
        return self.total / self.count if self.count else None


class GlobalWeights:
    """W (the solver's weights, in place) with the reader of the workers' results and, where W's changes are sent
    compressed, the updates (broadcast.MasterUpdates). `dirty`: W changed since it was last published."""

    def __init__(self, solver, reader, store, updates=None):
        self.solver, self.arrays = solver, solver.weights
        self.names = solver.weight_names()
        self.reader, self.store, self.updates = reader, store, updates
        self.dirty = True
        self.in_use = []                        # the reader's arrays a merge has taken

    def blob(self, index):
        layer, _, number = self.names[index].rpartition("/")
        return "layer %s's blob %s" % (layer, number)

    def read(self, worker, message, staleness, with_arrays=True):
        """Worker `worker`'s result as its rule sees it (modes.base.Result): its arrays, read ahead or now (where
        `with_arrays`: the rule reads results), and its staleness. ResultLost where it is not on Redis."""
        arrays = bad = None
        if with_arrays:
            arrays, bad = self._take(worker)
            if arrays is None:
                raise ResultLost(worker)
            self.in_use.append(arrays)
        return Result(worker, message, arrays, staleness, bad)

    def release(self):
        """The reader's arrays that the results read since the last release lent the rule, given back."""
        for arrays in self.in_use:
            self.reader.release(arrays)
        self.in_use = []

    def _take(self, worker):
        """(worker's result, the index of its first blob holding NaN or Inf); (None, None) when it is not on Redis
        or damaged there (of another size or type, a foreign compressed payload): such a result is refused with one
        line, as a bad message is, and the worker starts again from W."""
        try:
            return self.reader.take(worker)
        except wire.DamagedData as exc:
            self.store.refuse("worker %s's result is not merged: %s" % (worker, exc))
            return None, None

    def refuse_non_finite(self, results):
        """A merge of results one of which holds NaN or Inf is refused: the job stops (DivergedError) with W as it
        was."""
        for result in results:
            if result.non_finite is not None:
                raise DivergedError("worker %s's result holds NaN or Inf in %s" % (result.worker,
                                                                                  self.blob(result.non_finite)))

    def move(self, merge, merges, rate_scale):
        """W moved by a rule's Merge at merge count `merges` (its results checked: refuse_non_finite): its adds, or
        the solver's update rule from its gradients at the solver's rate times `rate_scale` times the merge's
        scale; with compressed updates W moves by the compressed change of the whole step only."""
        if self.updates is not None:
            self.updates.begin(self.arrays)
        for arrays, scale in merge.adds:
            self._add(arrays, scale)
        if merge.gradients is not None:
            self.solver.apply_gradients(merge.gradients, merges, merge.scale * rate_scale)
            self.dirty = True
        if self.updates is not None:
            self.updates.end(self.arrays, merges + 1)

    def _add(self, arrays, scale):
        add_scaled(self.arrays, arrays, scale)
        self.dirty = True

    def average(self, workers):
        """W = the mean of the workers' last results, those on Redis (gossip: their own weights), read on the
        reader's threads; one holding NaN or Inf stops the job (DivergedError) with W as it was."""
        for worker in workers:
            self.reader.start(worker)
        read = [(worker,) + self._take(worker) for worker in workers]
        read = [(worker, arrays, bad) for worker, arrays, bad in read if arrays is not None]
        try:
            for worker, _, bad in read:
                if bad is not None:
                    raise DivergedError("worker %s's weights hold NaN or Inf in %s" % (worker, self.blob(bad)))
            if read:
                for k, w in enumerate(self.arrays):
                    np.copyto(w, read[0][1][k])
                    for _, arrays, _ in read[1:]:
                        w += arrays[k]
                    w *= np.float32(1.0 / len(read))
                self.dirty = True
        finally:
            for _, arrays, _ in read:
                self.reader.release(arrays)

    def first_non_finite(self):
        """The index of W's first blob holding NaN or Inf (merges of finite results can still overflow), or None."""
        return first_non_finite(self.arrays)
