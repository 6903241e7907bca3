"""`import caffe`: this project's pycaffe, under Caffe's own name and module layout, so that a pycaffe script runs
unchanged (as Pillow's `PIL` stands in for PIL). Every submodule here is the pycaffe_dist module itself, not a
copy: `caffe.io is pycaffe_dist.io`, and a message of `caffe.proto.caffe_pb2` is one of pycaffe_dist's. To keep a
real Caffe on the same machine, install one of the two in its own virtual environment (see the README)."""
import importlib

import pycaffe_dist as _ours

# The names of Caffe's python/caffe/__init__.py (and the rest of pycaffe_dist's), bound to our objects.
__all__ = list(_ours.__all__)
__version__ = _ours.__version__
globals().update({name: getattr(_ours, name) for name in __all__})
# What `import caffe` binds in Caffe besides: its submodules (the rest load on their import: caffe.draw, ...).
for _submodule in ("io", "net_spec", "proto", "pycaffe"):
    importlib.import_module("." + _submodule, __name__)
