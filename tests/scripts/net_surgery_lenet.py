"""A pycaffe script after Caffe's examples/net_surgery.ipynb ("casting a classifier into a fully convolutional
network"), on LeNet. Written as a pycaffe user writes it: `import caffe`.

usage: python net_surgery_lenet.py LENET_DEPLOY.prototxt LENET.caffemodel OUT_DIR
"""
import os
import sys

import numpy as np

import caffe
from caffe.proto import caffe_pb2
from google.protobuf import text_format

deploy, weights, out_dir = sys.argv[1:4]
caffe.set_mode_cpu()

net = caffe.Net(deploy, weights, caffe.TEST)
print("blobs {}\nparams {}".format(net.blobs.keys(), net.params.keys()))
for layer_name, blob in net.blobs.items():
    print(layer_name + '\t' + str(blob.data.shape))
params = ['ip1', 'ip2']
fc_params = {pr: (net.params[pr][0].data, net.params[pr][1].data) for pr in params}
for fc in params:
    print('{} weights are {} dimensional and biases are {} dimensional'.format(fc, fc_params[fc][0].shape,
                                                                              fc_params[fc][1].shape))

# The fully convolutional LeNet: ip1 -> conv 4x4 (50 -> 500), ip2 -> conv 1x1, on a larger input.
proto = caffe_pb2.NetParameter()
text_format.Merge(open(deploy).read(), proto)
proto.name = "LeNetFullConv"
for layer in proto.layer:
    if layer.type == "Input":
        layer.input_param.shape[0].dim[:] = [1, 1, 40, 40]
    if layer.name in params:
        num_output = layer.inner_product_param.num_output
        layer.name = layer.name.replace('ip', 'ip-conv')
        layer.type = "Convolution"
        layer.ClearField("inner_product_param")
        layer.convolution_param.num_output = num_output
        layer.convolution_param.kernel_size.append(4 if layer.name == 'ip-conv1' else 1)
full_conv_path = os.path.join(out_dir, 'lenet_full_conv.prototxt')
with open(full_conv_path, 'w') as f:
    f.write(text_format.MessageToString(proto))

net_full_conv = caffe.Net(full_conv_path, weights, caffe.TEST)
params_full_conv = ['ip-conv1', 'ip-conv2']
conv_params = {pr: (net_full_conv.params[pr][0].data, net_full_conv.params[pr][1].data) for pr in params_full_conv}
for conv in params_full_conv:
    print('{} weights are {} dimensional and biases are {} dimensional'.format(conv, conv_params[conv][0].shape,
                                                                              conv_params[conv][1].shape))
for pr, pr_conv in zip(params, params_full_conv):
    conv_params[pr_conv][0].flat = fc_params[pr][0].flat  # flat unrolls the arrays
    conv_params[pr_conv][1][...] = fc_params[pr][1]
out_weights = os.path.join(out_dir, 'lenet_full_conv.caffemodel')
net_full_conv.save(out_weights)
print('output shape', net_full_conv.blobs['prob'].data.shape)

# Reload the surgered weights: they must come back exactly.
check = caffe.Net(full_conv_path, caffe.TEST, weights=out_weights)
for pr, pr_conv in zip(params, params_full_conv):
    assert np.array_equal(check.params[pr_conv][0].data.reshape(fc_params[pr][0].shape), fc_params[pr][0])
    assert np.array_equal(check.params[pr_conv][1].data, fc_params[pr][1])
print('surgery ok')
