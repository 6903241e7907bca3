"""The master's side of its parameter server shards (data_parallel/shards.py): what it refuses to shard, how many
shards `train --workers N` picks, and the events it writes down for the shards to replay."""
import re

import pytest

from pycaffe_dist.distributed.data_parallel import shards
from pycaffe_dist.distributed.data_parallel.modes import MODES, resolve_options
from pycaffe_dist.distributed.data_parallel.modes.base import Merge, Reply, Result
from pycaffe_dist.errors import PycaffeDistError
from pycaffe_dist.proto import caffe_pb2


def _param(clip=-1.0):
    param = caffe_pb2.SolverParameter()
    param.clip_gradients = clip
    return param


@pytest.mark.parametrize("mode, options, clip, urls, expected", [
    ("gossip", {}, -1, 2, "mode gossip keeps no central W to shard"),
    ("local-sgd", {}, -1, 2, "mode local-sgd keeps no central W to shard"),
    ("sync", {"compress": "1bit"}, -1, 2, "--compress sends each result as one payload"),
    ("gradient-only", {"lars": 0.02}, -1, 2, "--lars clips each blob's rate by the norms of the whole blob"),
    ("gradient-only", {}, 10.0, 2, "clip_gradients needs the norm of the whole gradient"),
    ("async", {}, -1, 3, "--servers 2 needs one Redis server per shard, got 3 Redis URL(s)"),
])
def test_what_needs_all_of_w_in_one_place_is_refused(mode, options, clip, urls, expected):
    with pytest.raises(PycaffeDistError, match=re.escape(expected)):
        shards.check_shardable(mode, resolve_options(mode, options), _param(clip), 2, ["u"] * urls)


def test_what_shards_passes():
    for mode in shards.SHARDED_MODES:
        shards.check_shardable(mode, resolve_options(mode, {}), _param(), 4, ["u"] * 4)
    shards.check_shardable("async", resolve_options("async", {}), _param(10.0), 2, ["u"] * 2)     # clip: workers'
    shards.check_shardable("gossip", resolve_options("gossip", {}), _param(), 1, ["u"] * 3)       # one server


def test_train_picks_shards_from_the_workers_and_the_nets_bytes():
    lenet, resnet50 = 1_724_320, 102_228_128
    assert shards.default_servers(8, lenet, cores=16)[0] == 1             # 14 MB a round: one master
    assert shards.default_servers(32, lenet, cores=16)[0] == 1
    servers, why = shards.default_servers(8, resnet50, cores=16)
    assert servers == 4 and why == ("8 workers x 102.2 MB of W = 818 MB a round; a shard per 64 MB, one per 4 of 16 "
                                    "cores at most")
    assert shards.default_servers(8, resnet50, cores=2)[0] == 1           # one per 4 cores
    assert shards.default_servers(64, resnet50, cores=128)[0] == shards.MOST_SHARDS


class _Slots:
    def slot(self, worker):
        return {"3": 0, "5": 1}[worker]

    def typical_staleness(self):
        return None


def test_the_rules_events_are_written_down_with_the_merges_after_them():
    log = shards.ShardLog(store=None, servers=2, heartbeat_s=1.0)
    view = _Slots()
    rule = shards.ReplayedRule(MODES["sync"].MergeRule(view, resolve_options("sync", {})), log, view.slot)
    assert rule.reads_results is False and rule.broadcasts_updates is True      # (the rule's own, but reading)
    assert rule.start(["3", "5"]) == [Reply("3", "welcome"), Reply("5", "welcome")]
    assert rule.on_result(Result("5", {}, shards.PLACEHOLDER, 2)) == []
    actions = rule.on_result(Result("3", {}, shards.PLACEHOLDER, 1))
    assert isinstance(actions[0], Merge) and [type(a) for a in actions[1:]] == [Reply, Reply]
    log.merged(0, 8.0)
    log.note("keep", count=1, kept=[1])
    log.merged(1, 8.0)                      # a further merge of the same event's actions: "more"
    assert log.records == [
        {"e": "start", "workers": ["3", "5"], "slots": [0, 1], "m": []},
        {"e": "result", "worker": "5", "staleness": 2, "m": []},
        {"e": "result", "worker": "3", "staleness": 1, "m": [[0, 8.0]]},
        {"e": "keep", "count": 1, "kept": [1]},
        {"e": "more", "m": [[1, 8.0]]},
    ]
