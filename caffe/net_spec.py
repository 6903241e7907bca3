"""`caffe.net_spec`: pycaffe_dist.net_spec itself (this module's name in sys.modules is rebound to it)."""
import sys

from pycaffe_dist import net_spec as _module

sys.modules[__name__] = _module
