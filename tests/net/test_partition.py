"""Cutting a net into pipeline stages: balanced FLOPs, the blobs crossing each cut, where cuts may not fall."""
import itertools

import pytest
from google.protobuf import text_format

from pycaffe_dist.errors import NetError
from pycaffe_dist.net import partition as P
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2

NET = """
name: "small"
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 8 dim: 1 dim: 12 dim: 12 } shape { dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
        inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def build(text=NET):
    return Net(text_format.Parse(text, caffe_pb2.NetParameter()), phase=caffe_pb2.TRAIN, fill_params=False)


def brute_force_bound(net, stages):
    costs = [f + b for f, b in P.layer_flops(net)]
    best = None
    for cuts in itertools.combinations(P.valid_cuts(net), stages - 1):
        bounds = [-1] + list(cuts) + [len(costs) - 1]
        worst = max(sum(costs[a + 1:b + 1]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_the_slowest_stage_is_as_fast_as_any_cut_allows(stages):
    net = build()
    part = P.partition(net, stages)
    assert max(part.flops) == brute_force_bound(net, stages)
    assert sum(part.flops) == sum(f + b for f, b in P.layer_flops(net))
    assert part.ranges[0][0] == 0 and part.ranges[-1][1] == len(net.layers) - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(part.ranges, part.ranges[1:]))


def test_backward_costs_one_forward_per_gradient():
    net = build()
    costs = dict(zip(net.layer_names, P.layer_flops(net)))
    forward, backward = costs["conv1"]
    assert forward > 0 and backward == forward          # its weights only: the data takes no gradient
    assert costs["ip1"][1] == 2 * costs["ip1"][0]      # weights and bottom
    assert costs["input"] == (0, 0)


def test_the_label_crosses_every_cut_without_a_gradient():
    net = build()
    part = P.partition(net, 3)
    for cut in part.cuts:
        assert "label" in cut.blobs
        assert dict(zip(cut.blobs, cut.needs_diff))["label"] is False
    cut = P.crossing(net, net.layer_names.index("ip1"))
    assert cut.blobs == ["ip1", "label"] and cut.needs_diff == [True, False]
    assert cut.shapes == [(8, 16), (8,)]
    assert cut.bytes_forward() == 4 * (8 * 16 + 8) and cut.bytes_backward() == 4 * 8 * 16


def test_a_cut_inside_an_in_place_chain_sends_the_blob_as_it_is_there():
    net = build()
    cut = P.crossing(net, net.layer_names.index("relu1"))
    assert cut.blobs == ["ip1", "label"] and cut.needs_diff == [True, False]


def test_each_stage_owns_the_parameters_of_its_layers():
    net = build()
    part = P.partition(net, 2)
    assert sorted(sum(part.params, [])) == list(range(len(net.learnable_params)))
    for s, params in enumerate(part.params):
        for index in params:
            layer_id = [lid for (lid, _), owner in zip(net.param_layer_index, net.param_owner) if owner < 0][index]
            assert part.stage_of(layer_id) == s


def test_layers_sharing_a_parameter_stay_in_one_stage():
    text = NET.replace('layer { name: "ip2" type: "InnerProduct" bottom: "ip1"',
                       'layer { name: "ipa" type: "InnerProduct" bottom: "ip1" top: "ipa" param { name: "w" }\n'
                       '        inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }\n'
                       'layer { name: "ipb" type: "InnerProduct" bottom: "ipa" top: "ipb" param { name: "w" }\n'
                       '        inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }\n'
                       'layer { name: "ip2" type: "InnerProduct" bottom: "ipb"')
    net = build(text)
    ipa, ipb = net.layer_names.index("ipa"), net.layer_names.index("ipb")
    cuts = P.valid_cuts(net)
    assert ipa - 1 in cuts and ipa not in cuts and ipb in cuts
    assert P.partition(net, 3).stage_of(ipa) == P.partition(net, 3).stage_of(ipb)


def test_layers_without_bottoms_stay_in_stage_0():
    text = NET.replace('layer { name: "loss"', 'layer { name: "noise" type: "DummyData" top: "noise" '
                       'dummy_data_param { shape { dim: 8 dim: 3 } } }\n'
                       'layer { name: "sum" type: "Eltwise" bottom: "ip2" bottom: "noise" top: "sum" }\n'
                       'layer { name: "loss"').replace('bottom: "ip2" bottom: "label" top: "loss"',
                                                       'bottom: "sum" bottom: "label" top: "loss"')
    net = build(text)
    noise = net.layer_names.index("noise")
    assert P.valid_cuts(net) == list(range(noise, len(net.layers) - 1))
    assert P.partition(net, 2).stage_of(noise) == 0
    with pytest.raises(NetError, match="cannot be cut into 4 stages: it has 2 place"):
        P.partition(net, 4)


def test_more_stages_than_the_net_allows_is_one_line():
    net = build()
    with pytest.raises(NetError) as error:
        P.partition(net, len(net.layers) + 1)
    assert "at most %d stages" % len(net.layers) in str(error.value) and "\n" not in str(error.value)


def test_every_stage_builds_the_same_net_with_inputs_of_a_micro_batch():
    net = build()
    stage_net = Net(P.stage_net_param(net, 4), state=net.state, fill_params=False)
    assert stage_net.layer_names == net.layer_names
    assert stage_net.layer_need_backward == net.layer_need_backward
    assert stage_net.bottom_need_backward == net.bottom_need_backward
    assert stage_net.blob_by_name("data").shape == (2, 1, 12, 12) and stage_net.blob_by_name("label").shape == (2,)
    assert [tuple(b.shape) for b in stage_net.learnable_params] == [tuple(b.shape) for b in net.learnable_params]
    assert [layer.type for layer in P.feed_net_param(net).layer] == ["Input"]
    assert P.batch_sizes(net) == {"data": 8, "label": 8}


def test_batch_norm_in_training_mixes_the_samples():
    text = NET.replace('layer { name: "ip1"', 'layer { name: "bn" type: "BatchNorm" bottom: "pool1" top: "pool1" }\n'
                       'layer { name: "ip1"')
    assert P.sample_mixing_layers(build(text)) == ["bn"]
    assert P.sample_mixing_layers(build()) == []


def test_the_description_names_each_layers_stage_and_each_cut():
    net = build()
    text = P.format_partition(net, P.partition(net, 2))
    assert "pipeline of 2 stages" in text
    assert "stage 0: layers input.." in text and "stage 1: layers " in text
    assert "cut 0|1 after " in text and "label(8) no diff" in text
