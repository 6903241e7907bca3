"""Elastic averaging SGD (`--moving-rate a`), asynchronous, as in Zhang, Choromanska and LeCun (2015): after tau
local steps a worker computes the elastic difference d = a (x - W) against the centre W it last pulled, moves
itself to x - d and pushes d; the master moves the centre, W += d. With the exchange overlapped (depth 1) the
centre a worker uses is one round older.

The default moving rate is 0.9 / N for N live workers (counted by the master, sent with every reply, so it
follows workers that join and leave): the elastic coupling is stable only for beta = N a < 1 (the paper's
condition), and SpeeDO's 0.5 sat on that bound at 2 workers and was past it from 3 up (NaN at 4 and 8 workers).

The learning rate: each worker steps as one process does and the centre follows their mean, which moves as one
step of N batches per round; so the local rate is the solver's times N (lr_scaling.py), as in sync. The moving
rate's bound is on N alpha, not on the learning rate, and stays as it is."""
from .base import OVERLAP, SCALING, TAU, Merge, Option, Reply, Rule

BETA = 0.9                  # the default N * alpha: inside the stability bound beta < 1, as the paper's runs
MOVING_RATE = Option("moving_rate", float, None, "the elastic moving rate alpha (default 0.9 / the live workers)",
                     lambda value: None if 0 < value <= 1 else "must be in (0, 1], got %s" % value)
OPTIONS = (TAU, MOVING_RATE, OVERLAP) + SCALING


def moving_rate(options, workers):
    return options.get("moving_rate") or BETA / max(1, workers)


class RoundRule:
    gradients = False

    @staticmethod
    def result(x_start, x_end, gradients, centre, options, workers):
        rate = moving_rate(options, workers)
        return [rate * (x - w) for x, w in zip(x_end, centre)]

    @staticmethod
    def next_start(status, pulled, x_end, result, in_flight, answered=None):
        if status == "merged":
            return [x - d for x, d in zip(x_end, result)]
        return pulled                       # reset: start again from the centre

    @staticmethod
    def base(version, status, in_flight):
        return version


class MergeRule(Rule):
    advice = "lower the solver's base_lr or --moving-rate (N x rate must stay below 1)"

    def on_result(self, result):
        return [Merge([result], adds=[(result.arrays, 1.0)]), Reply(result.worker, "merged")]
