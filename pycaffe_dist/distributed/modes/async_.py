"""Asynchronous SGD (SpeeDO's default): every worker result is merged as it arrives, W += delta / factor, and
the worker goes on at once. Workers overlap their exchange with their next round (depth 1)."""
from .base import DeltaWorker as Worker, Rule  # noqa: F401  (the worker side of this mode)


class Master(Rule):
    def on_result(self, worker, message):
        factor = self.options.get("factor") or 1.0
        self.master.add_to_weights(self.master.read_result(worker), 1.0 / factor)
        self.master.merged([message])
        self.master.reply(worker, "merged")
