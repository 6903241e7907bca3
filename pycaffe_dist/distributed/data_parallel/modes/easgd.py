"""Elastic averaging SGD (`--moving-rate a`), asynchronous, as in Zhang, Choromanska and LeCun (2015): after tau
local steps a worker computes the elastic difference d = a (x - W) against the centre W it last pulled, moves
itself to x - d and pushes d; the master moves the centre, W += d. With the exchange overlapped (depth 1) the
centre a worker uses is one round older.

The default moving rate is 0.9 / N for N live workers (counted by the master, sent with every reply, so it
follows workers that join and leave): the elastic coupling is stable only for beta = N a < 1 (the paper's
condition), and SpeeDO's 0.5 sat on that bound at 2 workers and was past it from 3 up (NaN at 4 and 8 workers).

The learning rate: each worker steps as one process does and the centre follows their mean, which moves as one
step of N batches per round; so the local rate is the solver's times N (lr_scaling.py), as in sync. The moving
rate's bound is on N alpha, not on the learning rate, and stays as it is.

The worker's own pull: with the rate scaled, a worker moves at least a quarter of the way to the centre each round
(WORKER_PULL), and pushes that move; the master moves the centre by alpha / pull of it, alpha (x - W) as before.
Why: the worker steps at N times the solver's rate, so it drifts about N times as far from the centre per round
as one process would, while the paper's symmetric pull alpha = 0.9 / N gets N times weaker; at 16 workers (pull
0.056) the workers ran off and the rate backed off (Caffe's LeNet solver on Fashion-MNIST, the images of 2000
batches: 0.843-0.849 at the end, 0.85 never reached), where a pull of a quarter reached 0.85 at 1.83-2.0x one
process's images and ended at 0.860-0.865, with no backoff (8 workers: 1.5-1.67x; 32: 0.820-0.823, one backoff).
A half pulled them back to a centre a round stale and ended at 0.832. The two rates stay stable together: with no
gradient, the workers' mean distance to the centre goes as (1 - pull - N alpha) a round, inside (-1, 1) for
pull + N alpha < 2, and their distances to each other shrink by (1 - pull). At 2 workers alpha (0.45) is the larger and the pull is alpha, the
paper's; `--moving-rate` given, or `--lr-scaling none`, keeps the paper's symmetric pull (SpeeDO's, bit for bit)."""
from .base import OVERLAP, SCALING, TAU, Merge, Option, Reply, Rule

BETA = 0.9                  # the default N * alpha: inside the stability bound beta < 1, as the paper's runs
WORKER_PULL = 0.25          # the least share of its distance to the centre a worker closes a round at a scaled rate
MOVING_RATE = Option("moving_rate", float, None, "the elastic moving rate alpha (default 0.9 / the live workers)",
                     lambda value: None if 0 < value <= 1 else "must be in (0, 1], got %s" % value)
OPTIONS = (TAU, MOVING_RATE, OVERLAP) + SCALING


def moving_rate(options, workers):
    return options.get("moving_rate") or BETA / max(1, workers)


def worker_pull(options, workers):
    """The share of its distance to the centre a worker closes each round: alpha, or at a scaled rate with the
    default alpha at least WORKER_PULL (the module's docstring)."""
    rate = moving_rate(options, workers)
    if options.get("moving_rate") or options.get("lr_scaling", "none") == "none":
        return rate
    return max(rate, WORKER_PULL)


class RoundRule:
    gradients = False

    @staticmethod
    def result(x_start, x_end, gradients, centre, options, workers):
        # The worker's own move (next_start takes it), which the master scales to the centre's.
        pull = worker_pull(options, workers)
        return [pull * (x - w) for x, w in zip(x_end, centre)]

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

    def __init__(self, view, options):
        super().__init__(view, options)
        self.live = set()           # the workers, as the rule's events told them (the shards replay the same)

    def start(self, workers):
        self.live = set(workers)
        return super().start(workers)

    def on_join(self, worker):
        self.live.add(worker)
        return super().on_join(worker)

    def on_lost(self, worker):
        self.live.discard(worker)
        return []

    def on_result(self, result):
        # W += alpha (x - W): the worker's move times alpha / its pull (1 where they are the same: the paper's).
        workers = max(1, len(self.live))
        share = moving_rate(self.options, workers) / worker_pull(self.options, workers)
        return [Merge([result], adds=[(result.arrays, share)]), Reply(result.worker, "merged")]
