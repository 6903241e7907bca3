"""`caffe.detector`: pycaffe_dist.detector itself (this module's name in sys.modules is rebound to it)."""
import sys

from pycaffe_dist import detector as _module

sys.modules[__name__] = _module
