"""Caffe's files above the net: prototxt text (prototxt.py), format upgrades (upgrade.py), nets and solvers read as
Caffe reads them (load.py), weights (caffemodel.py), solver states (solverstate.py), and pycaffe's caffe.io
functions (pycaffe_io.py)."""
from .pycaffe_io import (Transformer, array_to_blobproto, array_to_datum, arraylist_to_blobprotovecor_str,
                         arraylist_to_blobprotovector_str, blobproto_to_array, blobprotovector_str_to_arraylist,
                         datum_to_array, load_image, oversample, resize_image)

__all__ = ["Transformer", "array_to_blobproto", "array_to_datum", "arraylist_to_blobprotovecor_str",
           "arraylist_to_blobprotovector_str", "blobproto_to_array", "blobprotovector_str_to_arraylist",
           "datum_to_array", "load_image", "oversample", "resize_image"]
