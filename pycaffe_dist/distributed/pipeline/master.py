"""The master of a pipeline (`train --pipeline K`): cuts the TRAIN net into K stages (net/partition.py), publishes
the job, hands each stage its parameters, then follows the stages (stage.py): it displays the loss, and when a
snapshot or a test is due the stages hand it their parameters and solver history, from which it assembles the
whole net's weights into its own Solver: Caffe's .caffemodel / .solverstate of the whole net, and the TEST nets
scored on the tester's thread (tester.py) as for a data-parallel job, while the stages train on.

Its Solver is built as one process builds it, so the stages start from the weights `dist_caffe train` starts
from (the same fillers under the same seed), and a job started from a snapshot or weights hands those on.
"""
import dataclasses
import logging
import time

import numpy as np
from google.protobuf import text_format

from ... import common
from ...errors import PycaffeDistError, StoreError
from ...net import partition as net_cuts
from ...solver import lr_policy
from ...solver.solver import Solver
from ...solver.training_log import caffe_number
from .. import job as jobs
from .. import wire
from ..coordinator import Coordinator
from ..settings import JsonSettings
from .keys import SPEC, PipelineStore, control_queue, flow_queue

log = logging.getLogger("pycaffe_dist.solver")
POLL_S = 0.2


@dataclasses.dataclass
class Settings(JsonSettings):
    """What a pipeline's master is told (as JSON by the one-machine launcher)."""
    SOURCE = "pipeline settings"
    stages: int = 2
    micro_batches: int = None


def micro_batches_for(sizes, stages, asked=None):
    """The micro-batches per batch: `asked`, which must divide every batch, or by default the least divisor of the
    batch that is at least the number of stages (so that every stage has work at once)."""
    name, batch = min(sizes.items(), key=lambda kv: kv[1])
    if asked is not None:
        if asked < 1:
            raise PycaffeDistError("--micro-batches must be at least 1, got %d" % asked)
        for top, size in sizes.items():
            if size % asked:
                raise PycaffeDistError("--micro-batches %d does not divide the batch of %d (top '%s'): give a "
                                       "divisor of it" % (asked, size, top))
        return asked
    return next(m for m in range(min(stages, batch), batch + 1) if all(s % m == 0 for s in sizes.values()))


class PipelineMaster(Coordinator):
    store_class = PipelineStore
    kind = "pipeline"
    stopping_whom = "the stages"

    def __init__(self, settings):
        common.set_num_threads(settings.threads)
        self.settings = settings
        param = self._solver_param(settings)
        if param.clip_gradients >= 0:
            raise PycaffeDistError("%s: clip_gradients needs the norm of all the stages' gradients at once: not "
                                   "supported with --pipeline yet" % settings.solver)
        self.param = param
        self.solver = Solver(param)
        if settings.snapshot:
            self.solver.restore(settings.snapshot, data_position=False)
        self.count, self.current_step = self.solver.position
        net = self.solver.train_net
        self.partition = net_cuts.partition(net, settings.stages)
        self.micro = micro_batches_for(net_cuts.batch_sizes(net), settings.stages, settings.micro_batches)
        mixing = net_cuts.sample_mixing_layers(net)
        if mixing and self.micro > 1:
            raise PycaffeDistError("layer '%s' (BatchNorm) computes its statistics over the batch: in %d "
                                   "micro-batches it would see a part of it; give --micro-batches 1 or "
                                   "use_global_stats" % (mixing[0], self.micro))
        self.stage_count = self.partition.stages
        self.history_sets = len(self.solver.history_sets())
        self.names, self.shapes = self.solver.weight_names(), self.solver.weight_shapes
        micro_shapes = lambda shapes: [[s[0] // self.micro] + list(s[1:]) for s in shapes]
        self.spec = dict(
            jobs.make_spec(param, "pipeline", {"stages": self.stage_count, "micro_batches": self.micro}, self.names,
                           self.shapes, settings.heartbeat_s, self.stage_count),
            kind=SPEC.name, net=text_format.MessageToString(net_cuts.stage_net_param(net, self.micro)),
            feed=text_format.MessageToString(net_cuts.feed_net_param(net)),
            state=text_format.MessageToString(net.state),
            stages=[{"range": list(r), "params": p} for r, p in zip(self.partition.ranges, self.partition.params)],
            cuts=[{"blobs": c.blobs, "shapes": micro_shapes(c.shapes), "needs_diff": c.needs_diff}
                  for c in self.partition.cuts],
            micro_batches=self.micro, start=self.count, current_step=self.current_step, max_iter=param.max_iter)
        self._open_job(settings, param)
        self.ready, self.reports, self.states, self.finals = {}, {}, {}, {}
        self.stage_stats = {s: {"compute_s": 0.0, "wait_s": 0.0, "iterations": 0} for s in range(self.stage_count)}
        self.halt_sent = False
        self.done_count = self.count
        self.images_per_iteration = self.solver.images_per_iteration

    # --- the stages' state ---------------------------------------------------------------------------------------

    def _state_arrays(self, stage):
        """The master's arrays of stage `stage`'s state: its parameters, then each history set of them."""
        owned = self.partition.params[stage]
        weights = self.solver.weights
        arrays = [weights[i] for i in owned]
        for history in self.solver.history_sets():
            arrays += [history[i] for i in owned]
        return arrays

    # --- the loop ------------------------------------------------------------------------------------------------

    def _begin(self):
        for s in range(self.stage_count):
            self.store.put_state(s, self._state_arrays(s), self.count)
        self.store.publish_job(self.spec)
        self.store.master_heartbeat(self.settings.heartbeat_s)
        log.info("Pipeline of %d stages, %d micro-batches per batch of %d images: %s", self.stage_count, self.micro,
                 self.images_per_iteration // max(1, self.param.iter_size),
                 "; ".join("stage %d %s..%s" % (s, self.solver.train_net.layer_names[a],
                                                self.solver.train_net.layer_names[b])
                           for s, (a, b) in enumerate(self.partition.ranges)))

    def _serve(self):
        last_check = time.monotonic()
        while True:
            if self.stop_requested and not self.halt_sent:
                self.store.to_stage(0, {"status": "halt"})
                self.halt_sent = True
            message = self.store.next_message(POLL_S, wire.PIPELINE_INBOX)
            if message is not None and self._handle(message):
                break
            if time.monotonic() - last_check > 0.25:
                self._housekeeping()
                last_check = time.monotonic()
        self._finish()

    def _handle(self, message):
        """Handle one message (checked by the store: wire.PIPELINE_INBOX); True when the stages are all done."""
        kind, stage = message["type"], message["stage"]
        if stage >= self.stage_count:
            self.store.refuse("%s: a %s message from stage %d of a pipeline of %d" % (self.store.key("inbox"), kind,
                                                                                     stage, self.stage_count))
            return False
        if kind == "error":
            raise PycaffeDistError("stage %d: %s" % (stage, message.get("error")))
        if kind == "ready":
            if stage not in self.ready:
                log.info("Stage %d ready on %s%s (pid %s)", stage, message.get("host", "?"),
                         " at " + message["address"] if message.get("address") else "", message.get("pid", "?"))
            self.ready[stage] = message
            if len(self.ready) == self.stage_count:
                self.started = True
                self.started_at = self.display_at = time.monotonic()
                log.info("Starting: %d stages ready", self.stage_count)
                if self.param.test_interval and self.param.test_initialization and self.count == 0:
                    self._test(self.count)
        elif kind == "iteration":
            self._reported(stage, message)
        elif kind == "state":
            count = message["count"]
            if not message.get("again"):
                self.store.get_state(stage, [a.shape for a in self._state_arrays(stage)],
                                      out=self._state_arrays(stage))
                self.store.to_stage(stage, {"status": "ack"})
                self.states.setdefault(count, set()).add(stage)
                if len(self.states[count]) == self.stage_count:
                    self._assembled(count)
            if message.get("final"):
                self.finals[stage] = count
                if len(self.finals) == self.stage_count:
                    if len(set(self.finals.values())) != 1:
                        raise PycaffeDistError("the stages stopped at different iterations: %s" % self.finals)
                    self.done_count = count
                    return True
        return False

    def _reported(self, stage, message):
        it = message["iter"]
        stats = self.stage_stats[stage]
        stats["compute_s"] += message.get("compute_s", 0.0)
        stats["wait_s"] += message.get("wait_s", 0.0)
        stats["iterations"] += 1
        reports = self.reports.setdefault(it, {})
        reports[stage] = message
        if len(reports) < self.stage_count:
            return
        del self.reports[it]
        loss = float(np.float32(sum(np.float32(m.get("loss", 0.0)) for m in reports.values())))
        self._add_loss(loss)
        self.count = it + 1
        p = self.param
        if p.display and it % p.display == 0:
            now = time.monotonic()
            self._display(it, p.display if it else 0, now - self.display_at)
            log.info("Iteration %d, lr = %s", it, caffe_number(np.float32(reports[0].get("rate", 0.0))))
            log.info("Stages: %s", self.stages_text())
            self.display_at = now

    def _assembled(self, count):
        """Every stage's state at `count` is in the Solver: snapshot and test as due."""
        del self.states[count]
        p = self.param
        if p.snapshot and count % p.snapshot == 0:
            self._snapshot(count)
        if p.test_interval and count % p.test_interval == 0 and count < p.max_iter:
            self._test(count)

    def _housekeeping(self):
        self.store.master_heartbeat(self.settings.heartbeat_s)
        self.store.put_progress(self.progress())
        names = [flow_queue(s) for s in range(self.stage_count)]
        if not self.started:
            if time.monotonic() - self.started_at > self.settings.join_timeout_s:
                raise StoreError("job %s: only %d of %d stages ready after %.0f s" % (
                    self.job, len(self.ready), self.stage_count, self.settings.join_timeout_s))
            names = [flow_queue(s) for s in self.ready]
        for name, alive in zip(names, self.store.workers_alive(names)):
            if not alive and int(name[len("stage"):]) not in self.finals:
                raise PycaffeDistError("%s has no heartbeat for %g s: a pipeline cannot go on without one of its "
                                       "stages" % (name.replace("stage", "stage "), self.settings.heartbeat_s))

    def _test(self, count):
        self._test_weights(self.solver.weights, count)

    def _snapshot(self, count):
        self.solver.set_position(count, self.current_step_at(count))
        model, _ = self.solver.snapshot_at(count)
        self._snapshotted(model)

    def current_step_at(self, count):
        return lr_policy.steps_taken(self.param, count)

    def _finish(self):
        p, count = self.param, self.done_count
        stopped_early = count < p.max_iter
        if p.snapshot_after_train and (not p.snapshot or count % p.snapshot != 0):
            self._snapshot(count)
        if not stopped_early:
            self._test(count)
        if self.tester is not None:
            self.tester.wait()
        log.info("Optimization %s after %d iterations.", "stopped" if stopped_early else "Done", count)
        log.info("Stages: %s", self.stages_text())
        self._end(failed=False)

    def _end(self, failed, why=None):
        """Tell the stages to stop (with `why`, a failure), wait a little for them to go, write the stats, remove
        the job's keys."""
        try:
            jobs.end_job(self.store, [control_queue(s) for s in range(self.stage_count)],
                         [flow_queue(s) for s in range(self.stage_count)], 2.0 if failed else 10.0,
                         self.settings.stats_path, self.summary, self.settings.keep, why)
        except StoreError:
            if not failed:
                raise

    # --- reporting -----------------------------------------------------------------------------------------------

    def stages_text(self):
        parts = []
        for s, stats in sorted(self.stage_stats.items()):
            total = stats["compute_s"] + stats["wait_s"]
            parts.append("%d %.1f ms/iter, %.0f%% exchanging" % (s, 1e3 * total / max(1, stats["iterations"]),
                                                            100 * stats["wait_s"] / total if total else 0))
        return ", ".join(parts)

    def progress(self):
        elapsed = max(1e-9, time.monotonic() - self.started_at)
        total = sum(s["compute_s"] + s["wait_s"] for s in self.stage_stats.values())
        done = self.count - self.spec["start"]
        return self.progress_of(
            self.count, {str(s): done * self.images_per_iteration / elapsed for s in range(self.stage_count)},
            exchange_share=sum(s["wait_s"] for s in self.stage_stats.values()) / total if total else 0.0)

    def summary(self):
        return dict(self.progress(), stages=self.stage_count, micro_batches=self.micro, tests=self.test_results,
                    ranges=self.partition.ranges, stage_stats=self.stage_stats, refused_messages=self.store.refused,
                    # the activations forward and their gradients back across every cut, per batch
                    bytes_per_iteration=sum(c.bytes_forward() + c.bytes_backward() for c in self.partition.cuts))
