"""Learning-rate policies, as Caffe's SGDSolver::GetLearningRate (src/caffe/solvers/sgd_solver.cpp).

`iteration` is the number of updates already applied. multistep keeps state (the current step), which Caffe
persists in SolverState.current_step.

The arithmetic follows the C++ overloads Caffe's expressions pick, so that the rate is the same float32
number: the solver fields are floats; std::pow(float, int) is the double overload, so step, exp and multistep
are computed in double and rounded to float once; std::pow(float, float) (inv, poly) is powf and std::exp(float)
(sigmoid) is expf, with the rest of those expressions in float. numpy's float32 power is powf; its exp is not
glibc's, so expf is taken as the float32 rounding of the double exp.
"""

import numpy as np

from ..errors import SolverError

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")
f32 = np.float32


def check_policy(param, source="solver"):
    """The checks Caffe makes when it computes a rate (CHECK_GE gamma, CHECK_GT stepsize, unknown policy)."""
    policy = param.lr_policy
    if policy not in POLICIES:
        raise SolverError("%s: unknown learning rate policy: %r (Caffe knows %s)"
                          % (source, policy, ", ".join(POLICIES)))
    if policy in ("step", "exp", "inv", "multistep", "sigmoid") and param.gamma < 0:
        raise SolverError("%s: lr_policy %s needs gamma >= 0, got %g" % (source, policy, param.gamma))
    if policy in ("step", "sigmoid") and param.stepsize <= 0:
        raise SolverError("%s: lr_policy %s needs stepsize > 0, got %d" % (source, policy, param.stepsize))


def _pow(base, exponent):
    """std::pow in double: inf past the range (math.pow raises OverflowError instead)."""
    with np.errstate(over="ignore"):
        return float(np.power(np.float64(base), np.float64(exponent)))


def learning_rate(param, iteration, current_step=0, source="solver"):
    """Return (rate as float32, current_step) for the update that follows `iteration` completed updates."""
    check_policy(param, source)
    policy, base = param.lr_policy, f32(param.base_lr)
    gamma, power = f32(param.gamma), f32(param.power)
    if policy == "fixed":
        rate = base
    elif policy == "step":
        current_step = iteration // param.stepsize
        rate = float(base) * _pow(gamma, current_step)
    elif policy == "exp":
        rate = float(base) * _pow(gamma, iteration)
    elif policy == "inv":
        rate = base * np.power(f32(1) + gamma * f32(iteration), -power)
    elif policy == "multistep":
        # At most one step per call, as Caffe does.
        if current_step < len(param.stepvalue) and iteration >= param.stepvalue[current_step]:
            current_step += 1
        rate = float(base) * _pow(gamma, current_step)
    elif policy == "poly":
        rate = base * np.power(f32(1) - f32(iteration) / f32(param.max_iter), power)
    else:  # sigmoid
        with np.errstate(over="ignore"):    # exp past the range is inf, and the rate 0, as in C++
            decay = f32(np.exp(np.float64(-gamma * (f32(iteration) - f32(param.stepsize)))))
            rate = base * (f32(1) / (f32(1) + decay))
    return f32(rate), current_step
