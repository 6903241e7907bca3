"""`caffe.proto`: Caffe's schema package; `caffe.proto.caffe_pb2` is pycaffe_dist.proto.caffe_pb2 itself."""
import sys

from pycaffe_dist.proto import caffe_pb2

sys.modules[__name__ + ".caffe_pb2"] = caffe_pb2
