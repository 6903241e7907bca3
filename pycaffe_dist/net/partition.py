"""Cutting a built TRAIN net into K consecutive stages, for pipelined model parallelism (DistBelief's model
partitions, run with GPipe's micro-batches: Huang et al. 2019; distributed/pipeline/stage.py runs them).

A cut falls between two layers of the net as built (phase rules applied, Split layers inserted). What crosses it
is every blob written by a layer before the cut and read by a layer after it: the activations, and also what a
later stage needs from the data layers (the loss's label), which the stages in between pass on untouched. Since
the Split layers give every version of a blob one reader, a crossing blob's gradient is written by exactly one
layer after the cut, and it goes back only where that layer propagates down to it.

A cut may not fall
- before a layer without bottoms (Data, Input, DummyData...): those feed the net and all run in stage 0;
- between layers that share a parameter (ParamSpec.name): their gradients add up in one blob.

The stages balance forward + backward FLOPs: forward as `net-info` counts them (Layer.flops), backward as the
forward once for each gradient the layer computes (its parameters' and its bottoms'), none where the net runs no
backward. Among the cuts whose slowest stage is the least slow, the one moving the fewest bytes is taken.
"""
import dataclasses

from ..errors import NetError
from ..proto import caffe_pb2
from .info import human

FLOAT_BYTES = 4


@dataclasses.dataclass
class Cut:
    """The boundary after layer `after`: the blobs crossing it (names, shapes for one batch), and which of them
    carry a gradient back."""
    after: int
    blobs: list
    shapes: list
    needs_diff: list

    def bytes_forward(self):
        return sum(FLOAT_BYTES * _count(s) for s in self.shapes)

    def bytes_backward(self):
        return sum(FLOAT_BYTES * _count(s) for s, d in zip(self.shapes, self.needs_diff) if d)


@dataclasses.dataclass
class Partition:
    """K stages: stage s runs layers ranges[s] = (first, last), both included; cuts[s] lies between stage s and
    s + 1; flops[s] is its forward + backward count per batch; params[s] the indices (into the net's
    learnable_params) of the parameters its layers own; feed the layers without bottoms (all in stage 0)."""
    ranges: list
    cuts: list
    flops: list
    params: list
    feed: list

    @property
    def stages(self):
        return len(self.ranges)

    def stage_of(self, layer_id):
        return next(s for s, (first, last) in enumerate(self.ranges) if first <= layer_id <= last)


def _count(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def layer_flops(net):
    """(forward, backward) FLOPs of each layer for one batch (see the module's docstring)."""
    costs = []
    for layer_id, layer in enumerate(net.layers):
        bottom = [net.blob_list[i] for i in net.bottom_ids[layer_id]]
        top = [net.blob_list[i] for i in net.top_ids[layer_id]]
        forward = int(layer.flops(bottom, top))
        gradients = 0
        if net.layer_need_backward[layer_id]:
            gradients = int(any(layer.param_propagate_down) and bool(layer.blobs)) + \
                int(any(net.bottom_need_backward[layer_id]))
        costs.append((forward, forward * gradients))
    return costs


def feed_layers(net):
    return [i for i, ids in enumerate(net.bottom_ids) if not ids]


def valid_cuts(net):
    """The layers a cut may follow (see the module's docstring), in order."""
    layers = len(net.layers)
    feed = feed_layers(net)
    allowed = [True] * max(0, layers - 1)
    for i in range(min(feed[-1], layers - 1) if feed else 0):
        allowed[i] = False
    users = {}
    for (layer_id, _), owner, index in zip(net.param_layer_index, net.param_owner, range(len(net.param_owner))):
        users.setdefault(owner if owner >= 0 else index, []).append(layer_id)
    for ids in users.values():
        for i in range(min(ids), max(ids)):
            allowed[i] = False
    return [i for i, ok in enumerate(allowed) if ok]


def crossing(net, after):
    """The Cut after layer `after`."""
    written, names, shapes, needs = set(), [], [], []
    for layer_id in range(after + 1):
        written.update(net.top_ids[layer_id])
    seen = set()
    for layer_id in range(after + 1, len(net.layers)):
        for j, blob_id in enumerate(net.bottom_ids[layer_id]):
            if blob_id in written and blob_id not in seen:
                # its first reader after the cut is the last to write its diff in the backward pass
                seen.add(blob_id)
                names.append(net.blob_names[blob_id])
                shapes.append(tuple(net.blob_list[blob_id].shape))
                needs.append(bool(net.layer_need_backward[layer_id] and net.bottom_need_backward[layer_id][j]))
    return Cut(after, names, shapes, needs)


def partition(net, stages):
    """Cut `net` into `stages` consecutive stages of balanced FLOPs (see the module's docstring)."""
    if stages < 1:
        raise NetError("a pipeline needs at least 1 stage, got %d" % stages)
    positions = valid_cuts(net)
    if stages - 1 > len(positions):
        raise NetError("net '%s' cannot be cut into %d stages: it has %d place(s) to cut (layers without bottoms "
                       "stay in stage 0, layers sharing a parameter stay together), so at most %d stages"
                       % (net.name, stages, len(positions), len(positions) + 1))
    costs = [f + b for f, b in layer_flops(net)]
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    cut_bytes = {p: crossing(net, p) for p in positions}
    weight = {p: cut.bytes_forward() + cut.bytes_backward() for p, cut in cut_bytes.items()}
    last = len(net.layers) - 1
    # The least slowest stage first; then, under that bound, the fewest bytes.
    bound = _best(positions, stages, prefix, last, lambda seg, prev, p: max(prev, seg), None)[0]
    _, chosen = _best(positions, stages, prefix, last,
                      lambda seg, prev, p: prev + weight.get(p, 0) if seg <= bound else None, bound)
    starts = [0] + [p + 1 for p in chosen]
    ends = chosen + [last]
    ranges = list(zip(starts, ends))
    owners = {}
    for index, ((layer_id, _), owner) in enumerate(zip(net.param_layer_index, net.param_owner)):
        if owner < 0:
            owners[len(owners)] = layer_id
    params = [[i for i, layer_id in owners.items() if first <= layer_id <= end] for first, end in ranges]
    return Partition(ranges=ranges, cuts=[cut_bytes[p] for p in chosen],
                     flops=[prefix[end + 1] - prefix[first] for first, end in ranges], params=params,
                     feed=feed_layers(net))


def _best(positions, stages, prefix, last, combine, bound):
    """Dynamic programme over the cut positions: best[j][p] = the value of the first j + 1 stages ending after
    position p. combine(segment cost, previous value, position closing the segment) -> value, None if barred.
    Returns (value, the chosen positions)."""
    def segment(after_prev, end):
        return prefix[end + 1] - prefix[after_prev + 1]
    # state: position index -> (value, path); position -1 stands for 'before layer 0'
    best = {-1: (0, [])}
    for j in range(stages):
        final = j == stages - 1
        nxt = {}
        for end in ([last] if final else positions):
            for start, (value, path) in best.items():
                if start >= end or (not final and end == last):
                    continue
                seg = segment(start, end)
                if bound is not None and seg > bound:
                    continue
                new = combine(seg, value, end if not final else None)
                if new is None:
                    continue
                if end not in nxt or new < nxt[end][0]:
                    nxt[end] = (new, path + ([end] if not final else []))
        best = nxt
    return best[last]


def stage_net_param(net, micro_batches):
    """The net every stage builds: the net as built, its layers without bottoms turned into Input layers of the same
    tops, shaped for one of `micro_batches` micro-batches (stage 0 fills them from feed_net_param's net; elsewhere
    they only hold blobs). Everything else stays, so that each stage's net has the same layers, blobs and backward
    decisions as the whole net, and runs its own range of them."""
    param = caffe_pb2.NetParameter()
    param.CopyFrom(net.param)
    for layer_id in feed_layers(net):
        source = net.param.layer[layer_id]
        layer = param.layer[layer_id]
        layer.Clear()
        layer.name, layer.type, layer.phase = source.name, "Input", source.phase
        layer.top.extend(source.top)
        for blob_id in net.top_ids[layer_id][:len(source.top)]:
            shape = net.blob_list[blob_id].shape
            layer.input_param.shape.add().dim.extend((shape[0] // micro_batches,) + tuple(shape[1:]))
    return param


def feed_net_param(net):
    """Stage 0's data net: the layers without bottoms, as they are (whole batches)."""
    param = caffe_pb2.NetParameter()
    param.name = net.param.name
    for layer_id in feed_layers(net):
        param.layer.add().CopyFrom(net.param.layer[layer_id])
    return param


def batch_sizes(net):
    """{feed top name: its batch (axis 0)} for every top of a layer without bottoms."""
    sizes = {}
    for layer_id in feed_layers(net):
        for blob_id in net.top_ids[layer_id]:
            shape = net.blob_list[blob_id].shape
            if not shape:
                raise NetError("layer '%s': top '%s' has no batch axis to cut into micro-batches"
                               % (net.layer_names[layer_id], net.blob_names[blob_id]))
            sizes[net.blob_names[blob_id]] = shape[0]
    return sizes


def sample_mixing_layers(net):
    """Layers whose output for one sample depends on the other samples of the batch in training: BatchNorm
    computing the batch's statistics. Micro-batches would change what they compute."""
    return [layer.name for layer in net.layers
            if layer.type == "BatchNorm" and not (layer.param.batch_norm_param.HasField("use_global_stats")
                                                  and layer.param.batch_norm_param.use_global_stats)]


def format_partition(net, part):
    """net-info's view of a partition: each layer's stage, then FLOPs per stage and bytes across each cut."""
    lines = ["pipeline of %d stages (forward + backward FLOPs per batch; bytes per batch across each cut):"
             % part.stages]
    width = max(len(n) for n in net.layer_names) if net.layer_names else 5
    for layer_id, name in enumerate(net.layer_names):
        lines.append("  stage %d  %s  %s" % (part.stage_of(layer_id), name.ljust(width),
                                            net.layers[layer_id].type))
    total = sum(part.flops) or 1
    for s, ((first, last), flops) in enumerate(zip(part.ranges, part.flops)):
        lines.append("stage %d: layers %s..%s, %s FLOPs (%.0f%%)" % (s, net.layer_names[first], net.layer_names[last],
                                                                   human(flops), 100.0 * flops / total))
    for s, cut in enumerate(part.cuts):
        blobs = ", ".join("%s(%s)%s" % (n, ",".join(str(d) for d in shape), "" if d else " no diff")
                          for n, shape, d in zip(cut.blobs, cut.shapes, cut.needs_diff))
        lines.append("cut %d|%d after %s: %sB forward, %sB back: %s" % (s, s + 1, net.layer_names[cut.after],
                                                                      human(cut.bytes_forward()),
                                                                      human(cut.bytes_backward()), blobs or "-"))
    return "\n".join(lines)
