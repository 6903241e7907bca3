"""The Python layer: a user's class named by python_param, as in pycaffe (src/caffe/layers/python_layer.hpp).

The user's class gets `param_str` and `phase` attributes and is called as setup(bottom, top), reshape(bottom,
top), forward(bottom, top) and backward(top, propagate_down, bottom) with our Blob objects, which have the
pycaffe blob interface (.data, .diff, .reshape(*shape), .count, .num ...). Its `blobs` are its parameters:
pycaffe's BlobVec, to which `self.blobs.add_blob(*shape)` in setup adds a learnable blob.
"""
import importlib

from ..errors import NetError
from ..blob.blob import Blob
from .base import Layer
from .registry import register


class BlobVec(list):
    """A Python layer's parameter blobs: a list with pycaffe's add_blob (python/caffe/_caffe.cpp)."""

    def add_blob(self, *shape):
        self.append(Blob(tuple(int(d) for d in shape)))


class UserLayer:
    """Base class of users' Python layers (`pycaffe_dist.Layer`, pycaffe's `caffe.Layer`)."""

    def __init__(self, param=None):
        self.layer_param = param
        self.blobs = BlobVec()

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass


@register("Python")
class PythonLayer(Layer):
    def layer_setup(self, bottom, top):
        p = self.param.python_param
        self.check(bool(p.module) and bool(p.layer), "python_param.module and python_param.layer must be set")
        try:
            module = importlib.import_module(p.module)
        except ImportError as exc:
            raise NetError("layer '%s' (Python): cannot import module '%s' (is it on PYTHONPATH?): %s"
                           % (self.name, p.module, exc)) from None
        cls = getattr(module, p.layer, None)
        if cls is None:
            raise NetError("layer '%s' (Python): module '%s' has no class '%s'" % (self.name, p.module, p.layer))
        # pycaffe constructs the class with the LayerParameter (its C++ base takes it).
        self.impl = cls(self.param) if issubclass(cls, UserLayer) else cls()
        self.impl.param_str = p.param_str
        self.impl.phase = self.phase
        self.blobs = self.impl.blobs = BlobVec(self.blobs)
        self.impl.setup(bottom, top)

    def reshape(self, bottom, top):
        self.impl.reshape(bottom, top)

    def forward(self, bottom, top):
        self.impl.forward(bottom, top)

    def backward(self, top, propagate_down, bottom):
        self.impl.backward(top, propagate_down, bottom)
