"""Caffe's schema (caffe.proto, field numbers as in BVLC/caffe) compiled to caffe_pb2.

Regenerate with `python tools/gen_caffe_proto.py`; tests/proto/test_schema.py fails when the two differ.
"""
from . import caffe_pb2

__all__ = ["caffe_pb2"]
