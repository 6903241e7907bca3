"""Caffe's update rules as functions of arrays: one implementation, used by the local Solver and by the master
of the distributed modes (src/caffe/solvers/{sgd,nesterov,adagrad,rmsprop,adadelta,adam}_solver.cpp).

Everything is float32 and follows Caffe's CPU operation order, so results agree with Caffe's to rounding:
caffe_cpu_axpby(a, x, b, y) is BLAS scal then axpy (y = b*y; y += a*x), caffe_powx(x, 2) and
caffe_powx(x, 0.5) are the correctly rounded square and square root, caffe_cpu_sign is (0 < x) - (x < 0).

The functions work in place, as Caffe does on its blobs: `diff` (the gradient) becomes the step that
`apply_step` subtracts from the parameter, and the history arrays are updated. A solver keeps
`HISTORY_SETS[type]` history arrays per parameter, laid out as Caffe's SGDSolver::history_ and its
.solverstate: all parameters' first set, then (AdaDelta, Adam) all parameters' second set.
"""

import numpy as np

from .. import libm
from .._kernels import updates as _fused
from ..errors import SolverError
from . import lr_policy

f32 = np.float32

# Solver type -> number of history arrays per learnable parameter (Caffe's PreSolve methods).
HISTORY_SETS = {"SGD": 1, "Nesterov": 1, "AdaGrad": 1, "RMSProp": 1, "AdaDelta": 2, "Adam": 2}


def check_solver(param, source="solver"):
    """The checks of Caffe's solver constructors (SolverRegistry, AdaGrad/RMSProp sanity checks, Solver::Init),
    and iter_size >= 1 (Caffe would divide by zero). The regularization type, like Caffe, is checked when used."""
    if param.type not in HISTORY_SETS:
        raise SolverError("%s: unknown solver type: %r (known types: %s)"
                          % (source, param.type, ", ".join(sorted(HISTORY_SETS))))
    if param.type in ("AdaGrad", "RMSProp") and param.momentum != 0:
        raise SolverError("%s: momentum cannot be used with %s (momentum: %g)" % (source, param.type, param.momentum))
    if param.type == "RMSProp" and not 0 <= param.rms_decay < 1:
        raise SolverError("%s: rms_decay should lie between 0 and 1 (rms_decay: %g)" % (source, param.rms_decay))
    if param.average_loss < 1:
        raise SolverError("%s: average_loss should be at least 1, got %d" % (source, param.average_loss))
    if param.iter_size < 1:
        raise SolverError("%s: iter_size should be at least 1, got %d" % (source, param.iter_size))


def _axpby(a, x, b, y):
    y *= b
    y += a * x


# --- the steps of SGDSolver::ApplyUpdate, in its order ------------------------------------------------------

def clip_gradients(diffs, clip):
    """Scale all gradients down when their global L2 norm exceeds `clip` (< 0: off). Returns (norm, scale), scale
    None when nothing was scaled. Caffe sums each blob's float dot product in float."""
    clip = f32(clip)
    if clip < 0:
        return None, None
    sumsq = f32(0)
    for d in diffs:
        flat = d.reshape(-1)
        sumsq += f32(np.dot(flat, flat))
    norm = np.sqrt(sumsq)
    if not norm > clip:
        return norm, None
    scale = clip / norm
    for d in diffs:
        d *= scale
    return norm, scale


def normalize(diff, iter_size):
    """Scale an accumulated gradient by 1 / iter_size (Caffe's Normalize; nothing to do for iter_size 1)."""
    if iter_size != 1:
        diff *= f32(1) / f32(iter_size)


def regularize(data, diff, weight_decay, decay_mult, regularization_type="L2", source="solver"):
    """Add weight decay to the gradient: L2 adds decay * w, L1 adds decay * sign(w); decay = weight_decay *
    decay_mult, and nothing happens when it is 0."""
    local_decay = f32(weight_decay) * f32(decay_mult)
    if not local_decay:
        return
    if regularization_type == "L2":
        diff += local_decay * data
    elif regularization_type == "L1":
        diff += local_decay * np.sign(data)
    else:
        raise SolverError("%s: unknown regularization type: %r (Caffe knows L1, L2)" % (source, regularization_type))


def sgd(diff, history, local_rate, momentum):
    """h = momentum * h + lr * g; step = h."""
    _axpby(f32(local_rate), diff, f32(momentum), history)
    diff[...] = history


def nesterov(diff, history, local_rate, momentum):
    """h' = momentum * h + lr * g; step = (1 + momentum) * h' - momentum * h."""
    momentum = f32(momentum)
    previous = history.copy()
    _axpby(f32(local_rate), diff, momentum, history)
    _axpby(f32(1) + momentum, history, -momentum, previous)
    diff[...] = previous


def adagrad(diff, history, local_rate, delta):
    """h += g^2; step = lr * g / (sqrt(h) + delta)."""
    history += np.square(diff)
    update = np.sqrt(history)
    update += f32(delta)
    np.divide(diff, update, out=update)
    np.multiply(update, f32(local_rate), out=diff)


def rmsprop(diff, history, local_rate, rms_decay, delta):
    """h = rms_decay * h + (1 - rms_decay) * g^2; step = lr * g / (sqrt(h) + delta)."""
    rms_decay = f32(rms_decay)
    _axpby(f32(1) - rms_decay, np.square(diff), rms_decay, history)
    update = np.sqrt(history)
    update += f32(delta)
    np.divide(diff, update, out=update)
    np.multiply(update, f32(local_rate), out=diff)


def adadelta(diff, history, update_history, local_rate, momentum, delta):
    """h = m * h + (1 - m) * g^2; u = g * sqrt((h2 + delta) / (h + delta)); h2 = m * h2 + (1 - m) * u^2;
    step = lr * u (m is the solver's `momentum`)."""
    momentum, delta = f32(momentum), f32(delta)
    _axpby(f32(1) - momentum, np.square(diff), momentum, history)
    update = update_history + delta
    update /= history + delta
    np.sqrt(update, out=update)
    diff *= update
    _axpby(f32(1) - momentum, np.square(diff), momentum, update_history)
    diff *= f32(local_rate)


def adam_correction(beta1, beta2, t):
    """sqrt(1 - beta2^t) / (1 - beta1^t), computed in double from the float betas (std::pow(float, int)) and
    rounded to float, as Caffe's AdamSolver does."""
    b1, b2 = float(f32(beta1)), float(f32(beta2))
    with np.errstate(all="ignore"):     # beta1 = 1 or beta2 > 1: inf or NaN, as in C++ (math.* would raise)
        return f32(np.sqrt(np.float64(1.0 - libm.pow(b2, t))) / np.float64(1.0 - libm.pow(b1, t)))


def adam(diff, m, v, local_rate, beta1, beta2, delta, t):
    """m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g^2; step = lr * correction(t) * m / (sqrt(v) + delta),
    t = iteration + 1 (bias correction folded into the rate, delta added to the uncorrected sqrt(v))."""
    beta1, beta2 = f32(beta1), f32(beta2)
    correction = adam_correction(beta1, beta2, t)
    _axpby(f32(1) - beta1, diff, beta1, m)
    _axpby(f32(1) - beta2, diff * diff, beta2, v)
    update = np.sqrt(v)
    update += f32(delta)
    np.divide(m, update, out=update)
    np.multiply(update, f32(local_rate) * correction, out=diff)


def compute_update_value(param, diff, history, param_id, num_params, local_rate, iteration):
    """The solver type's ComputeUpdateValue for one parameter: `history` is the solver's whole history list."""
    kind = param.type
    h = history[param_id]
    if kind == "SGD":
        sgd(diff, h, local_rate, param.momentum)
    elif kind == "Nesterov":
        nesterov(diff, h, local_rate, param.momentum)
    elif kind == "AdaGrad":
        adagrad(diff, h, local_rate, param.delta)
    elif kind == "RMSProp":
        rmsprop(diff, h, local_rate, param.rms_decay, param.delta)
    elif kind == "AdaDelta":
        adadelta(diff, h, history[num_params + param_id], local_rate, param.momentum, param.delta)
    elif kind == "Adam":
        adam(diff, h, history[num_params + param_id], local_rate, param.momentum, param.momentum2, param.delta,
             iteration + 1)
    else:
        check_solver(param)


def new_history(param, shapes):
    """Zero history arrays for parameters of the given shapes, in Caffe's order."""
    return [np.zeros(s, dtype=np.float32) for _ in range(HISTORY_SETS[param.type]) for s in shapes]


def compute_steps(param, datas, diffs, lr_mults, decay_mults, history, iteration, current_step=0,
                  source="solver", apply=False):
    """SGDSolver::ApplyUpdate up to, not including, Net::Update: learning rate, gradient clipping, then for each
    parameter Normalize, Regularize and ComputeUpdateValue. `diffs` are turned into the steps in place.
    apply: also Net::Update each parameter (data -= step) right after its step, in the same pass where the step
    is fused; the same as apply_steps afterwards, as a step reads only its own parameter's data and diff.

    Returns a dict: rate (float32), current_step, clip_norm and clip_scale (None when not clipped)."""
    rate, current_step = lr_policy.learning_rate(param, iteration, current_step, source)
    norm, scale = clip_gradients(diffs, param.clip_gradients)
    sgd_l2 = param.type == "SGD" and param.regularization_type == "L2"
    for i, (data, diff) in enumerate(zip(datas, diffs)):
        normalize(diff, param.iter_size)
        if sgd_l2 and _float32_flat(data, diff, history[i]):
            # the common case in one pass (csrc/updates.pyx): regularize and sgd below, to the same bits
            _fused.sgd_step(data.reshape(-1), diff.reshape(-1), history[i].reshape(-1),
                            f32(param.weight_decay) * f32(decay_mults[i]), rate * f32(lr_mults[i]),
                            f32(param.momentum), apply)
            continue
        regularize(data, diff, param.weight_decay, decay_mults[i], param.regularization_type, source)
        compute_update_value(param, diff, history, i, len(diffs), rate * f32(lr_mults[i]), iteration)
        if apply:
            data -= diff
    return {"rate": rate, "current_step": current_step, "clip_norm": norm, "clip_scale": scale}


def _float32_flat(*arrays):
    return all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def apply_steps(datas, diffs):
    """Net::Update: w -= step, for every parameter."""
    for data, diff in zip(datas, diffs):
        data -= diff
