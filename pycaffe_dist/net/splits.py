"""Caffe's InsertSplits (src/caffe/util/insert_splits.cpp): a blob read by several layers (or read once and also
used as a loss) gets a Split layer whose tops feed each reader, so that their gradients add up.

Names follow Caffe exactly, since Caffe-written .caffemodel files and golden blobs carry them:
layer `<blob>_<producer>_<top index>_split`, tops `<blob>_<producer>_<top index>_split_<k>`.
"""
from ..errors import NetError
from ..proto import caffe_pb2


def split_layer_name(layer_name, blob_name, blob_idx):
    return "%s_%s_%d_split" % (blob_name, layer_name, blob_idx)


def split_blob_name(layer_name, blob_name, blob_idx, split_idx):
    return "%s_%s_%d_split_%d" % (blob_name, layer_name, blob_idx, split_idx)


def insert_splits(net):
    """Return a copy of the (filtered, V2) NetParameter with Split layers inserted."""
    last_top = {}            # blob name -> (layer index, top index) of its latest producer
    source_of_bottom = {}    # (layer, bottom) -> (layer, top)
    readers = {}             # (layer, top) -> number of readers (loss use counts as one)
    loss_weight_of_top = {}
    for i, layer in enumerate(net.layer):
        for j, name in enumerate(layer.bottom):
            if name not in last_top:
                raise NetError("layer '%s': unknown bottom blob '%s' (bottom index %d): no earlier layer "
                               "produces it" % (layer.name, name, j))
            src = last_top[name]
            source_of_bottom[(i, j)] = src
            readers[src] = readers.get(src, 0) + 1
        for j, name in enumerate(layer.top):
            last_top[name] = (i, j)
        # A top used as a loss counts as a reader, like a use as a bottom.
        for j in range(min(len(layer.loss_weight), len(layer.top))):
            src = last_top[layer.top[j]]
            loss_weight_of_top[src] = layer.loss_weight[j]
            if layer.loss_weight[j]:
                readers[src] = readers.get(src, 0) + 1

    if all(n <= 1 for n in readers.values()):
        return net
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    del out.layer[:]
    next_split = {}
    for i, layer in enumerate(net.layer):
        new = out.layer.add()
        new.CopyFrom(layer)
        for j, name in enumerate(layer.bottom):
            src = source_of_bottom[(i, j)]
            if readers.get(src, 0) > 1:
                k = next_split.get(src, 0)
                next_split[src] = k + 1
                new.bottom[j] = split_blob_name(net.layer[src[0]].name, name, src[1], k)
        for j, name in enumerate(layer.top):
            n = readers.get((i, j), 0)
            if n <= 1:
                continue
            loss_weight = loss_weight_of_top.get((i, j), 0.0)
            split = out.layer.add()
            split.name = split_layer_name(layer.name, name, j)
            split.type = "Split"
            split.bottom.append(name)
            for k in range(n):
                split.top.append(split_blob_name(layer.name, name, j, k))
                if loss_weight:
                    split.loss_weight.append(loss_weight if k == 0 else 0.0)
            if loss_weight:
                # The producer's loss now flows through split top 0, which keeps the weight.
                del new.loss_weight[:]
                next_split[(i, j)] = next_split.get((i, j), 0) + 1
    return out
