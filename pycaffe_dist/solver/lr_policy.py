"""Learning-rate policies, as Caffe's SGDSolver::GetLearningRate (src/caffe/solvers/sgd_solver.cpp).

Computed in float32 like Caffe (Dtype = float, powf). `iter` is the number of updates already applied.
multistep keeps state (the current step), which Caffe persists in SolverState.current_step.
"""
import math

import numpy as np

from ..errors import SolverError

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")
f32 = np.float32


def check_policy(param, source="solver"):
    """The checks Caffe makes (at the first update, or in the constructor): fail early and clearly."""
    policy = param.lr_policy
    if policy not in POLICIES:
        raise SolverError("%s: unknown learning rate policy: %r (Caffe knows %s)"
                          % (source, policy, ", ".join(POLICIES)))
    if policy in ("step", "exp", "inv", "sigmoid") and param.gamma < 0:
        raise SolverError("%s: lr_policy %s needs gamma >= 0, got %g" % (source, policy, param.gamma))
    if policy in ("step", "sigmoid") and param.stepsize <= 0:
        raise SolverError("%s: lr_policy %s needs stepsize > 0, got %d" % (source, policy, param.stepsize))


def learning_rate(param, iteration, current_step=0):
    """Return (rate, current_step) for the update that follows `iteration` completed updates."""
    policy, base = param.lr_policy, f32(param.base_lr)
    gamma, power = f32(param.gamma), f32(param.power)
    if policy == "fixed":
        rate = base
    elif policy == "step":
        current_step = iteration // param.stepsize
        rate = base * gamma ** f32(current_step)
    elif policy == "exp":
        rate = base * gamma ** f32(iteration)
    elif policy == "inv":
        rate = base * (f32(1) + gamma * f32(iteration)) ** (-power)
    elif policy == "multistep":
        # At most one step per call, as Caffe does.
        if current_step < len(param.stepvalue) and iteration >= param.stepvalue[current_step]:
            current_step += 1
        rate = base * gamma ** f32(current_step)
    elif policy == "poly":
        rate = base * (f32(1) - f32(iteration) / f32(param.max_iter)) ** power
    elif policy == "sigmoid":
        rate = base * (f32(1) / (f32(1) + f32(math.exp(-float(gamma) * (iteration - param.stepsize)))))
    else:
        check_policy(param)
    return f32(rate), current_step
