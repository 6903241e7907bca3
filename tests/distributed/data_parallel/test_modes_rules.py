"""The modes' rules on their own: which results merge, which are dropped, who waits, and where a worker's next
round starts. The master here is a recorder of what the rule asks for (the store is exercised elsewhere)."""
import numpy as np
import pytest

from pycaffe_dist.distributed.data_parallel.modes import MODES, base, easgd, gradient_only, resolve_options

from ..conftest import DrivenRule


class Recorder:
    """The tests' own master: what a rule may read of it (modes.base.RuleView), and `carry`, which carries out the
    actions the rule returns, recording each."""

    def __init__(self):
        self.weights = [np.zeros(3, np.float32)]
        self.results, self.replies, self.merges, self.drops = {}, [], [], []
        self.count = 0

    scaled = 1.0                    # the rate's scale for N workers (lr_scaling.py) the master would apply

    def slot(self, worker):
        return int(worker)

    def typical_staleness(self):
        return None

    def history(self):
        if not hasattr(self, "velocity"):
            self.velocity = [np.zeros_like(w) for w in self.weights]
        return self.velocity

    def carry(self, actions):
        for action in actions:
            if isinstance(action, base.Merge):
                for arrays, scale in action.adds:
                    for w, a in zip(self.weights, arrays):
                        w += np.float32(scale) * a
                if action.gradients is not None:
                    self.gradients, self.applied_scale = action.gradients, action.scale * self.scaled
                self.merges.append([r.worker for r in action.results])
                self.count += 1
            elif isinstance(action, base.Reply):
                self.replies.append((action.worker, action.status))
            elif isinstance(action, base.Drop):
                self.drops.append(action.result.worker)
            else:
                raise AssertionError("unexpected action %r" % (action,))


def _rule(mode, **options):
    master = Recorder()
    return master, DrivenRule(master, MODES[mode].MergeRule(master, resolve_options(mode, options)))


def _result(master, worker, arrays, base_count=None):
    message = {"worker": worker, "loss": 1.0, "base": master.count if base_count is None else base_count}
    return base.Result(worker, message, arrays, max(1, master.count - message["base"] + 1))


def _deliver(master, rule, worker, value, base=None):
    """Worker `worker`'s result, all `value`, computed from W at merge `base` (default: the latest W)."""
    master.results[worker] = [np.full(3, value, np.float32)]
    rule.on_result(_result(master, worker, master.results[worker], base))


def test_sync_averages_the_delivered_deltas_and_waits_for_everyone():
    master, rule = _rule("sync")
    rule.start(["0", "1"])
    master.replies.clear()
    _deliver(master, rule, "0", 1.0)
    assert master.replies == [] and master.merges == []
    _deliver(master, rule, "1", 3.0)
    assert master.weights[0].tolist() == [2.0] * 3
    assert master.merges == [["0", "1"]] and sorted(master.replies) == [("0", "merged"), ("1", "merged")]


def test_sync_goes_on_without_a_lost_worker_and_says_so(caplog):
    master, rule = _rule("sync")
    rule.start(["0", "1"])
    _deliver(master, rule, "0", 4.0)
    with caplog.at_level("WARNING", logger="pycaffe_dist.solver"):
        rule.on_lost("1")
    assert master.weights[0].tolist() == [4.0] * 3          # the mean of what arrived, not divided by 2
    assert "worker 1 is gone; the round goes on with 1 worker(s)" in caplog.records[-1].getMessage()


def test_sync_newcomer_waits_for_the_next_round():
    master, rule = _rule("sync")
    rule.start(["0"])
    master.replies.clear()
    rule.on_join("1")
    assert master.replies == []
    _deliver(master, rule, "0", 1.0)
    assert sorted(master.replies) == [("0", "merged"), ("1", "welcome")]
    assert rule.waiting == {"0", "1"}


def test_async_merges_each_result_divided_by_factor():
    master, rule = _rule("async", factor=2.0)
    _deliver(master, rule, "0", 1.0)
    _deliver(master, rule, "1", 1.0)
    assert master.weights[0].tolist() == [1.0] * 3 and master.replies == [("0", "merged"), ("1", "merged")]


def test_partial_sync_holds_only_the_worker_too_far_ahead():
    master, rule = _rule("partial-sync", max_advance=1)
    rule.start(["0", "1"])
    master.replies.clear()
    _deliver(master, rule, "0", 1.0)      # 0 has completed 1, 1 none: reply allows round 2, 2 - 0 > 1
    assert master.replies == [] and master.merges == [["0"]]
    _deliver(master, rule, "1", 1.0)      # the slowest moves: 0 is released, 1 may go on too
    assert sorted(master.replies) == [("0", "merged"), ("1", "merged")]
    rule.on_lost("1")
    _deliver(master, rule, "0", 1.0)      # alone, nobody holds it back
    assert master.replies[-1] == ("0", "merged")


def test_partial_sync_without_advance_does_not_overlap():
    master, rule = _rule("partial-sync", max_advance=0)
    assert rule.depth == 0


def test_weed_out_drops_a_result_whose_worker_is_not_among_the_last_n():
    # SpeeDO's example: window 3, completions 0, 1, 1, 0, 2: the fifth (worker 2) is dropped.
    master, rule = _rule("weed-out", weedout=3)
    rule.start(["0", "1", "2"])
    master.replies.clear()
    for worker in "01102":
        _deliver(master, rule, worker, 1.0)
    assert master.merges == [["0"], ["1"], ["1"], ["0"]] and master.drops == ["2"]
    assert master.replies[-1] == ("2", "dropped") and master.weights[0].tolist() == [4.0] * 3


def test_easgd_worker_pulls_itself_and_the_centre_together():
    master, rule = _rule("easgd")
    master.weights[0][...] = 1.0
    x_end, centre = [np.full(3, 5.0, np.float32)], [np.full(3, 1.0, np.float32)]
    d = easgd.RoundRule.result(None, x_end, None, centre, {"moving_rate": 0.25}, 8)
    assert d[0].tolist() == [1.0] * 3                       # d = a (x - W)
    assert easgd.RoundRule.next_start("merged", centre, x_end, d, True)[0].tolist() == [4.0] * 3
    assert easgd.RoundRule.next_start("reset", centre, x_end, d, True) is centre
    _deliver(master, rule, "0", 1.0)
    assert master.weights[0].tolist() == [2.0] * 3          # W += d


@pytest.mark.parametrize("scaling,pull", [("linear", easgd.WORKER_PULL), ("none", 0.9 / 16)])
def test_easgd_worker_pulls_itself_a_quarter_at_a_scaled_rate_and_the_centre_by_alpha(scaling, pull):
    # 16 workers: alpha = 0.9 / 16. At a scaled rate the worker closes a quarter of its distance to the centre, and
    # the centre still moves by alpha (x - W); --lr-scaling none keeps the paper's symmetric pull.
    options = resolve_options("easgd", {"lr_scaling": scaling})
    master, rule = _rule("easgd", lr_scaling=scaling)
    rule.start([str(w) for w in range(16)])
    x_end, centre = [np.full(3, 5.0, np.float32)], [np.zeros(3, np.float32)]
    d = easgd.RoundRule.result(None, x_end, None, centre, options, 16)
    np.testing.assert_allclose(d[0], 5.0 * pull, rtol=1e-6)
    np.testing.assert_allclose(easgd.RoundRule.next_start("merged", centre, x_end, d, True)[0], 5.0 * (1 - pull),
                               rtol=1e-6)
    _deliver(master, rule, "0", float(d[0][0]))
    np.testing.assert_allclose(master.weights[0], 5.0 * 0.9 / 16, rtol=1e-6)


def test_gradient_only_hands_the_gradient_to_the_solver_rule():
    master, rule = _rule("gradient-only")
    _deliver(master, rule, "0", 0.5)
    assert master.gradients[0].tolist() == [0.5] * 3 and master.replies == [("0", "merged")]
    assert gradient_only.RoundRule.next_start("merged", ["W"], ["x"], ["g"], True) == ["W"]


@pytest.mark.parametrize("status,expected", [("merged", 5.0), ("dropped", 2.0), ("reset", 2.0)])
def test_delta_worker_starts_from_w_plus_the_delta_in_flight(status, expected):
    pulled, delta = [np.full(2, 2.0, np.float32)], [np.full(2, 3.0, np.float32)]
    start = base.DeltaRoundRule.next_start(status, pulled, None, delta, True)
    assert start[0].tolist() == [expected] * 2
    assert base.DeltaRoundRule.next_start("merged", pulled, None, delta, False) is pulled   # W holds it already


@pytest.mark.parametrize("mode", ["async", "partial-sync", "weed-out"])
def test_a_result_is_merged_divided_by_its_staleness(mode):
    master, rule = _rule(mode, **({"max_advance": 5} if mode == "partial-sync" else {}))
    rule.start(["0", "1", "2", "3"])
    for worker in "0123":                      # all four started from W at merge 0
        _deliver(master, rule, worker, 12.0, base=0)
    # staleness 1, 2, 3, 4: W += 12 + 6 + 4 + 3
    assert master.weights[0].tolist() == [25.0] * 3


def test_an_explicit_factor_replaces_the_staleness():
    master, rule = _rule("async", factor=4.0)
    _deliver(master, rule, "0", 8.0, base=0)
    _deliver(master, rule, "1", 8.0, base=0)
    assert master.weights[0].tolist() == [4.0] * 3


def test_gradient_only_scales_the_rate_by_the_staleness():
    master, rule = _rule("gradient-only")
    master.count = 7
    _deliver(master, rule, "0", 0.5, base=4)
    assert master.applied_scale == 0.25
    _deliver(master, rule, "1", 0.5)
    assert master.applied_scale == 1.0


def test_gradient_only_applies_the_scaled_rate_over_the_staleness():
    """The master's update takes the linear scaling rule's scale too (its workers run no solver steps)."""
    master, rule = _rule("gradient-only")
    master.count, master.scaled = 7, 8.0
    _deliver(master, rule, "0", 0.5, base=4)
    assert master.applied_scale == 2.0


def test_weed_out_runs_without_options_and_its_window_is_the_live_workers():
    assert resolve_options("weed-out", {})["weedout"] == 1
    master, rule = _rule("weed-out")
    rule.start(["0", "1", "2"])
    for worker in "012012":                    # round robin: nobody is overtaken
        _deliver(master, rule, worker, 1.0)
    assert master.drops == []
    for worker in "0101":                      # 2 is overtaken by two rounds of the others
        _deliver(master, rule, worker, 1.0)
    _deliver(master, rule, "2", 1.0)
    assert master.drops == ["2"]


@pytest.mark.parametrize("workers, rate", [(1, 0.9), (2, 0.45), (8, 0.1125), (16, 0.05625)])
def test_easgd_moving_rate_defaults_to_0_9_over_the_live_workers(workers, rate):
    options = resolve_options("easgd", {})
    assert easgd.moving_rate(options, workers) == pytest.approx(rate)
    d = easgd.RoundRule.result(None, [np.full(2, 1.0, np.float32)], None, [np.zeros(2, np.float32)],
                               dict(options, lr_scaling="none"), workers)
    np.testing.assert_allclose(d[0], rate, rtol=1e-6)                  # the paper's symmetric pull
    d = easgd.RoundRule.result(None, [np.full(2, 1.0, np.float32)], None, [np.zeros(2, np.float32)],
                            dict(options, moving_rate=0.3), workers)
    np.testing.assert_allclose(d[0], 0.3, rtol=1e-6)


def test_sync_with_a_backup_closes_without_the_straggler_and_drops_its_late_result():
    master, rule = _rule("sync", backup=1)
    rule.start(["0", "1", "2"])
    master.replies.clear()
    _deliver(master, rule, "0", 1.0)
    assert master.merges == []
    _deliver(master, rule, "1", 3.0)            # all but one: the round closes without 2
    assert master.merges == [["0", "1"]] and master.weights[0].tolist() == [2.0] * 3
    assert sorted(master.replies) == [("0", "merged"), ("1", "merged")]
    master.replies.clear()
    _deliver(master, rule, "2", 100.0)          # 2's result of the closed round
    assert master.drops == ["2"] and master.replies == [("2", "dropped")]
    assert master.weights[0].tolist() == [2.0] * 3
    _deliver(master, rule, "2", 4.0)            # its next one counts in the open round
    _deliver(master, rule, "0", 2.0)
    assert master.merges[-1] == ["2", "0"] and master.weights[0].tolist() == [5.0] * 3


def test_sync_without_backup_waits_for_everyone():
    master, rule = _rule("sync")
    rule.start(["0", "1", "2"])
    _deliver(master, rule, "0", 1.0)
    _deliver(master, rule, "1", 1.0)
    assert master.merges == []


@pytest.mark.parametrize("arrival", ["012", "021", "210", "102"])
def test_sync_sums_the_deltas_in_slot_order_whatever_their_arrival(arrival):
    """float32 addition is not associative: 1e8 + 1 - 1e8 is 0 in slot order, 1 in the order 0, 2, 1."""
    master, rule = _rule("sync")
    rule.start(["0", "1", "2"])
    for worker in arrival:
        _deliver(master, rule, worker, {"0": 1e8, "1": 1.0, "2": -1e8}[worker])
    assert master.merges == [list(arrival)] and master.weights[0].tolist() == [0.0] * 3
    assert rule.total.early == {}


def test_sync_adds_an_early_delta_once_the_worker_before_it_is_gone():
    master, rule = _rule("sync")
    rule.start(["0", "1", "2"])
    _deliver(master, rule, "2", 1.0)
    _deliver(master, rule, "1", 2.0)
    assert len(rule.total.early) == 2 and rule.total.sum is None      # both wait for 0
    rule.on_lost("0")
    assert master.merges == [["2", "1"]] and master.weights[0].tolist() == [1.5] * 3


def test_local_sgd_moves_w_by_nesterov_momentum_over_the_mean_delta():
    a, m = 0.7, 0.9
    master, rule = _rule("local-sgd", outer_lr=a, outer_momentum=m)
    rule.start(["0", "1"])
    w, v = 0.0, 0.0
    for deltas in ((1.0, 3.0), (-2.0, 0.5), (4.0, 4.0)):
        for worker, value in zip("01", deltas):
            _deliver(master, rule, worker, value)
        delta = sum(deltas) / 2
        v = m * v + delta
        w += a * (m * v + delta)
        np.testing.assert_allclose(master.weights[0], w, rtol=1e-6)
        np.testing.assert_allclose(master.velocity[0], v, rtol=1e-6)


def test_local_sgd_with_rate_1_and_no_momentum_is_syncs_merge_bit_for_bit():
    rng = np.random.default_rng(0)
    deltas = [[rng.standard_normal(3).astype(np.float32) for _ in range(3)] for _ in range(4)]
    weights = []
    for mode, options in (("sync", {}), ("local-sgd", {"outer_lr": 1.0, "outer_momentum": 0.0})):
        master, rule = _rule(mode, **options)
        rule.start(["0", "1", "2"])
        for round_deltas in deltas:
            for worker in "201":
                master.results[worker] = [round_deltas[int(worker)]]
                rule.on_result(_result(master, worker, master.results[worker]))
        weights.append(master.weights[0])
    np.testing.assert_array_equal(weights[0], weights[1])
    assert not hasattr(master, "velocity")      # no momentum: the outer state is never touched


def test_a_round_holding_a_non_finite_result_leaves_the_rules_own_state_alone():
    """The master refuses a merge that takes a result holding NaN or Inf (weights.refuse_non_finite): local-sgd's
    outer momentum must not take the round in before it is refused, or the snapshot of the last good state would
    hold NaN."""
    master = Recorder()
    rule = MODES["local-sgd"].MergeRule(master, resolve_options("local-sgd", {"outer_momentum": 0.9}))
    rule.start(["0", "1"])
    good, bad = [np.ones(3, np.float32)], [np.full(3, np.nan, np.float32)]
    assert rule.on_result(base.Result("0", {"worker": "0", "loss": 1.0}, good)) == []
    actions = rule.on_result(base.Result("1", {"worker": "1", "loss": 1.0}, bad, non_finite=0))
    merge = actions[0]
    assert isinstance(merge, base.Merge) and [r.non_finite for r in merge.results] == [None, 0]
    assert np.isfinite(master.history()[0]).all() and not master.history()[0].any()

