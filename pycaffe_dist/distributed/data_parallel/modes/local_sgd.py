"""Local SGD with an outer optimizer (`--tau H --outer-lr a --outer-momentum m`): SparkNet's tau-averaging (Moritz,
Nishihara, Stoica and Jordan 2016) with DiLoCo's outer Nesterov step (Douillard et al. 2023, "DiLoCo: Distributed
Low-Communication Training of Language Models", arXiv:2311.08105, Algorithm 1). Each round every live worker runs
H local solver steps from W, behind a barrier per round (sync's rounds: backup workers, workers that join or go);
the master takes the mean of the round's deltas as a pseudo-gradient and moves W by Nesterov momentum over it:

    delta = mean over the round's workers of (x_end - x_start)
    v     = m v + delta
    W    += a (m v + delta)

DiLoCo's outer gradient points the other way, g = x_start - x_end = -delta, and its OuterOpt is PyTorch's
SGD(nesterov=True): buf = m buf + g; W -= a (g + m buf) (torch.optim.SGD's documentation; torchft's
local_sgd.py, DiLoCo: the pseudo-gradient original - local is set as p.grad and the outer optimizer steps). With
v = -buf the two are the same update.

`--outer-lr 1 --outer-momentum 0` is plain model averaging: the same float operations as sync's W += sum / n (the
deltas summed in slot order, one saxpy by a / n), so it gives `--mode sync --tau H` bit for bit (with the same
--overlap: local-sgd waits at every barrier by default, DiLoCo's schedule, where sync overlaps).

Defaults, for LeNet-scale jobs with small H: tau 8, a = 1, m = 0.25 with the rate scaled for N workers and 0.5
with `--lr-scaling none` (measured: Caffe's LeNet solver on Fashion-MNIST, the images of 2000 batches of 64, 2
cores, one run each; test accuracy):
- m = 0.5 at the solver's rate (`--lr-scaling none`, measured before the rate was scaled): in a steady direction
  the outer step is a / (1 - m) = 2 times the mean delta. DiLoCo's a = 0.7, m = 0.9 (7 times, tuned for H = 500
  on language models) reached 0.863 at 8 workers with tau 8, but diverged (NaN at round 36) at tau 1, where it is
  the solver's momentum 0.9 applied twice over, and a = 1, m = 0.9 diverged at tau 8. a = 1, m = 0.5 converged
  everywhere tried: 8 workers 0.834 (tau 8), 0.852 (tau 1), 0.849 (tau 4 and 16); 2 workers 0.878; plain
  averaging (m = 0) 0.831, sync (tau 1) 0.825. With the rate scaled, m = 0.25 (below).
- tau 8: one exchange per 8 local steps, so the exchange is a small part of a round (at 8 workers on 2 cores,
  ~10 % of a round against sync's 26-30 % at tau 1), with the accuracy of tau 4 to 16 within run-to-run noise
  here. A larger tau lets the workers drift further apart between averages and leaves a short job fewer rounds
  for the outer momentum to build up in (31 at 8 workers over 2000 batches).

With the learning rate of N workers scaled (lr_scaling.py) the workers' rate is the solver's times N (1 - m) / a:
the outer step's a / (1 - m) makes up the rest of N. How much of N the outer step should carry was measured (one
run each, two where a range is given; images to 0.85 over one process's, or the final accuracy where 0.85 was not
reached):

    m      2 workers   4      8               16              32
    0      -           -      1.44            0.805 (backoff) -
    0.25   1.00        1.17   1.50 (0.870)    2.67 (0.852)    0.775 (backoffs)
    0.5    1.00        1.17   0.842-0.848     0.841-0.849     0.769-0.770 (backoffs)
    0.75   -           -      0.791           0.750           -

Plain averaging (m = 0) puts all of N on the workers' local steps, which pass LeNet's ceiling for a batch of 64
at 16 workers; a larger m leaves the workers slower and counts on a steady direction that 8 noisy local steps do
not give. m = 0.25 (the outer step 1.33 x the mean delta, the workers at 0.75 N) is the best of these everywhere
measured, and the default at a scaled rate; at the solver's rate the default stays 0.5, as it was.

What caps local SGD at 16 workers is its local steps, not the merge. Each worker steps on its own batch at k times
the solver's rate, and a round moves the workers' mean as tau steps at that rate over N x tau batches: the images
to an accuracy are about N / k times one process's (8 workers at k = 6: 1.50 x measured; 16 at 6: 2.67 x). On a
batch of 64, LeNet's steps diverge past about 7.5 x whatever N (16 workers, k forced, one run each: 7.2 x held with
no backoff and reached 0.85 at 2.33 x; 8 x and 9 x diverged at round 4 or 5 in three runs of three; the default
12 x at round 4, and the backoff halves it to 6 x; tau 2 and 4 too). Below 8 x, 16 / k is more than 2, so 16 workers
cannot reach 0.85 within 2 x one process's images here; --lars 0.02 --outer-momentum 0 holds 16 x layer by layer
and gets 2.17 x.

The outer momentum v is the master solver's first history set (Caffe's momentum history), so a .solverstate
snapshot holds it and `dist_caffe master --snapshot S.solverstate` goes on with it; it is saved to Redis with
each snapshot, and `--resume` takes it from there (the last snapshot's v, or 0 when there was none: logged)."""
import numpy as np
from scipy.linalg.blas import saxpy

from . import sync
from .base import COMPRESS, OVERLAP, SCALING, TAU, DeltaRoundRule, Option

DEFAULT_TAU = 8
OUTER_LR = Option("outer_lr", float, 1.0, "the outer optimizer's rate a: W += a (m v + mean delta)",
                  lambda value: None if value > 0 else "must be positive, got %s" % value)
OUTER_MOMENTUM = Option("outer_momentum", float, None, "the outer optimizer's Nesterov momentum m (0: plain "
                        "averaging; default 0.25, or 0.5 with --lr-scaling none)",
                        lambda value: None if 0 <= value < 1 else "must be in [0, 1), got %s" % value)
SCALED_MOMENTUM, SOLVER_RATE_MOMENTUM = 0.25, 0.5      # the default m with the rate scaled for N workers, and not
OPTIONS = (TAU, OUTER_LR, OUTER_MOMENTUM, sync.BACKUP, OVERLAP, COMPRESS) + SCALING
DEFAULTS = {"tau": DEFAULT_TAU}
RoundRule = DeltaRoundRule       # this mode's worker side


def outer_momentum(options):
    """m: --outer-momentum, else the default for the job's --lr-scaling (the module's docstring)."""
    if options.get("outer_momentum") is not None:
        return options["outer_momentum"]
    return SOLVER_RATE_MOMENTUM if options.get("lr_scaling", "none") == "none" else SCALED_MOMENTUM


class MergeRule(sync.MergeRule):
    depth = 0              # every worker starts a round from the W of the last outer step (DiLoCo)
    keeps_history = True
    advice = "lower the solver's base_lr, or --outer-lr or --outer-momentum"

    def __init__(self, view, options):
        super().__init__(view, options)
        self.rate, self.momentum = options["outer_lr"], outer_momentum(options)

    def start(self, workers):
        if self.momentum:
            velocity = self.view.history()
            sync.log.info("Local SGD: outer momentum %s, m = %g" % (
                "from the snapshot (|v| %.3g)" % max(float(np.abs(v).max()) for v in velocity)
                if any(v.any() for v in velocity) else "starts at 0", self.momentum))
        return super().start(workers)

    def merged_work(self, workers):
        # The outer step already multiplies a steady mean delta by a / (1 - m) (1.33 by default): the rate makes
        # up the rest of N, so that a round of N workers' tau steps is worth N x tau of one process's steps.
        return max(1.0, workers * (1.0 - self.momentum) / self.rate)

    def step(self, total, count, finite=True):
        adds = []
        if self.momentum and finite:            # (a round with NaN or Inf is refused: the momentum stays as it was)
            velocity = self.view.history()
            for v, t in zip(velocity, total):
                v *= np.float32(self.momentum)
                saxpy(t.reshape(-1), v.reshape(-1), a=1.0 / count)
            adds.append((velocity, self.rate * self.momentum))
        # With m = 0 and a = 1 this is sync's merge itself, scale and all.
        return adds + [(total, self.rate / count)]
