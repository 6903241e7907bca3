"""`caffe.draw`: pycaffe_dist.draw itself (this module's name in sys.modules is rebound to it)."""
import sys

from pycaffe_dist import draw as _module

sys.modules[__name__] = _module
