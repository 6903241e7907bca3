"""Small nets with saved weights for the Classifier, Detector, classify and extract-features tests, and a way to
run the inference verbs in-process as `dist_caffe` would (the same parser entries, add_verbs)."""
import argparse

import numpy as np

from pycaffe_dist.cli import inference as inference_cli
from pycaffe_dist.pycaffe import TEST, Net

LAYERS = """
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: %(classes)d } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


def deploy_text(channels=3, size=8, batch=2, classes=5, width=None):
    """A deploy net: Input N x C x size x width, a 3x3 convolution, ReLU, InnerProduct to `classes`, Softmax."""
    return ('name: "small" layer { name: "input" type: "Input" top: "data" '
            'input_param { shape { dim: %d dim: %d dim: %d dim: %d } } }' % (batch, channels, size, width or size)
            + LAYERS % {"classes": classes})


def write_deploy(tmp_path, seed=0, **shape):
    """(prototxt path, weights path) of a deploy net with random (seeded) weights saved as a .caffemodel."""
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(deploy_text(**shape))
    weights = tmp_path / "small.caffemodel"
    randomize(Net(str(proto), TEST), seed).save(str(weights))
    return proto, weights


def randomize(net, seed):
    """Weights of about unit gain (std 1/sqrt(fan-in)), so that inputs of about unit size give varied scores."""
    rng = np.random.RandomState(seed)
    for blobs in net.params.values():
        for blob in blobs:
            fan_in = int(np.prod(blob.data.shape[1:])) if blob.data.ndim > 1 else 1
            blob.data[...] = rng.normal(0.0, 1.0 / np.sqrt(fan_in), blob.data.shape)
    return net


def run_verb(*argv):
    """Parse and run an inference verb in-process, as the dist_caffe CLI does; returns its exit code."""
    parser = argparse.ArgumentParser(prog="dist_caffe")
    inference_cli.add_verbs(parser.add_subparsers(dest="verb"))
    args = parser.parse_args([str(a) for a in argv])
    return args.func(args)
