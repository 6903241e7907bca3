"""Learning-rate policies, as Caffe's SGDSolver::GetLearningRate (src/caffe/solvers/sgd_solver.cpp).

`iteration` is the number of updates already applied. multistep keeps state (the current step), which Caffe
persists in SolverState.current_step.

The arithmetic follows the C++ overloads Caffe's expressions pick, so that the rate is the same float32
number: the solver fields are floats; std::pow(float, int) is the double overload, so step, exp and multistep
are computed in double and rounded to float once; std::pow(float, float) (inv, poly) is powf and std::exp(float)
(sigmoid) is expf, with the rest of those expressions in float. The pow and exp are the C library's (`libm`),
never numpy's, whose vectorised versions differ from libm by an ulp on some CPUs.
"""

import numpy as np

from .. import libm
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


def steps_taken(param, iteration):
    """multistep's current_step after `iteration` updates from the start (the Solver's, had it run them): the rule
    of learning_rate below, replayed over the step values only (Caffe advances at most one step per update)."""
    step, first_call = 0, 0          # first_call: the first update not yet replayed
    while step < len(param.stepvalue):
        at = max(first_call, param.stepvalue[step])     # the first update at which the rule advances
        if at >= iteration:
            break
        step, first_call = step + 1, at + 1
    return step


def learning_rate(param, iteration, current_step=0, source="solver"):
    """Return (rate as float32, current_step) for the update that follows `iteration` completed updates."""
    check_policy(param, source)
    policy, base = param.lr_policy, f32(param.base_lr)
    gamma, power = f32(param.gamma), f32(param.power)
    if policy == "fixed":
        rate = base
    elif policy == "step":
        current_step = iteration // param.stepsize
        rate = float(base) * libm.pow(gamma, current_step)
    elif policy == "exp":
        rate = float(base) * libm.pow(gamma, iteration)
    elif policy == "inv":
        rate = base * libm.powf(f32(1) + gamma * f32(iteration), -power)
    elif policy == "multistep":
        # At most one step per call, as Caffe does.
        if current_step < len(param.stepvalue) and iteration >= param.stepvalue[current_step]:
            current_step += 1
        rate = float(base) * libm.pow(gamma, current_step)
    elif policy == "poly":
        rate = base * libm.powf(f32(1) - f32(iteration) / f32(param.max_iter), power)
    else:  # sigmoid
        decay = libm.expf(-gamma * (f32(iteration) - f32(param.stepsize)))
        with np.errstate(over="ignore"):    # exp past the range is inf, and the rate 0, as in C++
            rate = base * (f32(1) / (f32(1) + decay))
    return f32(rate), current_step
