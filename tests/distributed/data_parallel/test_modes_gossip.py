"""Gossip mode (modes/gossip.py): the master's rule on its own (the count, the live peers, the mean it tests), the
worker's averaging, a job of 3 worker processes that loses one to SIGKILL and goes on among the other two, and a
job that diverges."""
import json
import math
import re
import signal

import numpy as np
import pytest

from pycaffe_dist.distributed.data_parallel.modes import base, gossip, resolve_options
from pycaffe_dist.errors import DivergedError
from pycaffe_dist.io.caffemodel import load_weights
from pycaffe_dist.io.load import read_solver
from pycaffe_dist.pycaffe import TEST, Net

from ..conftest import DrivenRule, accuracies, needs_fashion_mnist, train_on_workers, wait_for_merges


class Recorder:
    """The tests' own master: it carries out the actions the rule returns, recording each; each worker's published
    weights in `published`."""

    def __init__(self):
        self.weights = [np.zeros(3, np.float32)]
        self.published, self.replies, self.merges, self.forgotten = {}, [], [], []

    def carry(self, actions):
        for action in actions:
            if isinstance(action, base.Average):
                there = [self.published[w] for w in action.workers if w in self.published]
                if there:
                    self.weights[0][...] = np.mean(there, axis=0)
            elif isinstance(action, base.Forget):
                self.forgotten.append(action.worker)
                self.published.pop(action.worker, None)
            elif isinstance(action, base.Merge):
                assert not action.adds and action.gradients is None      # gossip moves no central W
                self.merges.append(sorted(r.worker for r in action.results))
            elif isinstance(action, base.Reply):
                self.replies.append((action.worker, action.status, action.fields.get("peers")))
            else:
                raise AssertionError("unexpected action %r" % (action,))


def _rule(**options):
    master = Recorder()
    return master, DrivenRule(master, gossip.MergeRule(master, resolve_options("gossip", options)))


def _round(master, rule, worker, value, loss=1.0):
    master.published[worker] = np.full(3, value, np.float32)
    rule.on_result(base.Result(worker, {"worker": worker, "loss": loss, "averagings": 0}))


def test_a_global_iteration_is_a_round_of_every_live_worker_and_replies_list_the_others():
    master, rule = _rule()
    rule.start(["0", "1", "2"])
    assert master.replies == [("0", "welcome", None), ("1", "welcome", None), ("2", "welcome", None)]
    master.replies.clear()
    _round(master, rule, "0", 1.0)
    _round(master, rule, "0", 1.0)             # a fast worker's second round counts in the same iteration
    assert master.merges == [] and master.replies == [("0", "merged", ["1", "2"])] * 2
    _round(master, rule, "2", 1.0)
    assert master.merges == [["0", "0", "2"]]
    assert rule.depth == 1 and not rule.reads_results


def test_a_lost_worker_is_nobodys_peer_and_the_count_goes_on_with_the_others():
    master, rule = _rule()
    rule.start(["0", "1", "2"])
    _round(master, rule, "0", 1.0)
    rule.on_lost("2")
    assert master.forgotten == ["2"]
    _round(master, rule, "1", 1.0)             # two live workers: this completes the iteration
    assert master.merges == [["0", "1"]] and master.replies[-1] == ("1", "merged", ["0"])
    rule.on_lost("1")
    _round(master, rule, "0", 1.0)             # alone: every round an iteration, no peer to choose
    assert master.merges[-1] == ["0"] and master.replies[-1] == ("0", "merged", [])


def test_tests_and_newcomers_get_the_mean_of_the_live_workers_weights():
    master, rule = _rule()
    rule.start(["0", "1"])
    _round(master, rule, "0", 1.0)
    _round(master, rule, "1", 3.0)
    rule.settle_weights()
    assert master.weights[0].tolist() == [2.0] * 3
    master.weights[0][...] = 7.0
    rule.settle_weights()                      # nothing moved since: not read again
    assert master.weights[0].tolist() == [7.0] * 3
    _round(master, rule, "0", 5.0)
    rule.on_join("2")                          # joins from the mean of 0 and 1, then is a peer
    assert master.weights[0].tolist() == [4.0] * 3 and master.replies[-1] == ("2", "welcome", None)
    _round(master, rule, "0", 5.0)
    assert master.replies[-1] == ("0", "merged", ["1", "2"])


def test_a_worker_whose_loss_is_not_finite_stops_the_job():
    master, rule = _rule()
    rule.start(["0", "1"])
    with pytest.raises(DivergedError, match="worker 1's loss is nan"):
        _round(master, rule, "1", 1.0, loss=math.nan)


def test_the_worker_averages_with_its_peer_and_goes_on_alone_without_one():
    x_end, peer = [np.full(2, 1.0, np.float32)], [np.full(2, 3.0, np.float32)]
    assert gossip.RoundRule.next_start("peer", peer, x_end, None, True)[0].tolist() == [2.0, 2.0]
    assert gossip.RoundRule.next_start("alone", None, x_end, None, True) is x_end
    assert gossip.RoundRule.next_start("merged", peer, x_end, None, True) is x_end    # the first round, from W
    assert gossip.RoundRule.next_start("reset", peer, x_end, None, True) is peer      # back to the master's mean
    published = gossip.RoundRule.result(None, x_end, None, None, {}, 2)
    assert published[0] is not x_end[0] and published[0].tolist() == [1.0, 1.0]
    assert gossip.RoundRule.choose_peer([]) is None
    assert {gossip.RoundRule.choose_peer(["1", "2"]) for _ in range(100)} == {"1", "2"}


def test_overlapped_the_averaging_moves_between_copies_of_one_age_and_the_workers_still_agree():
    """With overlap, the peer's copy was read when this worker published `answered`, a round before x_end: the move
    is a quarter of (peer - answered), added to x_end. Two workers with nothing else moving come to agree (with a
    half, their spread follows d' = d - d_before, whose roots have modulus 1: it never shrinks, and a job at 2
    workers diverged); and while both step the same way, none of the step is taken back (averaged with x_end
    itself, half of every step was)."""
    end, peer, answered = [np.full(2, 5.0, np.float32)], [np.full(2, 3.0, np.float32)], [np.full(2, 1.0, np.float32)]
    assert gossip.RoundRule.next_start("peer", peer, end, None, True, answered)[0].tolist() == [5.5, 5.5]
    assert gossip.RoundRule.next_start("peer", peer, end, None, False, end)[0].tolist() == [4.0, 4.0]
    for step in (0.0, 0.5):
        x, y = [np.zeros(1, np.float32)], [np.ones(1, np.float32)]
        x_sent = y_sent = None
        for _ in range(60):
            x_end, y_end = [x[0] + np.float32(step)], [y[0] + np.float32(step)]
            # each averages with the copy the other published a round before, as an overlapped worker does
            x = x_end if y_sent is None else gossip.RoundRule.next_start("peer", y_sent, x_end, None, True, x_sent)
            y = y_end if x_sent is None else gossip.RoundRule.next_start("peer", x_sent, y_end, None, True, y_sent)
            x_sent, y_sent = x_end, y_end
        assert abs(float(x[0][0] - y[0][0])) < 1e-3
        assert float(x[0][0] + y[0][0]) / 2 == pytest.approx(0.5 + 60 * step, abs=1e-3)   # every step kept


@pytest.mark.redis
@pytest.mark.slow
def test_gossip_survives_a_killed_worker_among_the_live_ones(procs, make_solver, store_for):
    """3 workers; worker 2 is killed with SIGKILL: the master counts it out, the two others keep averaging with
    each other (never with the dead one), and the job reaches max_iter (rounds of the 2 live workers)."""
    job, iterations = "kill-gossip", 5000
    procs.master(job, make_solver(max_iter=iterations), "gossip", 3)
    for index in (0, 1):
        procs.worker(job, index)
    victim = procs.worker(job, 2)
    wait_for_merges(store_for(job), 60)
    victim.send_signal(signal.SIGKILL)
    procs.check("master", 180)
    for index in (0, 1):
        procs.check("worker%d" % index, 30)
    log = procs.log("master")
    assert "Worker 2 has no heartbeat" in log and "going on with 2 worker(s)" in log
    stats = procs.stats()
    assert stats["count"] == iterations and sorted(stats["workers"]) == ["0", "1"]
    assert accuracies(stats)[-1] > 0.8
    # Almost every round of the survivors averaged (those that chose worker 2 in the second it died skipped it).
    assert stats["averaged_share"] > 0.9, stats
    rounds = [int(re.search(r"worker %d: (\d+) rounds" % i, procs.log("worker%d" % i)).group(1)) for i in (0, 1)]
    assert min(rounds) > 0.3 * iterations, rounds       # both went on after the kill


@pytest.mark.redis
@pytest.mark.slow
@needs_fashion_mnist
def test_a_diverging_worker_stops_the_job_with_one_line_and_a_finite_snapshot(lenet_solver, tmp_path):
    """base_lr 1.0: a worker's loss turns NaN; the master, which reads no weights between tests, stops on that
    loss before the worker's weights spread further, and keeps the last finite mean."""
    solver = lenet_solver(base_lr=1.0, max_iter=500)
    run = train_on_workers(solver, 4, "gossip", tmp_path / "stats.json", timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert len(errors) == 1, errors
    found = re.match(r"dist_caffe: error: training diverged in mode gossip at merge (\d+): worker \d+'s loss is "
                     r"(nan|inf|-inf); the last finite weights are in (\S+\.caffemodel) "
                     r"\(lower the solver's base_lr\)$", errors[0])
    assert found, errors[0]
    net = Net(read_solver(str(solver)).net, TEST)
    load_weights(net, found.group(3))
    assert all(np.isfinite(blob.data).all() for blob in net.learnable_params)
    assert json.loads((tmp_path / "stats.json").read_text())["count"] == int(found.group(1))
