"""The Solver: Caffe's training loop (src/caffe/solver.cpp and SGDSolver's ApplyUpdate), with its log lines.

A Solver builds the train net and the test nets from a SolverParameter (net / net_param / train_net /
train_net_param, test_net / test_net_param or instances of the generic net, NetStates merged as Caffe does),
then `step(n)` runs iterations: clear the parameter diffs, test when due, iter_size forward/backward passes,
smoothed loss and display, callbacks, the update (solver.updates: one implementation of each rule), and a
snapshot when due or requested. `solve()` runs to max_iter with Caffe's final snapshot, forward and test.

Log lines are Caffe's own text (logger "pycaffe_dist.solver", INFO), so Caffe's log tools parse them.

Deliberate differences from Caffe:
- restore() also puts the data where an uninterrupted run would have it: the Data, ImageData and HDF5Data layers
  of the train net (iter * iter_size batches) and of the test nets (test_iter batches per test pass so far) are
  run forward until they are there, so that a resumed run continues exactly. Caffe restarts them at their first
  record. Random streams (dropout, shuffling) are not part of the state, in Caffe or here.
- A learned_net path in a solver state that does not exist relative to the working directory is also looked
  for beside the state file (Caffe only tries the former).
- iter_size < 1 is an error (Caffe would divide by zero).
- The Solver computes where common.mode() says (pycaffe's set_mode_gpu, or `dist_caffe train` from solver_mode,
  device_id and --gpu), as Caffe's Solver does; it does not read solver_mode itself.
"""
import logging
import math
import os
import tempfile
import time

import numpy as np
from google.protobuf import text_format

from .. import common
from ..backend import select
from ..blob.synced_memory import SyncedMemory
from ..errors import SolverError
from ..io import caffemodel, solverstate
from ..io.load import read_net, read_solver
from ..net.net import Net
from ..proto import caffe_pb2
from . import lr_policy, updates, updates_gpu
from .lr_policy import learning_rate
from .training_log import caffe_number, loss_note

log = logging.getLogger("pycaffe_dist.solver")
f32 = np.float32

# What an action function (set_action_function) may ask for, once per call: Caffe's SolverAction.
NONE, SNAPSHOT, STOP = "none", "snapshot", "stop"
DATA_SOURCE_TYPES = ("Data", "ImageData", "HDF5Data")


class SolverObserver:
    """What Solver.observers are told: the figures of Caffe's display and test lines, as numbers, when the lines are
    logged (metrics/ writes them to TensorBoard). Both do nothing here; an observer overrides what it needs."""

    def displayed(self, solver, iteration, loss, rate, iters_per_s, outputs):
        """A display: the smoothed `loss`, the update's `rate` and `iters_per_s` of its lines (both None on the
        display after the last update, which has neither), `outputs` [(index, name, value)] of the train net."""

    def tested(self, solver, test_net_id, iteration, outputs):
        """A test of test net `test_net_id` after `iteration` updates: its outputs' means [(index, name, mean)]."""


class Solver:
    """Solver(param or solver prototxt path[, solver_type]). solver_type (pycaffe's SGDSolver, AdamSolver, ...)
    overrides the file's `type`."""
    net_class = Net         # the class of the nets it builds: pycaffe's solvers build pycaffe's Net

    def __init__(self, param, solver_type=None):
        if isinstance(param, caffe_pb2.SolverParameter):
            self.source = "solver"
            copy = caffe_pb2.SolverParameter()
            copy.CopyFrom(param)
            param = copy
        else:
            self.source = os.fsdecode(param)
            param = read_solver(self.source)
        if solver_type is not None:
            param.type = solver_type
        self.param = param
        log.info("Initializing solver from parameters: \n%s", text_format.MessageToString(param).rstrip("\n"))
        updates.check_solver(param, self.source)
        self._check_snapshot_prefix()
        if param.random_seed >= 0:
            common.set_random_seed(param.random_seed)
        self.net = self._init_train_net()
        self.test_nets = self._init_test_nets()
        log.info("Solver scaffolding done.")
        self.iter = 0
        self.current_step = 0
        self._history_memory = None         # the history's device copies, in GPU mode
        self._parameter_tables = {}         # {device: updates_gpu.ParameterTable}: SGD's one-launch update
        self.history = updates.new_history(param, [b.shape for b in self.net.learnable_params])
        self.callbacks = []                 # (on_start, on_gradients) pairs, as pycaffe's add_callback
        self.iteration_hooks = []           # f(solver) after each update: progress displays, workers
        self.observers = []                 # SolverObserver: each display's and test's figures (metrics/)
        self.action_function = None
        self.requested_early_exit = False
        self.rate = None                    # the learning rate of the last update
        self.smoothed_loss = f32(0)
        self.test_scores = [[] for _ in self.test_nets]   # last test of each net: [(output name, mean)]
        self._losses = []
        self.warned_diverged = False
        self.rate_scale = 1.0              # times every update's rate in step() (step_from sets it)
        self.trust = None                  # LARS's trust coefficient, clipping a scaled rate (_trust_clipped)
        self._forwards = {"train": 0, "test": [0] * len(self.test_nets)}

    # --- nets ---------------------------------------------------------------------------------------------

    def _build_net(self, net_param, state):
        net = self.net_class.from_state(net_param, state)
        for entry in self.param.weights:
            for path in entry.split(","):
                path = path.strip()
                log.info("Finetuning from %s", path)
                caffemodel.load_weights(net, path)
        return net

    def _init_train_net(self):
        p = self.param
        fields = [f for f in ("net", "net_param", "train_net", "train_net_param") if p.HasField(f)]
        if len(fields) != 1:
            raise SolverError("%s: SolverParameter must specify %s train net using one of these fields: net, "
                              "net_param, train_net, train_net_param (it has %s)"
                              % (self.source, "a" if not fields else "exactly one", ", ".join(fields) or "none"))
        field = fields[0]
        if field == "train_net_param":
            log.info("Creating training net specified in train_net_param.")
            net_param = caffe_pb2.NetParameter()
            net_param.CopyFrom(p.train_net_param)
        elif field == "train_net":
            log.info("Creating training net from train_net file: %s", p.train_net)
            net_param = read_net(p.train_net)
        elif field == "net_param":
            log.info("Creating training net specified in net_param.")
            net_param = caffe_pb2.NetParameter()
            net_param.CopyFrom(p.net_param)
        else:
            log.info("Creating training net from net file: %s", p.net)
            net_param = read_net(p.net)
        # Solver default (TRAIN), then the net's own state, then train_state: the later wins.
        state = caffe_pb2.NetState(phase=caffe_pb2.TRAIN)
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        return self._build_net(net_param, state)

    def _init_test_nets(self):
        p = self.param
        has_net_param, has_net = p.HasField("net_param"), p.HasField("net")
        if has_net_param and has_net:
            raise SolverError("%s: both net_param and net may not be specified" % self.source)
        listed = len(p.test_net_param) + len(p.test_net)
        if (has_net_param or has_net) and len(p.test_iter) < listed or \
                not (has_net_param or has_net) and len(p.test_iter) != listed:
            raise SolverError("%s: test_iter must be specified for each test network (%d test_iter for %d test "
                              "nets)" % (self.source, len(p.test_iter), listed))
        instances = listed + (len(p.test_iter) - listed)
        if len(p.test_state) and len(p.test_state) != instances:
            raise SolverError("%s: test_state must be unspecified or specified once per test net (%d test_state "
                              "for %d test nets)" % (self.source, len(p.test_state), instances))
        if instances and p.test_interval <= 0:
            raise SolverError("%s: test_interval must be positive when there are test nets (got %d)"
                              % (self.source, p.test_interval))
        sources = []
        for net_param in p.test_net_param:
            copy = caffe_pb2.NetParameter()
            copy.CopyFrom(net_param)
            sources.append(("test_net_param", copy))
        for path in p.test_net:
            sources.append(("test_net file: " + path, read_net(path)))
        for _ in range(len(p.test_iter) - listed):
            if has_net_param:
                copy = caffe_pb2.NetParameter()
                copy.CopyFrom(p.net_param)
                sources.append(("net_param", copy))
            elif has_net:
                sources.append(("net file: " + p.net, read_net(p.net)))
        nets = []
        for i, (what, net_param) in enumerate(sources):
            state = caffe_pb2.NetState(phase=caffe_pb2.TEST)
            state.MergeFrom(net_param.state)
            if len(p.test_state):
                state.MergeFrom(p.test_state[i])
            log.info("Creating test net (#%d) specified by %s", i, what)
            nets.append(self._build_net(net_param, state))
        return nets

    # --- pycaffe's interface --------------------------------------------------------------------------------

    @property
    def max_iter(self):
        return self.param.max_iter

    @property
    def type(self):
        return self.param.type

    @property
    def lr(self):
        """The learning rate the next update will use."""
        return float(learning_rate(self.param, self.iter, self.current_step, self.source)[0])

    def add_callback(self, on_start, on_gradients):
        """Call on_start() before each iteration's forward passes and on_gradients() before its update."""
        self.callbacks.append((on_start, on_gradients))

    def set_action_function(self, function):
        """function() -> NONE, SNAPSHOT or STOP, polled after each update and before each test batch; it must
        return each request once (Caffe's SignalHandler resets its flag when read)."""
        self.action_function = function

    def share_weights(self, net):
        """Make `net` use the train net's parameters (pycaffe's share_weights)."""
        net.share_with(self.net)

    # --- the loop ---------------------------------------------------------------------------------------------

    def _requested_action(self):
        return self.action_function() if self.action_function is not None else NONE

    def _update_smoothed_loss(self, loss, start_iter):
        average = self.param.average_loss
        if len(self._losses) < average:
            self._losses.append(loss)
            size = len(self._losses)
            self.smoothed_loss = f32((self.smoothed_loss * f32(size - 1) + loss) / f32(size))
        else:
            idx = (self.iter - start_iter) % average
            self.smoothed_loss = f32(self.smoothed_loss + (loss - self._losses[idx]) / f32(average))
            self._losses[idx] = loss

    def step(self, iters):
        p = self.param
        start_iter, stop_iter = self.iter, self.iter + int(iters)
        self._losses = []
        self.smoothed_loss = f32(0)
        timer, iterations_last = time.perf_counter(), self.iter
        while self.iter < stop_iter:
            self.net.clear_param_diffs()
            if p.test_interval and self.iter % p.test_interval == 0 and (self.iter > 0 or p.test_initialization):
                self.test_all()
                if self.requested_early_exit:
                    break
            for on_start, _ in self.callbacks:
                on_start()
            display = p.display and self.iter % p.display == 0
            self.net.debug_info = bool(display and p.debug_info)   # Caffe's Step: per-layer logs when displaying
            loss = self._forward_backward()
            self._update_smoothed_loss(loss, start_iter)
            if not np.isfinite(loss) and not self.warned_diverged:
                # Caffe trains on (and its Accuracy counts every image right on NaN scores): say it once.
                log.warning("Iteration %d: loss = %s: training has diverged (the weights are NaN or Inf from here "
                            "on; lower base_lr)", self.iter, caffe_number(loss))
                self.warned_diverged = True
            if display:
                lapse = time.perf_counter() - timer
                per_s = (self.iter - iterations_last) / (lapse or 1)
                log.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter, caffe_number(per_s),
                         caffe_number(lapse), p.display, caffe_number(self.smoothed_loss))
                timer, iterations_last = time.perf_counter(), self.iter
                shown = list(output_values(self.net))
                for index, name, value, weight in shown:
                    log.info("    Train net output #%d: %s = %s%s", index, name, caffe_number(value),
                             loss_note(weight, value))
            for _, on_gradients in self.callbacks:
                on_gradients()
            self.apply_update(self.rate_scale)
            if display:                     # (after the update: its lr line belongs to the display)
                self._tell("displayed", self.iter - 1, float(self.smoothed_loss), float(self.rate), per_s,
                           [(index, name, float(value)) for index, name, value, _ in shown])
            for hook in self.iteration_hooks:
                hook(self)
            request = self._requested_action()
            if (p.snapshot and self.iter % p.snapshot == 0) or request == SNAPSHOT:
                self.snapshot()
            if request == STOP:
                self.requested_early_exit = True
                break

    def _forward_backward(self):
        """Caffe's iter_size forward-backward passes, their gradients summed in the diffs; the mean loss."""
        loss = f32(0)
        for _ in range(self.param.iter_size):
            loss += f32(self.net.forward_backward())
        self._forwards["train"] += self.param.iter_size
        return loss / f32(self.param.iter_size)

    @property
    def history(self):
        """The rule's history arrays (host copies, current also after GPU updates)."""
        if self._history_memory is not None:
            for mem in self._history_memory:
                mem.host(write=False)
        return self._history

    @history.setter
    def history(self, arrays):
        self._history, self._history_memory = arrays, None

    def _device_history(self):
        if self._history_memory is None:
            self._history_memory = [SyncedMemory(h.size, h.dtype, host=h.reshape(-1)) for h in self._history]
        return [mem.device() for mem in self._history_memory]

    def apply_update(self, rate_scale=1.0):
        """SGDSolver::ApplyUpdate: rate, clipping, normalize, regularize, the rule's step, w -= step; iter += 1.
        In GPU mode the same steps run on the device copies (solver/updates_gpu.py). `rate_scale` multiplies
        every blob's rate (the distributed modes' staleness-aware rate; 1 in Caffe's loop)."""
        p = self.param
        params = self.net.learnable_params
        rates = self.net.params_lr if rate_scale == 1 else [m * rate_scale for m in self.net.params_lr]
        if self.trust is not None and rate_scale > 1:
            rates = self._trust_clipped(rates)
        before = self.current_step
        gpu = select.active()
        if gpu:
            result = updates_gpu.compute_steps(p, params, rates, self.net.params_weight_decay,
                                               self._device_history(), self.iter, self.current_step, self.source,
                                               self._parameter_tables)
        else:
            result = updates.compute_steps(p, [b.data for b in params], [b.diff for b in params],
                                           rates, self.net.params_weight_decay, self.history,
                                           self.iter, self.current_step, self.source, apply=True)
        self.rate, self.current_step = result["rate"], result["current_step"]
        if p.lr_policy == "multistep" and self.current_step != before:
            log.info("MultiStep Status: Iteration %d, step = %d", self.iter, self.current_step)
        if p.display and self.iter % p.display == 0:
            log.info("Iteration %d, lr = %s", self.iter, caffe_number(self.rate))
        if result["clip_scale"] is not None:
            log.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by scale factor %s",
                     caffe_number(result["clip_norm"]), caffe_number(f32(p.clip_gradients)),
                     caffe_number(result["clip_scale"]))
        if gpu:
            updates_gpu.apply_steps(params, self._parameter_tables)
        self.iter += 1

    def _trust_clipped(self, scaled):
        """The lr multipliers `scaled` (the solver's times a distributed job's rate scale), each clipped where it
        would make its blob's step larger than LARS's trust ratio allows: rate x multiplier <= trust |w| / (|g| +
        weight_decay x decay_mult |w|) (You, Gitman and Ginsburg 2017, as a clip: NVIDIA's LARC), but never below
        the solver's own multiplier, so only the scaling is clipped, layer by layer. A blob of weights or
        gradient 0 keeps its multiplier (a bias at its fill, a frozen blob)."""
        p = self.param
        rate, _ = lr_policy.learning_rate(p, self.iter, self.current_step, self.source)
        params = self.net.learnable_params
        if select.active():
            dev = select.current()
            norms = [(math.sqrt(max(0.0, dev.dot(b.count, b.gpu_data, b.gpu_data))),
                      math.sqrt(max(0.0, dev.dot(b.count, b.gpu_diff, b.gpu_diff)))) for b in params]
        else:
            norms = [(float(np.linalg.norm(b.data)), float(np.linalg.norm(b.diff))) for b in params]
        clipped = []
        for multiplier, own, decay, (w, g) in zip(scaled, self.net.params_lr, self.net.params_weight_decay, norms):
            g /= p.iter_size
            if w > 0 and g > 0 and rate > 0 and multiplier > own:
                bound = self.trust * w / (g + p.weight_decay * decay * w) / float(rate)
                multiplier = max(own, min(multiplier, bound))
            clipped.append(multiplier)
        return clipped

    def solve(self, resume_file=None):
        p = self.param
        log.info("Solving %s", self.net.name)
        log.info("Learning Rate Policy: %s", p.lr_policy)
        self.requested_early_exit = False
        if resume_file:
            log.info("Restoring previous solver status from %s", resume_file)
            self.restore(resume_file)
        start_iter = self.iter
        self.step(p.max_iter - self.iter)
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.requested_early_exit:
            log.info("Optimization stopped early.")
            return
        # One more forward, to display the loss of the final weights (Caffe's Solve does it; it uses a batch).
        if p.display and self.iter % p.display == 0:
            loss = f32(self.net.forward_from_to())
            self._forwards["train"] += 1
            self._update_smoothed_loss(loss, start_iter)
            log.info("Iteration %d, loss = %s", self.iter, caffe_number(self.smoothed_loss))
            self._tell("displayed", self.iter, float(self.smoothed_loss), None, None, [])
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        log.info("Optimization Done.")

    # --- testing ----------------------------------------------------------------------------------------------

    def test_all(self):
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.test(i)

    def test(self, test_net_id=0):
        p = self.param
        log.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        net = self.test_nets[test_net_id]
        net.share_with(self.net)

        def before_batch():
            """Caffe's Test polls the action function before each batch: snapshots now, or stops."""
            request = self._requested_action()
            while request != NONE:
                if request == SNAPSHOT:
                    self.snapshot()
                elif request == STOP:
                    self.requested_early_exit = True
                request = self._requested_action()
            if not self.requested_early_exit:
                self._forwards["test"][test_net_id] += 1
            return not self.requested_early_exit
        result = score(net, p.test_iter[test_net_id], before_batch)
        if result is None:
            log.info("Test interrupted.")
            return
        loss, means = result
        if p.test_compute_loss:
            log.info("Test loss: %s", caffe_number(loss))
        self.test_scores[test_net_id] = [(name, float(mean)) for _, name, mean, _ in means]
        for index, name, mean, weight in means:
            log.info("    Test net output #%d: %s = %s%s", index, name, caffe_number(mean), loss_note(weight, mean))
        self._tell("tested", test_net_id, self.iter, [(index, name, float(mean)) for index, name, mean, _ in means])

    def _tell(self, event, *figures):
        """Hand a display's or a test's figures, as its log lines say them, to each observer's `event` method."""
        for observer in self.observers:
            getattr(observer, event)(self, *figures)

    # --- snapshots ----------------------------------------------------------------------------------------------

    def _snapshot_filename(self, extension):
        return "%s_iter_%d%s" % (self.param.snapshot_prefix, self.iter, extension)

    def _check_snapshot_prefix(self):
        """Caffe's CheckSnapshotWritePermissions: with snapshots on, the prefix must be set and writable. Also (not
        in Caffe, which fails at the end of the run) for the snapshot after training alone, where a prefix is set:
        a missing folder is said before training, not after it."""
        p = self.param
        if not p.snapshot and not (p.snapshot_after_train and p.HasField("snapshot_prefix")):
            return
        if p.snapshot and not p.HasField("snapshot_prefix"):
            raise SolverError("%s: snapshot is specified but snapshot_prefix is not" % self.source)
        # Caffe's probe is prefix_iter_0.tempfile; this one has the process's own name, because two solvers with
        # one prefix starting at once (two jobs in one folder) removed each other's probe, and the second then
        # failed as if the folder were not writable.
        folder, name = os.path.split(p.snapshot_prefix)
        try:
            handle, probe = tempfile.mkstemp(prefix=name + "_iter_0.", suffix=".tempfile", dir=folder or ".")
            os.close(handle)
            os.remove(probe)
        except OSError as exc:
            raise SolverError("%s: cannot write to snapshot prefix '%s' (%s). Make sure that the directory exists "
                              "and is writable." % (self.source, p.snapshot_prefix, exc.strerror)) from None

    def snapshot(self):
        """Write the model and the solver state; returns their paths."""
        p = self.param
        hdf5 = p.snapshot_format == caffe_pb2.SolverParameter.HDF5
        kind = "HDF5" if hdf5 else "binary proto"
        model = self._snapshot_filename(".caffemodel.h5" if hdf5 else ".caffemodel")
        log.info("Snapshotting to %s file %s", kind, model)
        state = self._snapshot_filename(".solverstate.h5" if hdf5 else ".solverstate")
        try:
            caffemodel.write_model(self.net, model, hdf5, p.snapshot_diff)
            log.info("Snapshotting solver state to %s file %s", kind, state)
            solverstate.write_state(state, self.iter, model, self.current_step, self.history, hdf5)
        except OSError as exc:              # a folder removed, a full disk: one line, not a traceback
            raise SolverError("cannot write the snapshot %s: %s" % (exc.filename or model, exc.strerror or exc)) \
                from None
        return model, state

    def restore(self, path, data_position=True):
        """Continue from a .solverstate (or .solverstate.h5): iteration, weights, current step, history, and (with
        data_position) the data position of an uninterrupted run (see the module's notes)."""
        path = os.fsdecode(path)
        state = solverstate.read_state(path)
        self.iter = state["iter"]
        learned = state["learned_net"]
        if learned:
            if not os.path.exists(learned) and not os.path.isabs(learned):
                beside = os.path.join(os.path.dirname(path), learned)
                learned = beside if os.path.exists(beside) else learned
            caffemodel.load_weights(self.net, learned)
        self.current_step = state["current_step"]
        shapes = [b.shape for b in self.net.learnable_params] * updates.HISTORY_SETS[self.param.type]
        self.history = solverstate.check_history(path, state["history"], shapes)
        log.info("SGDSolver: restoring history")
        if data_position:
            self._restore_data_position()

    def _restore_data_position(self):
        p = self.param
        self._advance_data(self.net, "train net", self.iter * p.iter_size - self._forwards["train"])
        self._forwards["train"] = max(self._forwards["train"], self.iter * p.iter_size)
        if not p.test_interval:
            return
        passes = len([t for t in range(0, self.iter, p.test_interval) if t > 0 or p.test_initialization])
        for i, net in enumerate(self.test_nets):
            target = passes * p.test_iter[i]
            self._advance_data(net, "test net #%d" % i, target - self._forwards["test"][i])
            self._forwards["test"][i] = max(self._forwards["test"][i], target)

    # --- what the distributed modes use -------------------------------------------------------------------------
    # The master and the workers of pycaffe_dist/distributed/ drive a Solver through these and nothing else. Their
    # iterations are the job's (merges): each call says at which one it runs, for the rate, the step of multistep,
    # the log lines and the snapshot names.

    @property
    def train_net(self):
        """The train net as built, to look at its graph and shapes (a pipeline cuts it into stages:
        net/partition.py); it is not to be run or changed from outside."""
        return self.net

    @property
    def weights(self):
        """The learnable parameters' data, one host array per learnable blob (a shared blob once), in the net's
        order; read and written in place."""
        return [blob.data for blob in self.net.learnable_params]

    def weight_names(self):
        """'layer/index' of every learnable blob, in the order of `weights`."""
        net = self.net
        return ["%s/%d" % (net.layer_names[layer_id], index)
                for (layer_id, index), owner in zip(net.param_layer_index, net.param_owner) if owner < 0]

    @property
    def images_per_iteration(self):
        """Images one iteration consumes: the first top's batch size times iter_size."""
        net = self.net
        first = next((i for ids in net.top_ids for i in ids), None)
        shape = net.blob_list[first].shape if first is not None else ()
        return (shape[0] if shape else 1) * self.param.iter_size

    def step_from(self, iteration, iters, rate_scale=1.0):
        """Run `iters` iterations from the weights as they are, as the iterations that follow `iteration` updates,
        at the lr policy's rate times `rate_scale` (a distributed worker's scaled rate:
        distributed/lr_scaling.py); returns the smoothed loss."""
        self.iter = iteration
        self.current_step = lr_policy.steps_taken(self.param, iteration)
        self.rate_scale = rate_scale
        try:
            self.step(iters)
        finally:
            self.rate_scale = 1.0
        return float(self.smoothed_loss)

    @property
    def weight_shapes(self):
        return [tuple(blob.shape) for blob in self.net.learnable_params]

    def set_weights(self, arrays):
        """Make the weights these host arrays. On the GPU each goes straight into the blob's device copy (from a
        pinned array: one DMA, no host copy in between); the host copies go stale until someone reads them."""
        if select.active():
            dev = select.current()
            for blob, x in zip(self.net.learnable_params, arrays):
                dev.upload(blob.mutable_gpu_data, x)
        else:
            for blob, x in zip(self.net.learnable_params, arrays):
                blob.data[...] = x

    def read_weights(self, out):
        """The weights into the host arrays `out` (pinned ones on the GPU: one DMA each, no copy through the
        blob's host memory); returns out."""
        self._read(lambda blob: blob.gpu_data, lambda blob: blob.cpu_data, out)
        return out

    def compute_gradients(self, out=None):
        """The gradients of one iteration at the weights as they are (iter_size passes summed, no update): the
        learnable parameters' diffs in `out` (host arrays; new ones when None), and the mean loss."""
        self.net.clear_param_diffs()
        loss = self._forward_backward()
        if out is None:
            out = [np.empty(shape, np.float32) for shape in self.weight_shapes]
        self._read(lambda blob: blob.gpu_diff, lambda blob: blob.cpu_diff, out)
        return out, float(loss)

    def _read(self, device_copy, host_copy, out):
        if select.active():
            select.current().download_all([(device_copy(blob), o) for blob, o in zip(self.net.learnable_params,
                                                                                        out)])
        else:
            for blob, o in zip(self.net.learnable_params, out):
                np.copyto(o, host_copy(blob))

    def apply_gradients(self, gradients, iteration, rate_scale=1.0):
        """Update the weights with these gradients as the update that follows `iteration` updates: Caffe's
        ApplyUpdate (the rate at that iteration times `rate_scale`, clipping, regularization, the rule's
        history)."""
        for blob, gradient in zip(self.net.learnable_params, gradients):
            blob.diff[...] = gradient
        self.iter = iteration
        self.apply_update(rate_scale)

    def test_at(self, iteration):
        """Test every test net as after `iteration` updates; returns each net's [(output name, mean)]."""
        self.iter = iteration
        self.test_all()
        return [list(scores) for scores in self.test_scores]

    def snapshot_at(self, iteration):
        """Snapshot as after `iteration` updates; returns the model's and the state's paths."""
        self.iter = iteration
        return self.snapshot()

    def clear_history(self):
        """Zero the rule's history (momentum, Adam's moments), on the device too: a fresh start from the weights."""
        if self._history_memory is not None:
            for mem in self._history_memory:
                mem.host(write=True)
        for h in self._history:
            h[...] = 0

    def history_sets(self):
        """The rule's history as one list of arrays per history set (momentum; Adam's two), each in the order of
        `weights`; the arrays themselves, read and written in place."""
        n = len(self.net.learnable_params)
        return [self.history[k:k + n] for k in range(0, len(self.history), n)]

    def set_position(self, iteration, current_step):
        """Where a restored job is: `iteration` updates done, multistep at `current_step`."""
        self.iter, self.current_step = int(iteration), int(current_step)

    @property
    def position(self):
        """(iterations done, multistep's current step): what a job's state keeps."""
        return self.iter, self.current_step

    @staticmethod
    def _advance_data(net, which, batches):
        if batches <= 0:
            return
        for layer_id, layer in enumerate(net.layers):
            if layer.type in DATA_SOURCE_TYPES:
                log.info("Resuming: layer %s of the %s moves on %d batches, to where the interrupted run was",
                         layer.name, which, batches)
                for _ in range(batches):
                    net.forward_from_to(layer_id, layer_id)


def score(net, iterations, before_batch=None, after_batch=None):
    """Caffe's scoring of a net (Solver::Test, and `caffe test`): `iterations` forward passes, each output summed
    over them in float32 and divided by the count. before_batch() returning False stops it (then None is
    returned); after_batch(i, outputs) sees each batch's outputs. Returns (mean loss, [(index, name, mean, loss
    weight)] in output_values' order)."""
    loss, sums, outputs = f32(0), None, []
    for i in range(iterations):
        if before_batch is not None and not before_batch():
            return None
        loss += f32(net.forward_from_to())
        outputs = list(output_values(net))
        if after_batch is not None:
            after_batch(i, outputs)
        values = np.array([value for _, _, value, _ in outputs], dtype=np.float32)
        sums = values if sums is None else sums + values
    count = f32(iterations)
    means = [(index, name, f32(total / count), weight)
             for (index, name, _, weight), total in zip(outputs, sums if sums is not None else [])]
    return loss / count, means


def output_values(net):
    """(index, blob name, value, loss weight) for every element of every output blob of `net`, in Caffe's order
    (the numbering of 'Train net output #i' and 'Test net output #i')."""
    weights = {}
    for layer, ids in zip(net.layers, net.top_ids):
        for w, i in zip(layer.loss_weights, ids):
            if w:
                weights[i] = f32(w)
    index = 0
    for i in net.output_ids:
        for value in net.blob_list[i].data.reshape(-1):
            yield index, net.blob_names[i], f32(value), weights.get(i, f32(0))
            index += 1
