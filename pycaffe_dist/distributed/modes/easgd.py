"""Elastic averaging SGD (`--moving-rate a`), asynchronous, as in Zhang, Choromanska and LeCun (2015): after tau
local steps a worker computes the elastic difference d = a (x - W) against the centre W it last pulled, moves
itself to x - d and pushes d; the master moves the centre, W += d. With the exchange overlapped (depth 1) the
centre a worker uses is one round older."""
from .base import Rule


class Worker:
    gradients = False

    @staticmethod
    def result(x_start, x_end, gradients, centre, options):
        rate = options.get("moving_rate", 0.5)
        return [rate * (x - w) for x, w in zip(x_end, centre)]

    @staticmethod
    def next_start(status, pulled, x_end, result, in_flight):
        if status == "merged":
            return [x - d for x, d in zip(x_end, result)]
        return pulled                       # reset: start again from the centre


class Master(Rule):
    def on_result(self, worker, message):
        self.master.add_to_weights(self.master.read_result(worker), 1.0)
        self.master.merged([message])
        self.master.reply(worker, "merged")
