"""`caffe.coord_map`: pycaffe_dist.coord_map itself (this module's name in sys.modules is rebound to it)."""
import sys

from pycaffe_dist import coord_map as _module

sys.modules[__name__] = _module
