"""SGDSolver::ApplyUpdate on the GPU: the same steps as solver.updates.compute_steps, over the parameters' device
copies and device history, with the rule kernels of csrc/cuda/solvers.cu (Caffe's *_solver.cu).

The learning rate and everything else computed per iteration stay in solver.updates (one implementation); only
the per-element work moves. Gradient clipping sums each blob's dot product in float, as Caffe's GPU path does.

Caffe launches a regularize, an update and a Net::Update call per parameter: 963 for ResNet-50 (its BatchNorm
statistics are learnable params too), most too small to keep the GPU busy while the host issues the next. The
common case, SGD with L2 decay and iter_size 1, runs as two launches over every parameter instead (csrc/cuda/
solvers.cu's *_many kernels, over a ParameterTable of the parameters' device arrays): the same arithmetic.
"""
import numpy as np

from ..backend import select
from ..errors import SolverError
from . import lr_policy, updates

f32 = np.float32


def compute_steps(param, blobs, lr_mults, decay_mults, history, iteration, current_step=0, source="solver",
                  tables=None):
    """As updates.compute_steps, for Blobs in GPU mode; `history` is the solver's history as DeviceArrays.
    tables: a dict the caller keeps between calls, where the ParameterTable of SGD's one launch is kept."""
    dev = select.current()
    rate, current_step = lr_policy.learning_rate(param, iteration, current_step, source)
    diffs = [b.mutable_gpu_diff for b in blobs]
    norm, scale = _clip_gradients(dev, diffs, param.clip_gradients)
    if param.type == "SGD" and param.regularization_type == "L2" and param.iter_size == 1:
        table = ParameterTable.of(tables, dev, blobs, diffs, history, lr_mults, decay_mults, param.weight_decay)
        if table is not None:
            table.launch(dev, "sgd_update_many", f32(param.momentum), rate)
            return {"rate": rate, "current_step": current_step, "clip_norm": norm, "clip_scale": scale}
    for i, (blob, diff) in enumerate(zip(blobs, diffs)):
        if param.iter_size != 1:
            dev.scal(diff.size, f32(1) / f32(param.iter_size), diff)
        _regularize(dev, blob.gpu_data, diff, param.weight_decay, decay_mults[i], param.regularization_type, source)
        _update_value(dev, param, diff, history, i, len(blobs), rate * f32(lr_mults[i]), iteration)
    return {"rate": rate, "current_step": current_step, "clip_norm": norm, "clip_scale": scale}


def apply_steps(blobs, tables=None):
    """Net::Update on the device: w -= step (one launch where compute_steps, given the same `tables`, ran over a
    ParameterTable of them)."""
    dev = select.current()
    table = (tables or {}).get(dev)
    if table is not None and table.updates(blobs):
        table.launch(dev, "apply_update_many")
        return
    for blob in blobs:
        dev.axpy(blob.count, -1.0, blob.gpu_diff, blob.mutable_gpu_data)


class ParameterTable:
    """The device tables the *_many kernels read: each parameter's diff, history and data addresses, count,
    lr_mult and decay (weight_decay * decay_mult, float32 as Regularize's), and its elements in chunks of CHUNK.
    Made once and kept in the caller's `tables` ({device: table}) while the arrays and multipliers stay the same."""
    CHUNK = 4096

    @classmethod
    def of(cls, tables, dev, blobs, diffs, history, lr_mults, decay_mults, weight_decay):
        """The table of these arrays (the one in `tables` where it matches, else a new one kept there), or None
        where one launch cannot cover them (2^31 threads or more) or there is nowhere to keep it."""
        if tables is None:
            return None
        datas = [b.gpu_data for b in blobs]
        decays = [f32(weight_decay) * f32(m) for m in decay_mults]
        key = (tuple((d.ptr, h.ptr, w.ptr, d.size) for d, h, w in zip(diffs, history, datas)),
               tuple(f32(m) for m in lr_mults), tuple(decays))
        table = tables.get(dev)
        if table is None or table.key != key:
            chunks = sum(-(-d.size // cls.CHUNK) for d in diffs)
            if chunks * cls.CHUNK >= 2 ** 31:
                return None
            table = tables[dev] = cls(dev, key, diffs, history, datas, lr_mults, decays)
        return table

    def __init__(self, dev, key, diffs, history, datas, lr_mults, decays):
        self.key = key
        chunk_param, chunk_start = [], []
        for p, d in enumerate(diffs):
            for start in range(0, d.size, self.CHUNK):
                chunk_param.append(p)
                chunk_start.append(start)
        addresses = np.array([a.ptr for d, h, w in zip(diffs, history, datas) for a in (d, h, w)], np.int64)
        self.threads = len(chunk_param) * self.CHUNK
        self.arrays = [dev.to_device(np.array(chunk_param or [0], np.int32)),
                       dev.to_device(np.array(chunk_start or [0], np.int32)),
                       dev.to_device(addresses if addresses.size else np.zeros(1, np.int64)),
                       dev.to_device(np.array([d.size for d in diffs] or [0], np.int32))]
        self.multipliers = [dev.to_device(np.array(lr_mults or [0], f32)), dev.to_device(np.array(decays or [0], f32))]

    def updates(self, blobs):
        """Whether the table holds these blobs' diffs and data (Net::Update after compute_steps)."""
        datas = [b.mutable_gpu_data for b in blobs]
        diffs = [b.gpu_diff for b in blobs]
        return len(blobs) == len(self.key[0]) and all(
            (d.ptr, w.ptr) == (entry[0], entry[2]) for d, w, entry in zip(diffs, datas, self.key[0]))

    def launch(self, dev, kernel, *scalars):
        args = self.arrays + (self.multipliers if kernel == "sgd_update_many" else [])
        dev.launch(kernel, self.threads, self.CHUNK, *args, *(float(s) for s in scalars))


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
