"""The layer library: one module per family; importing this package registers every layer type."""
from . import (activation, conv, data, inner_product, loss, norm, pool, python_layer,  # noqa: F401 (registers)
               recurrent, shape, softmax)
from .base import Layer
from .registry import create_layer, layer_types, register

__all__ = ["Layer", "create_layer", "layer_types", "register"]
