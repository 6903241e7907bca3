"""The learning rate of N workers: the linear scaling rule with a gradual warmup (Goyal et al. 2017, "Accurate,
Large Minibatch SGD: Training ImageNet in 1 Hour"), applied by every data-parallel mode.

Why. Each mode merges N workers' work in a way that, at the solver's own rate, adds up to one process's step:
sync merges the mean of N deltas (one step of a batch N times larger), the staleness-aware modes scale each of the N
results of a round by about 1/N, gossip and EASGD average N workers who each step as one process does. So N workers
computed N times the images per second and needed about N times the images: the time to accuracy did not fall
with N. The rule: when a merge takes k times the work of one process's step, the rate is k times the solver's,
reached gradually from the solver's own rate (one more solver's rate every `lr_warmup` of the job's merges), since
a large rate on the random weights of the first iterations diverges where the same rate later does not.

What k is comes from how each mode merges (Rule.merged_work in modes/base.py, overridden where it differs):
- sync, gossip, easgd: k = N, the live workers (counted at each reply, so the rate follows workers that join and
  leave). In sync a merge is N batches; gossip and EASGD average N workers, whose mean moves as one step of N
  batches.
- async, partial-sync, weed-out merge each result at 1/its staleness (or 1/--factor): k is the typical staleness
  of the recent results (or the factor), so that a result of typical staleness counts as one process's step and a
  staler one as less. The staleness is about N, more where workers share cores or overlap their exchange (13.5
  at 8 workers on 2 cores, where k = N left each result worth 0.6 of a step).
- gradient-only merges gradients, not deltas of a worker's own steps, at that 1/staleness too, but a gradient
  computed D updates before it is applied may move W only so far (delayed_step_bound): k is the typical
  staleness s times that bound, s x bound(m, s - 1), at most s: 2 at 2 workers, 1.26-1.34 from 8 to 32 at the
  solver's momentum 0.9 (modes/gradient_only.py).
- local-sgd: k = N (1 - m) / a for the outer rate a and momentum m: DiLoCo's outer Nesterov step already
  multiplies a steady mean delta by a / (1 - m) (1.33 with the defaults at a scaled rate).

Where it applies: the rate of every local solver step is the solver's (its lr policy at the job's merge count)
times the scale the master sends with each reply, so a worker's momentum and weight decay follow the scaled
rate as Caffe's own SGD with a larger base_lr would; in gradient-only the master applies it in its own update (the
rate times scale / staleness). The schedule keeps counting merges, as max_iter does (see docs/distributed.md, units).

What keeps a scaled rate stable: the warmup; Backoff (below), which takes the rate down where it diverged anyway;
and, as an option, LARS's trust ratio (`--lars TRUST`, Solver._trust_clipped), which clips what scaling adds to
each blob's rate, layer by layer: sync at 32 workers on LeNet reached 0.85 with it (--lars 0.02, no backoff); without
it the rate backed off (to 9.8 x in bench/scaling.py's run) and ended at 0.830.

`--lr-scaling sqrt` scales by sqrt(k) (Krizhevsky 2014's rule for the variance of a larger batch) and `none` keeps
the solver's rate: Caffe's multi-GPU training and SpeeDO, where N workers' results add up to one process's step.
Past a net's critical batch (McCandlish et al. 2018) a larger merge no longer buys fewer images: CRITICAL_IMAGES
says where that lies for LeNet on Fashion-MNIST (bench/scaling.py --images) and a job past it says so once."""
import functools
import logging
import math
from collections import deque

import numpy as np

from ..errors import DivergedError

log = logging.getLogger("pycaffe_dist.solver")
POLICIES = ("linear", "sqrt", "none")
WARMUP_SHARE = 0.02         # of the job's merges, per solver's rate the scale climbs (scale())


def check_policy(value):
    return None if value in POLICIES else "must be one of %s, got %r" % (", ".join(POLICIES), value)


def check_warmup(value):
    return None if 0 <= value <= 1 else "must be a share of the job's merges in [0, 1], got %s" % value


# Batch merged per step (images) past which linear scaling stopped paying for LeNet on Fashion-MNIST: images to 0.85
# grew beyond 1.5x one process's (bench/scaling.py --images, docs/distributed-lr.md).
CRITICAL_IMAGES = 1024


def target(policy, work):
    """The scale of the solver's rate once warmed up, for merges that take `work` times one process's step."""
    work = max(1.0, float(work))
    if policy == "linear":
        return work
    if policy == "sqrt":
        return math.sqrt(work)
    return 1.0


def scale(policy, work, merges, step_merges):
    """The scale at merge count `merges`: from 1, one more solver's rate every `step_merges` merges, up to
    target(). The warmup thus lasts (target - 1) x step_merges: longer for a larger target. Measured (LeNet,
    sync): a ramp of fixed length, as Goyal's 5 epochs, that suited 8 workers (5 % of the job) diverged at 16,
    and one that suited 16 (25 %) cost 8 workers half again the images; the rate's climb per image is what the
    net must keep up with."""
    full = target(policy, work)
    if full == 1.0:
        return 1.0
    if step_merges <= 0:
        return full
    return min(full, 1.0 + merges / step_merges)


def warmup_step(options, max_iter):
    """The merges over which the rate climbs by one solver's rate (lr_warmup of max_iter)."""
    return options.get("lr_warmup", WARMUP_SHARE) * max_iter


def stable(a, momentum, delay):
    """Whether the delayed heavy ball converges on a quadratic f = lambda x^2 / 2, for a = rate x lambda: the
    iteration x' = x + M (x - x_prev) - a x_(t - delay) is stable only while every root of
    z^(D+1) - (1 + M) z^D + M z^(D-1) + a lies inside the unit circle."""
    if delay == 0:                         # z^2 - (1 + M - a) z + M
        poly = [1.0, -(1.0 + momentum - a), momentum]
    else:
        poly = np.zeros(delay + 2)
        poly[0], poly[1] = 1.0, -(1.0 + momentum)
        poly[2] += momentum
        poly[-1] += a
    return float(np.max(np.abs(np.roots(poly)))) < 1.0


@functools.lru_cache(maxsize=512)
def delayed_step_bound(momentum, delay):
    """The largest stable steady step a / (1 - M) of the delayed heavy ball (stable(), by bisection on a:
    stability is an interval), in units of 1 / lambda: 2 (1 + M) / (1 - M) with no delay (38 at M = 0.9), 1 at
    one update late whatever M, then about 1.5 / delay (1.1-1.3 / delay at M = 0.9). A delay caps the step a
    gradient may take, and a lower momentum does not lift the cap (bench/delayed_gradients.py measures it on
    LeNet, where the solver's own steady step sits near 1 / lambda: 0.1 of it stable 7 updates late, 0.25
    not)."""
    low, high = 0.0, 2.0 * (1.0 + momentum)
    for _ in range(60):
        middle = (low + high) / 2.0
        low, high = (middle, high) if stable(middle, momentum, delay) else (low, middle)
    return low / (1.0 - momentum)


def heavy_ball_momentum(param):
    """The momentum of the solver's update rule as a heavy ball: SGD's and Nesterov's; 0 for the adaptive rules,
    whose step does not build up over a steady gradient as 1 / (1 - M)."""
    return float(param.momentum) if param.type in ("SGD", "Nesterov") else 0.0


def all_finite(arrays):
    """Whether no array holds NaN or Inf (a float32 sum is one fast pass, finite unless an element is not, or it
    overflows: then the elements are looked at)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return all(np.isfinite(np.sum(a)) or np.isfinite(a).all() for a in arrays)


class RateOfWorkers:
    """The scale of the solver's rate that a master applies and sends with every reply: the mode's work per merge by
    the job's policy, ramped up over the warmup and held under the backoff's ceiling; with one line in the log when
    its target is set or changes by a quarter (workers joined or left), and one warning past the critical batch."""

    def __init__(self, options, max_iter, images_per_iteration):
        self.policy = options.get("lr_scaling", "none")
        self.warmup = warmup_step(options, max_iter)
        self.images_per_iteration = images_per_iteration
        self.said = None                        # the work per merge the log last described
        self.critical_said = False              # whether it said that the scaled batch is past the critical one

    def scale(self, work, merges, ceiling, live, say=True):
        """The scale at merge count `merges` for `work` (Rule.merged_work) with `live` workers; `say`: log a new
        target (once the job has started)."""
        if say and (self.said is None or abs(work - self.said) > 0.25 * self.said):
            self._say(work, live)
        return min(ceiling, scale(self.policy, work, merges, self.warmup))

    def _say(self, work, live):
        full = target(self.policy, work)
        first = self.said is None
        self.said = work
        if self.policy == "none":
            if first:
                log.info("Learning rate: the solver's (--lr-scaling none): %d workers' merges add up to one "
                         "process's step", live)
            return
        log.info("Learning rate: the solver's x %.3g (%s scaling: a merge is worth %.3g of one process's steps "
                 "with %d live worker(s))%s", full, self.policy, work, live,
                 ", reached by one more solver's rate every %.3g merges" % self.warmup
                 if first and self.warmup > 0 and full > 1 else "")
        batch = full * self.images_per_iteration
        if batch > CRITICAL_IMAGES and not self.critical_said:
            self.critical_said = True
            log.warning("Learning rate: a step at this rate stands for a batch of %d images, past the %d at which "
                        "more workers stopped buying fewer images to accuracy for LeNet on Fashion-MNIST "
                        "(bench/scaling.py --images): expect more images to accuracy than one process takes; "
                        "--lars 0.02 keeps such a rate stable layer by layer, or use fewer workers",
                        batch, CRITICAL_IMAGES)


class Backoff:
    """What keeps a scaled rate from ending a job in NaN: a net's stable rate has a ceiling that no batch size
    lifts (its curvature sets it), so linear scaling at many workers can pass it (LeNet's solver at 32 workers
    x 64 images: NaN within 15 merges of the full rate). The master keeps two copies of W, taken every `every`
    merges where W is finite; when a result or W turns NaN or Inf while the rate is scaled above the solver's,
    W goes back to the older copy, the ceiling becomes half the scale that diverged, and every worker starts
    again from W with its momentum cleared. At the solver's own rate a NaN still stops the job (the NaN guard)."""
    COPIES = 2
    LOSS_RISE = 2.0         # a window of merges whose workers' mean loss is this many times the first window's
    WINDOW = 10             # merges whose losses are averaged: one batch's loss alone varies 2x and more

    def __init__(self, max_iter):
        self.every = max(2, int(max_iter) // 20)
        self.copies = deque()              # (merge count, arrays), oldest first
        self.ceiling = math.inf
        self.count = 0                     # how often it backed off
        self.recent = deque(maxlen=self.WINDOW)
        self.first_loss = None             # the mean loss of the job's first WINDOW merges

    def check_loss(self, loss, scale):
        """Divergence shows in the workers' loss before it reaches W as NaN (Caffe's loss climbs to 87.3, the
        log of FLT_MIN, first): at a scaled rate, a merge whose loss is not finite, or after which the mean loss
        of the last WINDOW merges is LOSS_RISE times the first WINDOW's, raises DivergedError, so that the rate
        backs off from a W that is still good. At the solver's own rate nothing is checked here (the job trains
        on, as before; NaN in W still stops it)."""
        if not math.isfinite(loss):
            if scale > 1.0:
                raise DivergedError("the workers' loss is %s" % loss)
            return
        self.recent.append(loss)
        if len(self.recent) < self.WINDOW:  # (after a backoff too: the first results from the W it went back to
            return                          # vary as much as any, and one alone read as a rise backed off again)
        mean = sum(self.recent) / len(self.recent)
        if self.first_loss is None:
            self.first_loss = mean
            return
        if scale > 1.0 and mean > self.LOSS_RISE * self.first_loss:
            raise DivergedError("the workers' loss rose to %.4g over the last %d merges (%.4g over the first)"
                                % (mean, self.WINDOW, self.first_loss))

    def due(self, merges):
        """Whether a copy is due at merge count `merges` (every `every` merges)."""
        return merges % self.every == 0

    def keep(self, weights, merges):
        """A copy of W at `merges`, if W is finite."""
        if not all_finite(weights):
            return
        if self.copies and self.copies[-1][0] == merges:
            self.copies.pop()
        arrays = self.copies.popleft()[1] if len(self.copies) == self.COPIES else \
            [np.empty_like(w) for w in weights]
        for a, w in zip(arrays, weights):
            np.copyto(a, w)
        self.copies.append((merges, arrays))

    def back_off(self, scale):
        """The rate diverged at `scale`: (the merge count of the W to go back to, its arrays), with the ceiling
        halved; None where there is nothing to go back to or the rate is not scaled."""
        if scale <= 1.0 or not self.copies:
            return None
        self.ceiling = max(1.0, scale / 2)
        self.count += 1
        self.recent.clear()                # a new window of losses from the W it goes back to
        return self.copies[0]
