"""L-BFGS (Nocedal 1980; Liu and Nocedal 1989) as functions of flat vectors: the two-loop recursion over the last m
(s, y) pairs, a line search for the strong Wolfe conditions (Nocedal and Wright, Numerical Optimization, 2nd ed.,
algorithms 3.5 and 3.6), and one iteration that ties them together. It knows nothing of nets or processes: the
objective is a function `evaluate(x) -> (f, g)`, which distributed/sandblaster/master.py computes with workers
(DistBelief's Sandblaster, Dean et al. 2012).

Choices, and why:
- The initial inverse Hessian is gamma I with gamma = s'y / y'y of the newest pair (N&W 7.20): it makes the step of
  1 the natural first trial, so most iterations take one evaluation in the line search.
- Strong Wolfe (c1 = 1e-4, c2 = 0.9, N&W's values for quasi-Newton methods) rather than weak: |phi'(a)| <=
  c2 |phi'(0)| keeps the accepted point from overshooting far past the minimum along the line, and still implies
  s'y > 0 for the pair, which is what keeps H positive definite.
- A pair with s'y <= eps |s| |y| (their cosine at most eps: a scale-free test) is skipped, not stored: Wolfe
  guarantees s'y > 0 in exact arithmetic, but float32 gradients over a sample can lose it. The caller says so.
- A failed line search (no Wolfe point within its evaluations) clears the pairs (a restart): the directions they
  made were not descending well. A point with sufficient decrease found on the way is still taken.
- Vectors are the caller's dtype (float32 for nets: m pairs of a net's size each); dot products are taken in
  float64, since s'y and y'y are differences of noisy float32 gradients.
"""
import dataclasses
import math

import numpy as np

C1, C2 = 1e-4, 0.9
CURVATURE_EPS = 1e-8


def dot(a, b):
    return float(np.dot(a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)))


class Pairs:
    """The last `m` (s, y) pairs: s = x_{k+1} - x_k, y = g_{k+1} - g_k, oldest first."""

    def __init__(self, m, eps=CURVATURE_EPS):
        if m < 1:
            raise ValueError("L-BFGS needs at least one pair of memory, got %d" % m)
        self.m, self.eps = int(m), float(eps)
        self.pairs = []                 # (s, y, 1 / s'y)

    def __len__(self):
        return len(self.pairs)

    def clear(self):
        self.pairs = []

    def add(self, s, y):
        """Store the pair, dropping the oldest beyond m; returns s'y, or None when the pair fails the curvature
        test and was skipped."""
        sy = dot(s, y)
        if not sy > self.eps * math.sqrt(dot(s, s) * dot(y, y)):
            return None
        self.pairs = (self.pairs + [(s, y, 1.0 / sy)])[-self.m:]
        return sy

    @property
    def gamma(self):
        """The initial inverse Hessian's scale, s'y / y'y of the newest pair (1 with none)."""
        if not self.pairs:
            return 1.0
        s, y, rho = self.pairs[-1]
        return 1.0 / (rho * dot(y, y))

    def inverse_hessian_times(self, g):
        """H g by the two-loop recursion (N&W algorithm 7.4), H being BFGS's update of gamma I by every pair."""
        q = np.array(g, copy=True)
        alphas = []
        for s, y, rho in reversed(self.pairs):
            a = rho * dot(s, q)
            q -= q.dtype.type(a) * y
            alphas.append(a)
        r = q * q.dtype.type(self.gamma)
        for (s, y, rho), a in zip(self.pairs, reversed(alphas)):
            b = rho * dot(y, r)
            r += r.dtype.type(a - b) * s
        return r

    def direction(self, g):
        return -self.inverse_hessian_times(g)


@dataclasses.dataclass
class Trial:
    """One point of a line search: the step a, phi(a) = f(x + a d), phi'(a) = g(x + a d)'d, and what the objective
    gave besides (the gradient)."""
    step: float
    f: float
    slope: float
    payload: object = None

    @property
    def finite(self):
        return math.isfinite(self.f) and math.isfinite(self.slope)


@dataclasses.dataclass
class LineSearch:
    """A line search's end: `ok` when `point` meets the strong Wolfe conditions; otherwise `point` is the best one
    with sufficient decrease (None when there was none), `why` says what went wrong."""
    ok: bool
    point: Trial
    evaluations: int
    why: str = ""


def _interpolate(lo, hi):
    """A step between lo and hi: the minimiser of the cubic through both values and slopes (N&W 3.59), or of the
    quadratic through lo's value and slope and hi's value when hi's slope is not finite; kept 10 % away from the
    ends (else the bisection), so that the bracket shrinks."""
    a, b = lo.step, hi.step
    width = b - a
    guess = None
    if hi.finite:
        d1 = lo.slope + hi.slope - 3 * (lo.f - hi.f) / (a - b)
        root = d1 * d1 - lo.slope * hi.slope
        if root >= 0:
            d2 = math.copysign(math.sqrt(root), b - a)
            denominator = hi.slope - lo.slope + 2 * d2
            if denominator != 0:
                guess = b - (b - a) * (hi.slope + d2 - d1) / denominator
    elif math.isfinite(hi.f):
        curvature = (hi.f - lo.f - lo.slope * width) / (width * width)
        if curvature > 0:
            guess = a - lo.slope / (2 * curvature)
    low, high = min(a, b) + 0.1 * abs(width), max(a, b) - 0.1 * abs(width)
    if guess is None or not math.isfinite(guess) or not low <= guess <= high:
        guess = a + 0.5 * width
    return guess


def wolfe_line_search(phi, f0, slope0, step=1.0, c1=C1, c2=C2, max_evaluations=10, grow=4.0):
    """A step along a descent direction meeting the strong Wolfe conditions
        f(a) <= f0 + c1 a slope0      (sufficient decrease)
        |f'(a)| <= c2 |slope0|        (curvature)
    where phi(a) -> Trial evaluates the objective at step a. Starts at `step`, extrapolates by `grow` while the
    function still descends steeply, then zooms into the bracket (N&W algorithms 3.5 and 3.6). A point where the
    objective is not finite counts as too far: the search goes back from it. At most `max_evaluations` calls."""
    if not slope0 < 0:
        raise ValueError("the line search needs a descent direction (slope %g)" % slope0)
    origin = Trial(0.0, f0, slope0)
    best, evaluations = None, 0

    def decreases(t):
        return t.finite and t.f <= f0 + c1 * t.step * slope0

    def curved(t):
        return abs(t.slope) <= -c2 * slope0

    def zoom(lo, hi):
        nonlocal best, evaluations
        while evaluations < max_evaluations:
            t = phi(_interpolate(lo, hi))
            evaluations += 1
            if not decreases(t) or t.f >= lo.f:
                hi = t
                continue
            best = t
            if curved(t):
                return LineSearch(True, t, evaluations)
            if t.slope * (hi.step - lo.step) >= 0:
                hi = lo
            lo = t
        return LineSearch(False, best, evaluations, "no strong Wolfe point in %d evaluations" % evaluations)

    previous, a = origin, float(step)
    while evaluations < max_evaluations:
        t = phi(a)
        evaluations += 1
        if not decreases(t) or (previous is not origin and t.f >= previous.f):
            return zoom(previous, t)
        best = t
        if curved(t):
            return LineSearch(True, t, evaluations)
        if t.slope >= 0:
            return zoom(t, previous)
        previous, a = t, a * grow
    return LineSearch(False, best, evaluations, "still descending steeply after %d evaluations" % evaluations)


@dataclasses.dataclass
class Step:
    """What one L-BFGS iteration did. x, f, g: where it ended and the objective there (the line search's point: the
    sample the iteration searched on). curvature: s'y of the stored pair, None when the pair was skipped (or there
    was none). restarted: the pairs were cleared (a failed line search, or a direction that was not descending).
    moved: x changed."""
    x: np.ndarray
    f: float
    g: np.ndarray
    step: float
    evaluations: int
    moved: bool
    curvature: float = None
    restarted: bool = False
    why: str = ""


class LBFGS:
    """L-BFGS with `memory` pairs. iterate(x, f, g, evaluate) takes one step from x, where the objective is f with
    gradient g, calling evaluate(x) -> (f, g) for the line search."""

    def __init__(self, memory=10, c1=C1, c2=C2, max_evaluations=10, eps=CURVATURE_EPS):
        self.pairs = Pairs(memory, eps)
        self.c1, self.c2, self.max_evaluations = c1, c2, max_evaluations

    def iterate(self, x, f, g, evaluate):
        restarted, why, evaluations = False, "", 0
        while True:
            d, steepest = self.pairs.direction(g), not self.pairs
            slope0 = dot(g, d)
            if not slope0 < 0:
                if steepest:            # g = 0 (or not finite): nothing to descend
                    return Step(x, f, g, 0.0, evaluations, False, None, restarted, "the gradient is zero")
                self.pairs.clear()
                restarted, why = True, "the direction was not one of descent (slope %g)" % slope0
                continue
            # With no pairs, a first move of length at most 1 (the gradient's scale says nothing of the curvature);
            # with pairs, gamma has scaled the direction and 1 is the natural step.
            step = min(1.0, 1.0 / math.sqrt(dot(g, g))) if steepest else 1.0

            def phi(a, d=d):
                trial_x = x + x.dtype.type(a) * d
                trial_f, trial_g = evaluate(trial_x)
                slope = dot(trial_g, d) if np.all(np.isfinite(trial_g)) else math.nan
                return Trial(a, float(trial_f), slope, (trial_x, trial_g))

            search = wolfe_line_search(phi, f, slope0, step, self.c1, self.c2, self.max_evaluations)
            evaluations += search.evaluations
            if search.ok:
                new_x, new_g = search.point.payload
                curvature = self.pairs.add(new_x - x, new_g - g)
                return Step(new_x, search.point.f, new_g, search.point.step, evaluations, True, curvature,
                            restarted, why)
            self.pairs.clear()
            restarted, why = True, "line search failed: %s" % search.why
            if search.point is not None:
                new_x, new_g = search.point.payload
                return Step(new_x, search.point.f, new_g, search.point.step, evaluations, True, None, True, why)
            if steepest:
                return Step(x, f, g, 0.0, evaluations, False, None, True, why)
