"""The layer library: one module per family; importing this package registers every layer type."""
from . import (activation, arithmetic, conv, data, inner_product, loss, norm, pool, python_layer, recurrent,
               reduction, shape, softmax)
from .base import Layer
from .registry import create_layer, layer_types, register

# The modules whose import runs their @register decorators (named here so that the import is seen to be used).
FAMILIES = (activation, arithmetic, conv, data, inner_product, loss, norm, pool, python_layer, recurrent, reduction,
            shape, softmax)

__all__ = ["Layer", "create_layer", "layer_types", "register"]
