"""`caffe.pycaffe`: pycaffe_dist.pycaffe itself (this module's name in sys.modules is rebound to it)."""
import sys

from pycaffe_dist import pycaffe as _module

sys.modules[__name__] = _module
