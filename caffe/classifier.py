"""`caffe.classifier`: pycaffe_dist.classifier itself (this module's name in sys.modules is rebound to it)."""
import sys

from pycaffe_dist import classifier as _module

sys.modules[__name__] = _module
