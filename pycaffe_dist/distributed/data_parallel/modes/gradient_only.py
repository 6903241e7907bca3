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

The learning rate (lr_scaling.py): the master's update runs at the solver's rate times k, over the gradient's own
staleness. By the arithmetic of delayed steps this mode cannot gain what the others do. A gradient applied D
updates after the W it was computed on (D about N - 1 at N workers: --stats mean_staleness 7.5 at 8) is a delayed
step. On a quadratic of curvature lambda the delayed heavy ball's largest stable steady step, rate / (1 -
momentum), is 2 (1 + m) / ((1 - m) lambda) with no delay (38 / lambda at the solver's m = 0.9), 1 / lambda one
update late and about 1.5 / (D lambda) past that, whatever the momentum (lr_scaling.delayed_step_bound).
bench/delayed_gradients.py measures it without any distribution: one process on the same images, every gradient D
updates late (D + 1 workers taking turns, exactly). At D = 7 the solver's momentum 0.9 diverged at a quarter of
the rate and ended at 0.813 at a tenth; the best found, momentum 0 at 3 x (a steady step 0.3 of one process's),
ended at 0.844 and never reached 0.85 in the images of 2000 batches, 2.6 x the 49,152 one process needs; 5 x
diverged. At D = 15 a steady step of 0.15 diverged. So 8 workers' gradients cannot reach 0.85 within 1.5 x one
process's images, nor 16 within 2 x: each may move W only a fraction of what a fresh one may.
So k is what that bound allows (MergeRule.merged_work): a gradient of the typical staleness s moves W by a steady
k / s of the solver's step, which the bound holds to bound(m, s - 1) in units of 1 / lambda, taking the solver's
own steady step for 1 / lambda (on LeNet the bench's runs bracket the limit there: 0.1 stable and 0.25 not at D =
7): k = s x bound(m, s - 1), at most s and at least 1. That is 2 at 2 workers, 1.39 at 4 and 1.26-1.34 from 8 to
32 at m = 0.9. Before, k was s, as in async: the warmup climbed past the bound, diverged and backed off (to 1.1-1.7 x
at 8 and 16 workers), at 16 workers ended in NaN in about one run of six, and at 32 in three runs of three, at
the solver's rate after three backoffs, from weights the climb had spoiled. With k from the bound no run backed off
(2 cores, the images of 2000 batches): 32 workers ended at 0.743-0.786 in five runs (0.752 with --lr-scaling
none), 16 at 0.783-0.808 in five (0.792), 8 at 0.822-0.835 in two (0.816), and 4 reached 0.85 in 1.83-2.00 x one
process's images (2.17 x before).
Lowering the master's momentum by what the delay adds (Mitliagkas et al. 2016: m' = 1 - (1 - m) x the scale, the
rate raised to keep a steady gradient's step) did no better (0.829 at 8, 0.806 at 16), nor did
taking the mean of the next N gradients per update (K-async, Dutta et al. 2018: 0.803-0.834 at 8). The modes
whose workers push deltas of their own solver steps (sync, async, local-sgd) keep each worker's momentum on fresh
gradients of its own path, and only the merge is late: choose one of them to make N workers' images count."""
from ... import lr_scaling
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

    def merged_work(self, workers):
        # What a gradient of the typical staleness s may count for, s - 1 updates late (the module's docstring):
        # k = s x bound(m, s - 1), or --factor F x that bound; at most s (F), at least the solver's own rate.
        work = super().merged_work(workers)
        typical = self.view.typical_staleness() or workers
        bound = lr_scaling.delayed_step_bound(self.view.momentum(), max(0, int(round(typical)) - 1))
        return max(1.0, work * min(1.0, bound))

    def on_result(self, result):
        # The rate scaled by what the delay allows (merged_work, applied by the master) and by 1/staleness.
        return [Merge([result], gradients=result.arrays, scale=self.scale(result)), Reply(result.worker, "merged")]
