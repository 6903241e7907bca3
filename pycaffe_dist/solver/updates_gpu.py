"""SGDSolver::ApplyUpdate on the GPU: the same steps as solver.updates.compute_steps, over the parameters' device
copies and device history, with the rule kernels of csrc/cuda/solvers.cu (Caffe's *_solver.cu).

The learning rate and everything else computed per iteration stay in solver.updates (one implementation); only
the per-element work moves. Gradient clipping sums each blob's dot product in float, as Caffe's GPU path does.
"""
import numpy as np

from ..backend import select
from ..errors import SolverError
from . import lr_policy, updates

f32 = np.float32


def compute_steps(param, blobs, lr_mults, decay_mults, history, iteration, current_step=0, source="solver"):
    """As updates.compute_steps, for Blobs in GPU mode; `history` is the solver's history as DeviceArrays."""
    dev = select.current()
    rate, current_step = lr_policy.learning_rate(param, iteration, current_step, source)
    diffs = [b.mutable_gpu_diff for b in blobs]
    norm, scale = _clip_gradients(dev, diffs, param.clip_gradients)
    for i, (blob, diff) in enumerate(zip(blobs, diffs)):
        if param.iter_size != 1:
            dev.scal(diff.size, f32(1) / f32(param.iter_size), diff)
        _regularize(dev, blob.gpu_data, diff, param.weight_decay, decay_mults[i], param.regularization_type, source)
        _update_value(dev, param, diff, history, i, len(blobs), rate * f32(lr_mults[i]), iteration)
    return {"rate": rate, "current_step": current_step, "clip_norm": norm, "clip_scale": scale}


def apply_steps(blobs):
    """Net::Update on the device: w -= step."""
    dev = select.current()
    for blob in blobs:
        dev.axpy(blob.count, -1.0, blob.gpu_diff, blob.mutable_gpu_data)


def _clip_gradients(dev, diffs, clip):
    clip = f32(clip)
    if clip < 0:
        return None, None
    sumsq = f32(0)
    for d in diffs:
        sumsq += f32(dev.dot(d.size, d, d))
    norm = np.sqrt(sumsq)
    if not norm > clip:
        return norm, None
    scale = clip / norm
    for d in diffs:
        dev.scal(d.size, scale, d)
    return norm, scale


def _regularize(dev, data, diff, weight_decay, decay_mult, regularization_type, source):
    local_decay = f32(weight_decay) * f32(decay_mult)
    if not local_decay:
        return
    if regularization_type == "L2":
        dev.axpy(diff.size, local_decay, data, diff)
    elif regularization_type == "L1":
        dev.launch("l1_regularize", diff.size, local_decay, data, diff)
    else:
        raise SolverError("%s: unknown regularization type: %r (Caffe knows L1, L2)" % (source, regularization_type))


def _update_value(dev, param, diff, history, i, num_params, local_rate, iteration):
    kind, n, h = param.type, diff.size, history[i]
    if kind == "SGD":
        dev.launch("sgd_update", n, diff, h, f32(param.momentum), local_rate)
    elif kind == "Nesterov":
        dev.launch("nesterov_update", n, diff, h, f32(param.momentum), local_rate)
    elif kind == "AdaGrad":
        dev.launch("adagrad_update", n, diff, h, f32(param.delta), local_rate)
    elif kind == "RMSProp":
        dev.launch("rmsprop_update", n, diff, h, f32(param.rms_decay), f32(param.delta), local_rate)
    elif kind == "AdaDelta":
        dev.launch("adadelta_update", n, diff, h, history[num_params + i], f32(param.momentum), f32(param.delta),
                   local_rate)
    elif kind == "Adam":
        correction = updates.adam_correction(param.momentum, param.momentum2, iteration + 1)
        dev.launch("adam_update", n, diff, h, history[num_params + i], f32(param.momentum), f32(param.momentum2),
                   f32(param.delta), f32(local_rate) * correction)
    else:
        updates.check_solver(param)
