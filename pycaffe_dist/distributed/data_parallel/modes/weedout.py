"""Weed-out SGD (`--weedout n`): a result merges (as in async: scaled by 1/its staleness, or 1/--factor) only if
its worker's previous completion is among the last N completions, N = max(n, live workers); otherwise it is
dropped and the worker starts again from W. A straggler's stale work is thrown away instead of pulling W back.
The default n = 1 makes the window the live workers: in a round where every worker reports once each result is
kept, and a worker overtaken by a full round of the others is weeded out; it follows N as workers come and go.
(SpeeDO had no default: weed-out would not start without one.) The learning rate is async's: the solver's times
the typical staleness of the merged results (lr_scaling.py, Rule.merged_work)."""
from collections import deque

from .base import (FACTOR, OVERLAP, SCALING, TAU, DeltaRoundRule, Drop, Merge, Option, Reply, StalenessAwareRule,
                   at_least)

WEEDOUT = Option("weedout", int, 1, "merge a result only if its worker is among the last max(N, live workers) "
                 "to report", at_least(1))
OPTIONS = (TAU, WEEDOUT, FACTOR, OVERLAP) + SCALING
RoundRule = DeltaRoundRule       # this mode's worker side


class MergeRule(StalenessAwareRule):

    def __init__(self, view, options):
        super().__init__(view, options)
        self.n = options["weedout"]
        self.recent = deque()
        self.live = set()

    def _window(self):
        return max(self.n, len(self.live))

    def start(self, workers):
        self.live.update(workers)
        return super().start(workers)

    def on_join(self, worker):
        self.live.add(worker)
        self.recent.appendleft(worker)      # as SpeeDO: the newcomer enters as the oldest completion
        return [Reply(worker, "welcome")]

    def on_lost(self, worker):
        self.live.discard(worker)
        self.recent = deque(w for w in self.recent if w != worker)
        return []

    def on_result(self, result):
        worker = result.worker
        accept = len(self.recent) < self._window() or worker in self.recent
        self.recent.append(worker)
        while len(self.recent) > self._window():
            self.recent.popleft()
        if accept:
            return [Merge([result], adds=[(result.arrays, self.scale(result))]), Reply(worker, "merged")]
        return [Drop(result), Reply(worker, "dropped")]
