"""NetState filtering (Caffe's Net::FilterNet / StateMeetsRule): which layers a phase, level and stages include."""
from ..errors import NetError
from ..proto import caffe_pb2


def make_state(phase=caffe_pb2.TEST, level=0, stages=()):
    state = caffe_pb2.NetState()
    state.phase = phase
    state.level = level
    state.stage.extend(stages)
    return state


def state_meets_rule(state, rule):
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(s not in stages for s in rule.stage):
        return False
    if any(s in stages for s in rule.not_stage):
        return False
    return True


def layer_included(layer, state):
    if len(layer.include) and len(layer.exclude):
        raise NetError("layer '%s': specify either include rules or exclude rules; not both" % layer.name)
    if len(layer.include):
        return any(state_meets_rule(state, r) for r in layer.include)
    return not any(state_meets_rule(state, r) for r in layer.exclude)


def filter_net(net, state):
    """A copy of `net` keeping only the layers `state` includes."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    del out.layer[:]
    for layer in net.layer:
        if layer_included(layer, state):
            out.layer.add().CopyFrom(layer)
    return out
