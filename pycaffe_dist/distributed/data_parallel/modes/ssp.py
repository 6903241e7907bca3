"""Partially synchronous SGD with true bounded staleness (`--max-advance s`): results merge as in async (scaled by
1/their staleness, or 1/--factor), but a
worker may start round k only while k - (rounds completed by the slowest live worker) <= s. Only a worker that
is too far ahead waits, and only until the slowest catches up; SpeeDO instead stopped everybody at a global
barrier whenever the spread reached s. The reply to round r allows round r + 1 + depth (depth 1 overlaps an
exchange with the next round; with s = 0 the workers don't overlap, so that the slowest can always go on).
The learning rate is async's: the solver's times the typical staleness (lr_scaling.py, Rule.merged_work)."""
from .base import FACTOR, OVERLAP, SCALING, TAU, DeltaRoundRule, Merge, Option, Reply, StalenessAwareRule, at_least

MAX_ADVANCE = Option("max_advance", int, 1, "rounds a worker may run ahead of the slowest", at_least(0))
OPTIONS = (TAU, MAX_ADVANCE, FACTOR, OVERLAP) + SCALING
RoundRule = DeltaRoundRule       # this mode's worker side


class MergeRule(StalenessAwareRule):

    def __init__(self, view, options):
        super().__init__(view, options)
        self.max_advance = options["max_advance"]
        self.depth = 1 if self.max_advance >= 1 and options["overlap"] is not False else 0
        self.completed, self.held = {}, []

    def start(self, workers):
        for w in workers:
            self.completed[w] = 0
        return super().start(workers)

    def on_join(self, worker):
        # A newcomer counts as level with the fastest, so that it does not hold the others back.
        self.completed[worker] = max(self.completed.values(), default=0)
        return [Reply(worker, "welcome")]

    def on_lost(self, worker):
        self.completed.pop(worker, None)
        if worker in self.held:
            self.held.remove(worker)
        return self._release()

    def on_result(self, result):
        worker = result.worker
        merge = Merge([result], adds=[(result.arrays, self.scale(result))])
        self.completed[worker] = self.completed.get(worker, 0) + 1
        self.held.append(worker)
        return [merge] + self._release()

    def _release(self):
        """The replies to the held workers that may go on now."""
        slowest = min(self.completed.values(), default=0)
        released = [w for w in self.held if self.completed[w] + self.depth - slowest <= self.max_advance]
        self.held = [w for w in self.held if w not in released]
        return [Reply(w, "merged") for w in released]
