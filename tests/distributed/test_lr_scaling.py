"""The learning rate of N workers (distributed/lr_scaling.py):
the linear scaling rule's arithmetic, its warmup,
the backoff that keeps a scaled rate from ending a job in NaN, and, on real processes, that `--lr-scaling none`
merges exactly what the solver's own rate merges (today's merges: checked against the same rounds computed here,
in this process) while the default scales them."""
import math
import re
import signal
import time

import numpy as np
import pytest
from google.protobuf import text_format
from scipy.linalg.blas import saxpy

from pycaffe_dist import common
from pycaffe_dist.distributed import job as jobs
from pycaffe_dist.distributed import lr_scaling
from pycaffe_dist.distributed.data_parallel.modes import MODES, resolve_options
from pycaffe_dist.errors import DivergedError, PycaffeDistError
from pycaffe_dist.io.caffemodel import load_weights
from pycaffe_dist.io.load import read_solver
from pycaffe_dist.solver.solver import Solver

from .conftest import wait_for_merges


def test_the_target_is_the_work_a_merge_takes_by_the_policy():
    assert lr_scaling.target("linear", 8) == 8
    assert lr_scaling.target("sqrt", 16) == 4
    assert lr_scaling.target("none", 8) == 1
    assert lr_scaling.target("linear", 0.5) == 1          # never below the solver's own rate


def test_the_scale_climbs_one_solver_rate_per_warmup_step():
    assert lr_scaling.scale("linear", 8, 0, 10) == 1.0
    assert lr_scaling.scale("linear", 8, 35, 10) == 4.5
    assert lr_scaling.scale("linear", 8, 70, 10) == 8.0
    assert lr_scaling.scale("linear", 16, 70, 10) == 8.0        # a larger target takes longer to reach
    assert lr_scaling.scale("linear", 8, 1000, 10) == 8.0
    assert lr_scaling.scale("linear", 8, 0, 0) == 8.0           # no warmup
    assert lr_scaling.scale("none", 8, 1000, 10) == 1.0
    assert lr_scaling.warmup_step({"lr_warmup": 0.02}, 2000) == 40


def test_every_data_parallel_mode_takes_the_switch_with_linear_by_default():
    for mode in MODES:
        options = resolve_options(mode, {})
        assert options["lr_scaling"] == "linear" and options["lr_warmup"] == lr_scaling.WARMUP_SHARE, mode
    with pytest.raises(PycaffeDistError, match="--lr-scaling must be one of linear, sqrt, none, got 'cubic'"):
        resolve_options("sync", {"lr_scaling": "cubic"})
    with pytest.raises(PycaffeDistError, match="--lr-warmup must be a share"):
        resolve_options("async", {"lr_warmup": 2.0})


class _View:
    """The part of the master a rule's merged_work reads: the typical staleness of the results so far, and the
    solver's momentum."""

    def __init__(self, staleness=None, momentum=0.9):
        self.staleness, self._momentum = staleness, momentum

    def typical_staleness(self):
        return self.staleness

    def momentum(self):
        return self._momentum


@pytest.mark.parametrize("mode,workers,work", [("sync", 8, 8), ("gossip", 4, 4), ("easgd", 16, 16),
                                               ("local-sgd", 8, 6), ("async", 8, 8), ("gradient-only", 2, 2)])
def test_the_work_of_a_merge_per_mode(mode, workers, work):
    rule = MODES[mode].MergeRule(_View(), resolve_options(mode, {}))
    assert rule.merged_work(workers) == work


@pytest.mark.parametrize("mode", ["async", "partial-sync", "weed-out"])
def test_a_staleness_aware_merge_is_worth_the_typical_staleness(mode):
    """A result merged at 1/staleness counts as one step where its staleness is the typical one; --factor F merges
    every result at 1/F, so F is what a result is worth."""
    assert MODES[mode].MergeRule(_View(13.5), resolve_options(mode, {})).merged_work(8) == 13.5
    assert MODES[mode].MergeRule(_View(13.5), resolve_options(mode, {"factor": 4.0})).merged_work(8) == 4.0
    assert MODES[mode].MergeRule(_View(13.5), resolve_options(mode, {"factor": 1.0})).merged_work(8) == 1.0


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_the_delay_bound_without_delay_is_the_heavy_balls_and_one_update_late_is_one(momentum):
    """No delay: a / (1 - M) < 2 (1 + M) / (1 - M) (Polyak's heavy ball on a quadratic); one update late the constant
    term M + a of z^2 - (1 + M) z + M + a must stay below 1, so a / (1 - M) < 1 whatever M."""
    assert lr_scaling.delayed_step_bound(momentum, 0) == pytest.approx(2 * (1 + momentum) / (1 - momentum))
    assert lr_scaling.delayed_step_bound(momentum, 1) == pytest.approx(1.0)


def test_the_delay_bound_falls_as_one_over_the_delay_whatever_the_momentum():
    """What gradient-only's docstring cites: past D = 1 the largest stable steady step is about 1.5 / D, and no
    momentum lifts it (a lower one helps a little: 0.209 at D = 7 with none, 0.158 with 0.9)."""
    for momentum in (0.0, 0.5, 0.9):
        bounds = [lr_scaling.delayed_step_bound(momentum, d) for d in range(1, 33)]
        assert all(later < earlier for earlier, later in zip(bounds, bounds[1:])), bounds
        for delay in (7, 15, 31):
            assert 1.0 < delay * bounds[delay - 1] < 1.6, (momentum, delay, bounds[delay - 1])
    assert lr_scaling.delayed_step_bound(0.0, 7) == pytest.approx(0.209, abs=1e-3)
    assert lr_scaling.delayed_step_bound(0.9, 7) == pytest.approx(0.158, abs=1e-3)


@pytest.mark.parametrize("momentum,delay", [(0.9, 0), (0.9, 7), (0.0, 7), (0.9, 31), (0.5, 3)])
def test_the_delay_bound_is_where_the_delayed_heavy_ball_stops_converging(momentum, delay):
    """The bound from the roots, checked by running the iteration itself on lambda = 1: 5 % under the bound x
    shrinks, 5 % over it grows."""
    def run(steady):
        a = steady * (1.0 - momentum)
        xs = [1.0] * (delay + 2)                  # x_(t - delay - 1) .. x_t
        for _ in range(40000):
            xs.append(xs[-1] + momentum * (xs[-1] - xs[-2]) - a * xs[-1 - delay])
            xs.pop(0)
            if abs(xs[-1]) > 1e6:                 # grown (and left before it overflows)
                break
        return max(abs(x) for x in xs)
    bound = lr_scaling.delayed_step_bound(momentum, delay)
    assert run(0.95 * bound) < 1e-2
    assert run(1.05 * bound) > 1e2


def test_gradient_only_counts_a_gradient_for_what_its_delay_allows():
    """A gradient of the typical staleness s is applied at the rate x k / s: k = s x the delayed heavy ball's
    bound (s - 1 updates late), at most s, at least 1 (the solver's own rate, as --lr-scaling none)."""
    options = resolve_options("gradient-only", {})
    work = {s: MODES["gradient-only"].MergeRule(_View(s), options).merged_work(s) for s in (1, 2, 8, 16, 32)}
    assert work[1] == 1 and work[2] == pytest.approx(2.0)
    for s in (8, 16, 32):
        assert work[s] == pytest.approx(s * lr_scaling.delayed_step_bound(0.9, s - 1))
        assert 1.2 < work[s] < 1.4, work
    # an adaptive rule builds no momentum: the bound at M = 0, higher
    assert 1.5 < MODES["gradient-only"].MergeRule(_View(8, momentum=0.0), options).merged_work(8) < 1.7
    # a --factor F merges every gradient at 1/F: F times the bound at the typical staleness, at least 1
    rule = MODES["gradient-only"].MergeRule(_View(8), resolve_options("gradient-only", {"factor": 16.0}))
    assert rule.merged_work(8) == pytest.approx(16 * lr_scaling.delayed_step_bound(0.9, 7))
    rule = MODES["gradient-only"].MergeRule(_View(8), resolve_options("gradient-only", {"factor": 4.0}))
    assert rule.merged_work(8) == 1.0
    # no results yet: the live workers stand for the staleness
    assert MODES["gradient-only"].MergeRule(_View(None), options).merged_work(8) == pytest.approx(work[8])


def test_local_sgd_counts_its_outer_step():
    """DiLoCo's outer step multiplies a steady mean delta by a / (1 - m): the rate is scaled by the rest of N."""
    rule = MODES["local-sgd"].MergeRule(_View(), resolve_options("local-sgd", {"outer_lr": 1.0, "outer_momentum": 0.0}))
    assert rule.merged_work(8) == 8
    options = resolve_options("local-sgd", {"outer_lr": 0.5, "outer_momentum": 0.75})
    rule = MODES["local-sgd"].MergeRule(_View(), options)
    assert rule.merged_work(8) == 4


@pytest.mark.parametrize("scaling,momentum", [("linear", 0.25), ("sqrt", 0.25), ("none", 0.5)])
def test_local_sgd_outer_momentum_defaults_to_a_quarter_at_a_scaled_rate(scaling, momentum):
    """m = 0.25 where the rate is scaled (the workers carry 0.75 N of it), 0.5 at the solver's rate, as before."""
    rule = MODES["local-sgd"].MergeRule(_View(), resolve_options("local-sgd", {"lr_scaling": scaling}))
    assert rule.momentum == momentum and rule.merged_work(8) == 8 * (1 - momentum)


def test_backoff_keeps_finite_copies_and_goes_back_to_the_older():
    backoff = lr_scaling.Backoff(max_iter=100)            # a copy every 5 merges
    w = [np.ones((2, 3), np.float32)]
    backoff.keep(w, 0)
    for count in range(1, 16):
        w[0] += 1
        if backoff.due(count):
            backoff.keep(w, count)
    assert [c for c, _ in backoff.copies] == [10, 15]
    w[0][0, 0] = np.nan
    backoff.keep(w, 20)                                    # not finite: not kept
    assert [c for c, _ in backoff.copies] == [10, 15]
    assert backoff.back_off(1.0) is None                   # the solver's own rate: nothing to back off
    merges, arrays = backoff.back_off(8.0)
    assert merges == 10 and arrays[0][0, 0] == 11 and backoff.ceiling == 4.0 and backoff.count == 1
    backoff.back_off(1.5)
    assert backoff.ceiling == 1.0


def test_after_a_backoff_a_rise_is_judged_on_a_whole_window():
    """The first results from the W a backoff went back to: one high loss alone is no rise (one alone backed a job
    off again at the same merge), a window of them is."""
    backoff = lr_scaling.Backoff(max_iter=100)
    backoff.keep([np.ones(3, np.float32)], 0)
    for _ in range(backoff.WINDOW):
        backoff.check_loss(2.3, 8.0)
    backoff.back_off(8.0)
    for _ in range(backoff.WINDOW - 1):
        backoff.check_loss(6.0, 4.0)
    with pytest.raises(DivergedError, match=r"loss rose to 6 over the last 10 merges"):
        backoff.check_loss(6.0, 4.0)


def test_backoff_sees_the_loss_rise_only_at_a_scaled_rate():
    backoff = lr_scaling.Backoff(max_iter=100)
    for _ in range(backoff.WINDOW):
        backoff.check_loss(2.3, 1.0)                       # the first window: 2.3
    for _ in range(backoff.WINDOW):
        backoff.check_loss(9.0, 1.0)                       # the solver's rate: as before, trains on
    backoff = lr_scaling.Backoff(max_iter=100)
    for _ in range(backoff.WINDOW):
        backoff.check_loss(2.3, 8.0)
    backoff.check_loss(12.0, 8.0)                          # one batch's loss: the window's mean is 3.27
    with pytest.raises(DivergedError, match=r"loss rose to 5\.21 over the last 10 merges \(2\.3 over the first\)"):
        for _ in range(3):
            backoff.check_loss(12.0, 8.0)
    with pytest.raises(DivergedError, match="the workers' loss is nan"):
        backoff.check_loss(float("nan"), 2.0)
    backoff.check_loss(float("nan"), 1.0)                  # the solver's rate: the NaN guard's business


# --- real processes ------------------------------------------------------------------------------------------

WORKERS, ROUNDS = 3, 12


def _sync_rounds_here(solver_path, workers, rounds):
    """Sync without overlap, tau 1, computed in this process as the master and its workers compute it: each worker
    (its shard, its seed) takes one solver step from W at the merge count; W += (the deltas summed in slot order)
    / N by saxpy. The master's initial W is its solver's fill."""
    param = jobs.inline_nets(read_solver(str(solver_path)))
    weights = [b.data.copy() for b in Solver(param).net.learnable_params]
    text = text_format.MessageToString(param)
    solvers = []
    for slot in range(workers):
        common.set_data_shard(slot, workers)
        solvers.append(Solver(jobs.worker_solver(text, slot)))
    common.set_data_shard(0, 1)
    for count in range(rounds):
        total = None
        for solver in solvers:
            solver.set_weights(weights)
            solver.step_from(count, 1)
            delta = [b.data - w for b, w in zip(solver.net.learnable_params, weights)]
            if total is None:
                total = [np.array(d, dtype=np.float32) for d in delta]
            else:
                for t, d in zip(total, delta):
                    t += d
        for w, t in zip(weights, total):
            saxpy(t.reshape(-1), w.reshape(-1), a=1.0 / workers)
    return weights


def _snapshot_weights(solver_path, iteration):
    solver = Solver(str(solver_path))
    load_weights(solver.net, "%s_iter_%d.caffemodel" % (solver.param.snapshot_prefix, iteration))
    return [b.data.copy() for b in solver.net.learnable_params]


@pytest.mark.redis
@pytest.mark.slow
def test_lr_scaling_none_merges_what_the_solver_rate_merges_bit_for_bit(procs, make_solver, tmp_path):
    expected = None
    finals = {}
    for policy in ("none", "linear"):
        solver_path = make_solver(max_iter=ROUNDS, snapshot_prefix=str(tmp_path / policy))
        if expected is None:
            expected = _sync_rounds_here(solver_path, WORKERS, ROUNDS)
        job = "scaling-" + policy
        procs.master(job, solver_path, "sync", WORKERS, "--no-overlap", "--lr-scaling", policy, name=job)
        for index in range(WORKERS):
            procs.start("%s-worker%d" % (job, index), "worker", "--redis", procs.url, "--job", job, "--id", index)
        procs.check(job)
        finals[policy] = _snapshot_weights(solver_path, ROUNDS)
        assert ("Learning rate: the solver's (--lr-scaling none)" in procs.log(job)) == (policy == "none")
    for e, g in zip(expected, finals["none"]):
        assert np.array_equal(e, g)
    # The default scales the rate (3 x after the warmup): the same rounds move W elsewhere.
    assert not all(np.array_equal(e, g) for e, g in zip(expected, finals["linear"]))
    assert "Learning rate: the solver's x 3 (linear scaling" in procs.log("scaling-linear")


REGRESSION = """
name: "regression"
layer { name: "data" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.00390625 }
        data_param { source: "%(train)s" backend: DATUMFILE batch_size: 32 } }
layer { name: "fit" type: "InnerProduct" bottom: "data" top: "fit"
        inner_product_param { num_output: 1 weight_filler { type: "constant" value: 0 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "fit" bottom: "label" top: "loss" }
"""


@pytest.mark.redis
@pytest.mark.slow
def test_a_rate_past_the_nets_ceiling_backs_off_instead_of_ending_in_nan(procs, tiny_data, tmp_path):
    """A least-squares fit of the class number: gradient descent on a quadratic, which diverges exactly where
    rate x its largest curvature passes 2. That curvature is 2.74 here (the largest eigenvalue of E[x x'] over the
    training images, the bias's 1 included), so the solver's rate 0.2 is stable up to 3.6 x and 4 workers' linear
    scale (4 x, reached by merge 18; without overlap, whose one-round delay would lower the bound) is not: the
    loss grows without bound, the job backs off, says so, and ends with a small finite loss at 2 x at most."""
    net = tmp_path / "regression.prototxt"
    net.write_text(REGRESSION % {"train": tiny_data / "train.datumfile"})
    solver_path = tmp_path / "regression_solver.prototxt"
    solver_path.write_text('net: "%s" base_lr: 0.2 lr_policy: "fixed" max_iter: 300 display: 0 snapshot_prefix: '
                           '"%s" random_seed: 1 solver_mode: CPU' % (net, tmp_path / "snap"))
    procs.master("backoff", solver_path, "sync", 4, "--lr-warmup", 0.02, "--no-overlap")
    for index in range(4):
        procs.worker("backoff", index)
    procs.check("master", timeout=180)
    log = procs.log("master")
    assert re.search(r"Learning rate: training diverged at [0-9.]+ x the solver's rate \(merge \d+: the workers' "
                     r"loss (rose to|is)", log), log[-3000:]
    stats = procs.stats()
    assert stats["lr_backoffs"] >= 1 and stats["lr_scale"] <= 2, stats
    assert math.isfinite(stats["loss"]) and stats["loss"] < 1.0, (stats["loss"], log[-3000:])


@pytest.mark.redis
@pytest.mark.slow
def test_the_rate_follows_the_live_workers_as_they_join_and_leave(procs, make_solver, store_for):
    """Sync: 2 workers (2 x), a third joins the running job (3 x from its next replies), then one is killed and
    counted out (2 x again): the master says each change in one line, and the job ends at the rate of the two."""
    procs.master("follow", make_solver(max_iter=6000), "sync", 2, "--lr-warmup", 0)
    procs.worker("follow", 0)
    procs.worker("follow", 1)
    store = store_for("follow")
    wait_for_merges(store, 50)
    third = procs.worker("follow", 2)
    deadline = time.monotonic() + 60
    while "Worker 2 joined the running job" not in procs.log("master"):
        assert time.monotonic() < deadline and procs.procs["master"].poll() is None, procs.log("master")[-3000:]
        time.sleep(0.1)
    wait_for_merges(store, store.progress()["count"] + 100)
    third.send_signal(signal.SIGKILL)       # a round waits for it until its heartbeat lapses: the job goes on
    procs.check("master", 240)
    log = procs.log("master")
    lines = [line for line in log.splitlines() if "Learning rate: the solver's x" in line]
    assert [re.search(r"x (\d+) \(linear scaling: a merge is worth \d+ of one process's steps with (\d+) live",
                      line).groups() for line in lines] == [("2", "2"), ("3", "3"), ("2", "2")], lines
    assert procs.stats()["lr_scale"] == 2.0
