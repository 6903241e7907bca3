"""Helpers of the ONNX export tests: random weights for nets that carry none, and export-then-compare."""
import numpy as np

from pycaffe_dist.export import compare, to_onnx
from pycaffe_dist.export.onnx_graph import reshape_inputs

TOLERANCE = 1e-4


def randomize(net, seed=0):
    """Weights of a useful scale for nets whose fillers are constants (deploy prototxts): each multi-axis blob
    normal / sqrt(fan-in), each vector uniform in [0.5, 1.5] (positive: a scale, a variance, a slope, a bias)."""
    rng = np.random.default_rng(seed)
    for layer in net.layers:
        for blob in layer.blobs:
            shape = blob.shape
            if len(shape) >= 2:
                fan_in = max(1, blob.count // shape[0])
                blob.data[...] = rng.standard_normal(shape) / np.sqrt(fan_in)
            else:
                blob.data[...] = rng.uniform(0.5, 1.5, shape)


def batch_of_one(net):
    """Each input's first axis set to 1: the big deploy nets stay quick on two cores."""
    reshape_inputs(net, {name: (1,) + tuple(net.blob_by_name(name).shape[1:]) for name in net.inputs})


def export_and_compare(net, path, inputs=None, seed=0):
    """Export `net` to `path`; the relative differences of onnxruntime's outputs from our forward's."""
    model = to_onnx(net, path)
    return compare(net, model, inputs=inputs, seed=seed)


def assert_agrees(differences, what):
    assert differences, "%s: no outputs compared" % what
    worst = max(differences.values())
    assert worst <= TOLERANCE, "%s: onnxruntime differs from our forward by %s" % (what, differences)
