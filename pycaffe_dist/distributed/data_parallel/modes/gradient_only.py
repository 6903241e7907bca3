"""Gradient-only SGD (Downpour): workers push the raw gradient of one forward-backward pass (summed over
iter_size) at the weights they pulled; the master applies the solver's own update rule to W (the same
functions as the local Solver: learning rate at the merge count, clipping, normalization, weight decay,
momentum or Adam's moments, held on the master), with the rate scaled by 1/the gradient's staleness (or
1/--factor). Momentum against stale gradients is momentum twice over: N workers' gradients computed on weights N
updates old act as an implicit momentum of about 1 - 1/N (Mitliagkas et al. 2016) on top of the solver's, and
LeNet's lr 0.01 with momentum 0.9 diverged within 100 merges at 8 workers; at rate / staleness the N updates of a
round move W as far as one process's update. No --tau: a round is one gradient.

Workers wait for each reply by default (depth 0, Downpour's fetch before every step), so the whole exchange, 2 x
the weights' bytes and the master's update, is on every round: 42 % of a round at 2 workers on LeNet. `--overlap`
computes the next gradient at the W last pulled while the last one travels: 10 % of a round, but every gradient
one update staler, and the accuracy pays for it: 0.849 against 0.831 after 1000 merges at 2 workers, 0.84 against
0.79-0.82 after 2000 at 8 (2 cores), where 0.78 is the least every mode must reach there.

The learning rate (lr_scaling.py): the master's update runs at the solver's rate times the typical staleness,
over the gradient's own staleness, so that a typical gradient counts as one step. This is the mode that gains
least from it. A gradient applied s updates after the W it was computed on is a delayed gradient step, and the
stable rate of delayed steps falls as 1/s; the solver's momentum adds to the momentum that the delay already
acts as. The scaled rate meets that bound and backs off, to 1.3-5 x at 8 and 16 workers on LeNet. The images of
2000 batches then give 0.83 at 8 workers (0.831 with --lr-scaling none, 0.835 sqrt, 0.836 with --lars 0.02) and
0.80 at 16 (0.792, 0.801). Lowering the master's momentum by what the delay adds (Mitliagkas et al. 2016: m' = 1
- (1 - m) x the scale, the rate raised to keep a steady gradient's step) did not keep it stable either: 0.829 at
8 and 0.806 at 16. Choose sync, async or local-sgd to make N workers' images count."""
from .base import COMPRESS, FACTOR, OVERLAP, SCALING, Merge, Reply, StalenessAwareRule

OPTIONS = (FACTOR, OVERLAP, COMPRESS) + SCALING


class RoundRule:
    gradients = True

    @staticmethod
    def result(x_start, x_end, gradients, centre, options, workers):
        return gradients

    @staticmethod
    def next_start(status, pulled, x_end, result, in_flight, answered=None):
        return pulled

    @staticmethod
    def base(version, status, in_flight):
        return version


class MergeRule(StalenessAwareRule):
    depth = 0
    keeps_history = True        # the solver's update rule on the master: its momentum or Adam's moments
    advice = "lower the solver's base_lr, or give --factor (the rate / FACTOR) at least the number of workers"

    def on_result(self, result):
        # The rate scaled for N workers (lr_scaling.py, by the master) and by 1/staleness: a round of N results,
        # N steps' worth.
        return [Merge([result], gradients=result.arrays, scale=self.scale(result)), Reply(result.worker, "merged")]
