"""Caffe's schema (caffe.proto, field numbers as in BVLC/caffe) compiled to caffe_pb2.

Regenerate with `python tools/gen_caffe_proto.py`; tests/proto/test_caffe_pb2.py fails when the two differ. binary.py
reads and writes its messages as binary files.
"""
from . import caffe_pb2

__all__ = ["caffe_pb2"]
