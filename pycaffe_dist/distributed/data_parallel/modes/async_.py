"""Asynchronous SGD (SpeeDO's default): every worker result is merged as it arrives, W += delta / staleness (or
/ --factor), and the worker goes on at once. Workers overlap their exchange with their next round (depth 1).
Its workers' rate is the solver's times the typical staleness (or --factor): a result of typical staleness then
counts as one step of one process, so N workers' results are worth N steps (lr_scaling.py, Rule.merged_work)."""
from .base import COMPRESS, FACTOR, OVERLAP, SCALING, TAU, DeltaRoundRule, Merge, Reply, StalenessAwareRule

OPTIONS = (TAU, FACTOR, OVERLAP, COMPRESS) + SCALING
RoundRule = DeltaRoundRule       # this mode's worker side


class MergeRule(StalenessAwareRule):

    def on_result(self, result):
        return [Merge([result], adds=[(result.arrays, self.scale(result))]), Reply(result.worker, "merged")]
