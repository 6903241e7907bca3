"""The pycaffe interface (python/caffe/pycaffe.py and _caffe.cpp): `Net(prototxt, [weights], phase)`, blobs and
params as ordered dicts, forward/backward with keyword inputs, copy_from/save; `get_solver(path)` and
SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver, AdaDeltaSolver, AdamSolver; `layer_type_list`, `Timer`,
`init_log` and `log`, and `has_nccl`/`NCCL` as a Caffe built without NCCL has them. A user's pycaffe script runs
after `import pycaffe_dist as caffe`.
"""
import collections
import logging
import os
import sys
import time

import numpy as np

from . import common
from .errors import ModelFileError, NetError
from .io.caffemodel import is_hdf5, load_weights, write_model
from .io.load import read_net
from .layers import layer_types
from .net import net as _net
from .proto import caffe_pb2
from .proto.binary import write_binary
from .solver import solver as _solver
from .solver import training_log

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def _net_param(spec):
    if isinstance(spec, caffe_pb2.NetParameter):
        return spec
    if isinstance(spec, (str, bytes, os.PathLike)):
        return read_net(os.fsdecode(spec))
    raise TypeError("Net() takes a prototxt path or a NetParameter, not %r" % type(spec).__name__)


class Net(_net.Net):
    """Net(network_file, phase, level=0, stages=None, weights=None), or the older Net(network_file, weights,
    phase); phase and weights may also be keywords. The graph and its running are net.Net's; this adds pycaffe's
    dictionaries, keyword forward/backward and file-name weight I/O."""

    def __init__(self, network_file, *args, phase=None, weights=None, level=0, stages=None):
        args = list(args)
        if args and isinstance(args[0], (str, bytes, os.PathLike)):
            weights = args.pop(0)
        if args:
            phase = args.pop(0)
        if args:
            level = args.pop(0)
        if args:
            stages = args.pop(0)
        if phase is None:
            raise TypeError("Net() needs a phase (pycaffe_dist.TRAIN or pycaffe_dist.TEST)")
        if phase not in (TRAIN, TEST):
            raise ValueError("phase must be TRAIN (0) or TEST (1), got %r" % (phase,))
        super().__init__(_net_param(network_file), phase=phase, level=level, stages=stages or ())
        if weights is not None:
            self.copy_from(weights)

    # --- pycaffe's dictionaries ---------------------------------------------------------------------------

    @property
    def blobs(self):
        return collections.OrderedDict((n, b) for n, b in zip(self.blob_names, self.blob_list) if n != "(automatic)")

    @property
    def params(self):
        return collections.OrderedDict((n, l.blobs) for n, l in zip(self.layer_names, self.layers) if l.blobs)

    @property
    def layer_dict(self):
        return collections.OrderedDict(zip(self.layer_names, self.layers))

    @property
    def _layer_names(self):
        return list(self.layer_names)

    @property
    def _blob_names(self):
        return list(self.blob_names)

    @property
    def top_names(self):
        return collections.OrderedDict((n, [self.blob_names[i] for i in ids])
                                       for n, ids in zip(self.layer_names, self.top_ids))

    @property
    def bottom_names(self):
        return collections.OrderedDict((n, [self.blob_names[i] for i in ids])
                                       for n, ids in zip(self.layer_names, self.bottom_ids))

    @property
    def blob_loss_weights(self):
        weights = collections.OrderedDict((n, 0.0) for n in self.blob_names)
        for layer, ids in zip(self.layers, self.top_ids):
            for w, i in zip(layer.loss_weights, ids):
                if w:
                    weights[self.blob_names[i]] = w
        return weights

    # --- running ------------------------------------------------------------------------------------------

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """Run the net (from layer `start` to layer `end`, by name); return {output name: data}."""
        blobs = list(blobs or [])
        start_ind = self.layer_index(start) if start is not None else 0
        if end is not None:
            end_ind = self.layer_index(end)
            outputs = set(self.top_names[end] + blobs)
        else:
            end_ind = len(self.layers) - 1
            outputs = set(self.outputs + blobs)
        if kwargs:
            if set(kwargs) != set(self.inputs):
                raise NetError("input blob arguments %s do not match net inputs %s" % (sorted(kwargs), self.inputs))
            for name, array in kwargs.items():
                blob = self.blobs[name]
                if np.shape(array)[:1] != blob.shape[:1]:
                    raise NetError("input '%s' is not batch sized: %s vs. blob %s"
                                   % (name, np.shape(array), blob.shape))
                blob.data[...] = array
        self.forward_from_to(start_ind, end_ind)
        return {name: self.blobs[name].data for name in outputs}

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """Back-propagate (from layer `start` down to `end`); return {input name: diff}."""
        diffs = list(diffs or [])
        start_ind = self.layer_index(start) if start is not None else len(self.layers) - 1
        if end is not None:
            end_ind = self.layer_index(end)
            outputs = set(self.bottom_names[end] + diffs)
        else:
            end_ind = 0
            outputs = set(self.inputs + diffs)
        if kwargs:
            if set(kwargs) != set(self.outputs):
                raise NetError("top diff arguments %s do not match net outputs %s" % (sorted(kwargs), self.outputs))
            for name, diff in kwargs.items():
                blob = self.blobs[name]
                if np.shape(diff)[:1] != blob.shape[:1]:
                    raise NetError("diff '%s' is not batch sized: %s vs. blob %s" % (name, np.shape(diff), blob.shape))
                blob.diff[...] = diff
        self.backward_from_to(start_ind, end_ind)
        return {name: self.blobs[name].diff for name in outputs}

    def forward_all(self, blobs=None, **kwargs):
        """Forward batch after batch over inputs longer than one batch; outputs concatenated (pycaffe's)."""
        all_outs = {out: [] for out in set(self.outputs + list(blobs or []))}
        if not kwargs:
            return self.forward(blobs)
        batch = self.blobs[self.inputs[0]].shape[0]
        total = len(next(iter(kwargs.values())))
        for start in range(0, total, batch):
            chunk = {}
            for name, array in kwargs.items():
                part = np.asarray(array[start:start + batch])
                if len(part) < batch:   # pad the last batch as pycaffe does, then trim
                    part = np.concatenate([part, np.zeros((batch - len(part),) + part.shape[1:], part.dtype)])
                chunk[name] = part
            outs = self.forward(blobs, **chunk)
            for out, value in outs.items():
                all_outs[out].extend(value.copy())
        return {out: np.asarray(values[:total]) for out, values in all_outs.items()}

    # --- weights --------------------------------------------------------------------------------------------

    def copy_from(self, path):
        """Load weights from a .caffemodel (any format version, or HDF5) into the layers of the same name."""
        load_weights(self, path)

    def save(self, path):
        write_binary(os.fsdecode(path), self.to_proto())

    def save_hdf5(self, path):
        """Write the weights as Caffe's Net::ToHDF5 does (data/<layer>/<blob index>, no diffs)."""
        write_model(self, os.fsdecode(path), hdf5=True)

    def load_hdf5(self, path):
        """Load weights written by save_hdf5 (or Caffe's ToHDF5); unlike copy_from, only from an HDF5 file."""
        path = os.fsdecode(path)
        if not is_hdf5(path):
            raise ModelFileError("%s: not an HDF5 file (load_hdf5 reads what save_hdf5 writes; copy_from reads a "
                                 ".caffemodel)" % path)
        load_weights(self, path)


# --- solvers ------------------------------------------------------------------------------------------------

class Solver(_solver.Solver):
    """The Solver with pycaffe's Net for its train and test nets (solver.net.blobs, .params, forward(...))."""
    net_class = Net


def get_solver(filename):
    """A solver of the type the file names (`type`, default SGD), as caffe.get_solver."""
    return Solver(filename if isinstance(filename, caffe_pb2.SolverParameter) else os.fsdecode(filename))


class SGDSolver(Solver):
    """A solver of this class's type whatever the file's `type` says, as pycaffe's SGDSolver(filename) etc."""
    solver_type = "SGD"

    def __init__(self, filename):
        super().__init__(filename if isinstance(filename, caffe_pb2.SolverParameter) else os.fsdecode(filename),
                         solver_type=self.solver_type)


class NesterovSolver(SGDSolver):
    solver_type = "Nesterov"


class AdaGradSolver(SGDSolver):
    solver_type = "AdaGrad"


class RMSPropSolver(SGDSolver):
    solver_type = "RMSProp"


class AdaDeltaSolver(SGDSolver):
    solver_type = "AdaDelta"


class AdamSolver(SGDSolver):
    solver_type = "Adam"


# --- the rest of _caffe.cpp's names --------------------------------------------------------------------------------

log_ = logging.getLogger("pycaffe_dist")


def layer_type_list():
    """The layer types this build registers, by Caffe's type string, sorted (Caffe's LayerRegistry lists the keys
    of its map)."""
    return layer_types()


def has_nccl():
    """False, as a Caffe built without USE_NCCL answers: this project trains on several GPUs or machines with
    `dist_caffe train --workers N`, not through NCCL."""
    return False


class NCCL:
    """Caffe's NCCL binding as a Caffe built without USE_NCCL has it: it is constructed from (solver, uid) and has
    none of NCCL's methods (new_uid, bcast, ...). A script that checks has_nccl() first runs; one that uses NCCL
    anyway is told, at its first use, what to do instead."""

    def __init__(self, solver, uid):
        self.solver, self.uid = solver, uid

    def __getattr__(self, name):
        raise AttributeError("NCCL.%s: this build has no NCCL (caffe.has_nccl() is False); train on several GPUs "
                             "with `dist_caffe train --workers N`" % name)


class Timer:
    """Caffe's Timer: start(), stop(), and `ms`, the time from the last start to its stop. Reading `ms` stops a
    running timer, and reads 0 (with a warning) before any start. In CPU mode Caffe counts whole milliseconds
    (boost's total_milliseconds), and so does this Timer; in GPU mode, fractions of one."""

    def __init__(self):
        self.running = self.has_run = False
        self.started = self.stopped = 0.0

    def start(self):
        if not self.running:
            self.started, self.running, self.has_run = time.perf_counter(), True, True

    def stop(self):
        if self.running:
            self.stopped, self.running = time.perf_counter(), False

    @property
    def ms(self):
        if not self.has_run:
            log_.warning("Timer has never been run before reading time.")
            return 0.0
        self.stop()
        elapsed = 1e3 * (self.stopped - self.started)
        return elapsed if common.mode() == "gpu" else float(int(elapsed))


class _SolverGroup:
    """What Caffe's multi-GPU training keeps per process: how many solvers train together, this one's rank among
    them, and whether they are processes (set_multiprocess) rather than threads. Caffe's NCCL reads them; here
    nothing trains through them (has_nccl() is False), but a script that sets and reads them sees its values,
    as under a Caffe built without NCCL."""
    count, rank, multiprocess = 1, 0, False


def solver_count():
    return _SolverGroup.count


def set_solver_count(count):
    _SolverGroup.count = int(count)


def solver_rank():
    return _SolverGroup.rank


def set_solver_rank(rank):
    _SolverGroup.rank = int(rank)


def set_multiprocess(multiprocess):
    _SolverGroup.multiprocess = bool(multiprocess)


def init_log(level=0, stderr=True):
    """Caffe's InitLogLevelPipe: log lines of glog's `level` (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL) and up, in glog's
    format, to standard error (where glog's `logtostderr` would send them; this build writes no log files of its
    own). Called again, it changes the level."""
    if not any(isinstance(h.formatter, training_log.GlogFormatter) for h in log_.handlers):
        training_log.attach(log_, stream=sys.stderr)
    log_.setLevel({0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR}.get(int(level), logging.CRITICAL))


def log(message):
    """Caffe's `log`: one INFO line."""
    log_.info(message)
