"""Elastic averaging SGD (`--moving-rate a`), asynchronous, as in Zhang, Choromanska and LeCun (2015): after tau
local steps a worker computes the elastic difference d = a (x - W) against the centre W it last pulled, moves
itself to x - d and pushes d; the master moves the centre, W += d. With the exchange overlapped (depth 1) the
centre a worker uses is one round older."""
from .base import OVERLAP, TAU, Option, Rule

MOVING_RATE = Option("moving_rate", float, 0.5, "the elastic moving rate alpha",
                     lambda value: None if 0 < value <= 1 else "must be in (0, 1], got %s" % value)
OPTIONS = (TAU, MOVING_RATE, OVERLAP)


class Worker:
    gradients = False

    @staticmethod
    def result(x_start, x_end, gradients, centre, options):
        rate = options["moving_rate"]
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
