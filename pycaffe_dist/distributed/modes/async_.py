"""Asynchronous SGD (SpeeDO's default): every worker result is merged as it arrives, W += delta / factor, and
the worker goes on at once. Workers overlap their exchange with their next round (depth 1)."""
from .base import OVERLAP, TAU, DeltaWorker, Option, Rule

FACTOR = Option("factor", float, 1.0, "W += delta / FACTOR",
                lambda value: None if value > 0 else "must be positive, got %s" % value)
OPTIONS = (TAU, FACTOR, OVERLAP)
Worker = DeltaWorker       # this mode's worker side


class Master(Rule):
    def on_result(self, worker, message):
        self.master.add_to_weights(self.master.read_result(worker), 1.0 / self.options["factor"])
        self.master.merged([message])
        self.master.reply(worker, "merged")
