"""`caffe.io`: pycaffe_dist.io itself (this module's name in sys.modules is rebound to it)."""
import sys

from pycaffe_dist import io as _module

sys.modules[__name__] = _module
