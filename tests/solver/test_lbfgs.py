"""L-BFGS's pieces against direct computations: the two-loop recursion against the BFGS matrix built from the same
pairs, finite termination on a quadratic with exact line searches, the strong Wolfe conditions of the line search
on known functions, and the curvature test that skips a pair."""
import math

import numpy as np
import pytest

from pycaffe_dist.solver import lbfgs


def spd(n, seed, condition=50.0):
    """A symmetric positive definite matrix of the given condition number."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return q @ np.diag(np.geomspace(1.0, condition, n)) @ q.T


def explicit_inverse_hessian(pairs, gamma):
    """BFGS's inverse Hessian as a matrix: gamma I updated by each pair, oldest first (N&W 6.17)."""
    n = len(pairs[0][0])
    h = gamma * np.eye(n)
    for s, y in pairs:
        rho = 1.0 / (s @ y)
        v = np.eye(n) - rho * np.outer(y, s)
        h = v.T @ h @ v + rho * np.outer(s, s)
    return h


@pytest.mark.parametrize("m, count", [(3, 3), (3, 7), (10, 5)])
def test_two_loop_is_the_bfgs_matrix_of_the_same_pairs(m, count):
    n, rng = 12, np.random.default_rng(count)
    a = spd(n, m)
    pairs = lbfgs.Pairs(m)
    kept = []
    for _ in range(count):
        s = rng.standard_normal(n)
        y = a @ s + 0.01 * rng.standard_normal(n)        # s'y > 0: the curvature of an SPD matrix
        assert pairs.add(s, y) is not None
        kept = (kept + [(s, y)])[-m:]
    s, y = kept[-1]
    assert pairs.gamma == pytest.approx((s @ y) / (y @ y), rel=1e-12)
    g = rng.standard_normal(n)
    expected = explicit_inverse_hessian(kept, pairs.gamma) @ g
    np.testing.assert_allclose(pairs.inverse_hessian_times(g), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(pairs.direction(g), -expected, rtol=1e-10, atol=1e-12)


def test_two_loop_with_no_pairs_is_the_gradient():
    g = np.arange(5.0)
    np.testing.assert_array_equal(lbfgs.Pairs(4).direction(g), -g)


def test_the_two_loop_keeps_float32_vectors_float32():
    pairs = lbfgs.Pairs(2)
    rng = np.random.default_rng(0)
    s = rng.standard_normal(100).astype(np.float32)
    assert pairs.add(s, 2 * s) is not None
    assert pairs.direction(s).dtype == np.float32


@pytest.mark.parametrize("n", [4, 9])
def test_exact_line_searches_find_a_quadratics_minimum_in_n_steps(n):
    """BFGS with exact line searches minimises a quadratic in n steps (its directions are conjugate); with m >= n the
    two-loop recursion is BFGS, and a new gamma each step only scales the direction (the exact step undoes that)."""
    a, b = spd(n, n, condition=1e3), np.random.default_rng(n).standard_normal(n)
    x = np.zeros(n)
    pairs = lbfgs.Pairs(n)
    g = a @ x - b
    for _ in range(n):
        d = pairs.direction(g)
        step = -(g @ d) / (d @ a @ d)
        new_x = x + step * d
        new_g = a @ new_x - b
        pairs.add(new_x - x, new_g - g)
        x, g = new_x, new_g
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-6, atol=1e-8)


def test_two_steps_short_of_n_it_is_not_there_yet():
    """The converse, so that the test above can fail: n - 2 exact steps leave a gradient."""
    n = 9
    a, b = spd(n, n, condition=1e3), np.random.default_rng(n).standard_normal(n)
    x, pairs = np.zeros(n), lbfgs.Pairs(n)
    g = a @ x - b
    for _ in range(n - 2):
        d = pairs.direction(g)
        new_x = x - (g @ d) / (d @ a @ d) * d
        pairs.add(new_x - x, a @ new_x - b - g)
        x, g = new_x, a @ new_x - b
    assert np.linalg.norm(g) > 1e-3


def line(function, gradient, x, d):
    """phi(a) of a function along x + a d, counting its calls."""
    calls = []

    def phi(a):
        calls.append(a)
        p = x + a * d
        return lbfgs.Trial(a, float(function(p)), float(gradient(p) @ d))
    return phi, calls


def rosenbrock(p):
    return 100 * (p[1] - p[0] ** 2) ** 2 + (1 - p[0]) ** 2


def rosenbrock_gradient(p):
    return np.array([-400 * p[0] * (p[1] - p[0] ** 2) - 2 * (1 - p[0]), 200 * (p[1] - p[0] ** 2)])


def meets_strong_wolfe(trial, f0, slope0, c1=lbfgs.C1, c2=lbfgs.C2):
    return trial.f <= f0 + c1 * trial.step * slope0 and abs(trial.slope) <= c2 * abs(slope0)


@pytest.mark.parametrize("step", [1e-4, 1.0, 30.0])
def test_the_line_search_meets_the_strong_wolfe_conditions_on_rosenbrock(step):
    """From a step too short (extrapolation), about right, and far too long (zoom)."""
    x = np.array([-1.2, 1.0])
    d = -rosenbrock_gradient(x)
    phi, calls = line(rosenbrock, rosenbrock_gradient, x, d)
    f0, slope0 = rosenbrock(x), float(rosenbrock_gradient(x) @ d)
    found = lbfgs.wolfe_line_search(phi, f0, slope0, step / np.linalg.norm(d))
    assert found.ok, found.why
    assert meets_strong_wolfe(found.point, f0, slope0)
    assert found.evaluations == len(calls) <= 10


def test_a_tighter_c2_lands_closer_to_the_minimum_along_the_line():
    """phi(a) = (a - 3)^2 - 9 along d = 1: with c2 = 0.1 the accepted step is within 10 % of the slope of 3."""
    phi = lambda a: lbfgs.Trial(a, (a - 3.0) ** 2 - 9.0, 2 * (a - 3.0))
    found = lbfgs.wolfe_line_search(phi, 0.0, -6.0, step=100.0, c2=0.1)
    assert found.ok and abs(found.point.step - 3.0) <= 0.3
    assert meets_strong_wolfe(found.point, 0.0, -6.0, c2=0.1)


def test_the_line_search_backs_off_where_the_objective_is_not_finite():
    """f(a) = -a below 1 and NaN beyond: the first trial (5) is NaN; the search comes back and finds Wolfe points
    only where it is finite."""
    def phi(a):
        if a > 1:
            return lbfgs.Trial(a, math.nan, math.nan)
        return lbfgs.Trial(a, (a - 0.8) ** 2, 2 * (a - 0.8))
    found = lbfgs.wolfe_line_search(phi, 0.64, -1.6, step=5.0)
    assert found.ok and found.point.step <= 1 and meets_strong_wolfe(found.point, 0.64, -1.6)


def test_a_line_search_out_of_evaluations_fails_with_its_best_decreasing_point():
    phi = lambda a: lbfgs.Trial(a, -a, -1.0)           # descends forever: never curved enough
    found = lbfgs.wolfe_line_search(phi, 0.0, -1.0, step=1.0, max_evaluations=3)
    assert not found.ok and found.evaluations == 3 and found.point.step == 16.0 and "3 evaluations" in found.why
    with pytest.raises(ValueError):
        lbfgs.wolfe_line_search(phi, 0.0, 1.0)


def test_a_pair_without_curvature_is_skipped():
    pairs = lbfgs.Pairs(3)
    s = np.array([1.0, 0.0])
    assert pairs.add(s, np.array([-1.0, 0.5])) is None                # s'y < 0
    assert pairs.add(s, np.array([0.0, 1.0])) is None                 # s'y = 0
    assert len(pairs) == 0
    assert pairs.add(s, np.array([2.0, 1.0])) == 2.0
    assert len(pairs) == 1


def test_lbfgs_minimises_rosenbrock():
    """The whole iteration, with its line search: the minimum (1, 1) of Rosenbrock from N&W's start."""
    solver = lbfgs.LBFGS(memory=5)
    x = np.array([-1.2, 1.0])
    f, g = rosenbrock(x), rosenbrock_gradient(x)
    evaluate = lambda p: (rosenbrock(p), rosenbrock_gradient(p))
    for _ in range(100):
        step = solver.iterate(x, f, g, evaluate)
        if not step.moved:
            break
        x, f, g = step.x, step.f, step.g
        if np.linalg.norm(g) < 1e-8:
            break
    np.testing.assert_allclose(x, [1.0, 1.0], atol=1e-5)


def test_a_failed_line_search_restarts_from_steepest_descent():
    """An objective that never decreases where its gradient says it should: the search along the pairs' direction
    fails, the pairs are cleared, steepest descent fails too, and x stays."""
    solver = lbfgs.LBFGS(memory=3, max_evaluations=4)
    solver.pairs.add(np.array([1.0, 0.0]), np.array([1.0, 0.0]))
    evaluate = lambda p: (3.0, np.array([1.0, 1.0]))
    x = np.array([1.0, 1.0])
    step = solver.iterate(x, 2.0, np.array([2.0, 2.0]), evaluate)
    assert step.restarted and "line search failed" in step.why and len(solver.pairs) == 0
    assert not step.moved and step.x is x and step.evaluations == 8
