"""Caffe's `debug_info` logging (Net::ForwardDebugInfo, BackwardDebugInfo and the norms at the end of
Net::Backward): after each layer runs, the mean absolute value of what it wrote, to find the layer where a
training run starts to blow up or die out. The solver turns it on for its display iterations when the solver's
`debug_info` is set; a NetParameter's own `debug_info` (a recurrent layer's unrolled net) keeps it on.

Means are in the blob's dtype, as Caffe's asum / count; an empty blob gives nan as 0 / 0 does in C++.
"""
import logging

import numpy as np

log = logging.getLogger("pycaffe_dist")


def _abs_mean(values):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.abs(values).sum(dtype=values.dtype) / values.dtype.type(values.size)


def _layer_params(net, layer_id):
    """(net param id, blob) of each param of the layer, in the layer's order."""
    return [(i, net.param_blobs[i]) for i, (owner_layer, _) in enumerate(net.param_layer_index)
            if owner_layer == layer_id]


def forward(net, layer_id):
    name = net.layer_names[layer_id]
    for blob_id in net.top_ids[layer_id]:
        log.info("    [Forward] Layer %s, top blob %s data: %g", name, net.blob_names[blob_id],
                 _abs_mean(net.blob_list[blob_id].cpu_data))
    for param_id, blob in _layer_params(net, layer_id):
        log.info("    [Forward] Layer %s, param blob %s data: %g", name, net.param_display_names[param_id],
                 _abs_mean(blob.cpu_data))


def backward(net, layer_id):
    name, layer = net.layer_names[layer_id], net.layers[layer_id]
    for blob_id, need in zip(net.bottom_ids[layer_id], net.bottom_need_backward[layer_id]):
        if need:
            log.info("    [Backward] Layer %s, bottom blob %s diff: %g", name, net.blob_names[blob_id],
                     _abs_mean(net.blob_list[blob_id].cpu_diff))
    for index, blob in enumerate(layer.blobs):
        if layer.param_propagate_down[index]:
            log.info("    [Backward] Layer %s, param blob %d diff: %g", name, index, _abs_mean(blob.cpu_diff))


def param_norms(net):
    """The L1 and L2 norms of all params the net owns (shared ones once), data and diff; Caffe logs it at
    ERROR level, so that it shows under a quieter log too."""
    owned = [blob for blob, owner in zip(net.param_blobs, net.param_owner) if owner < 0]
    if not owned:
        return
    dtype = owned[0].cpu_data.dtype.type
    asum_data = asum_diff = sumsq_data = sumsq_diff = dtype(0)
    for blob in owned:
        data, diff = blob.cpu_data.reshape(-1), blob.cpu_diff.reshape(-1)
        asum_data += np.abs(data).sum(dtype=dtype)
        asum_diff += np.abs(diff).sum(dtype=dtype)
        sumsq_data += np.dot(data, data)
        sumsq_diff += np.dot(diff, diff)
    log.error("    [Backward] All net params (data, diff): L1 norm = (%g, %g); L2 norm = (%g, %g)",
              asum_data, asum_diff, np.sqrt(sumsq_data), np.sqrt(sumsq_diff))
