"""Caffe's layer factory: maps the type string of a LayerParameter to the class that implements it."""
from ..errors import NetError

_REGISTRY = {}


def register(type_name):
    """Class decorator: `@register("Convolution")`."""
    def wrap(cls):
        if type_name in _REGISTRY:
            raise RuntimeError("layer type %r registered twice" % type_name)
        cls.type = type_name
        _REGISTRY[type_name] = cls
        return cls
    return wrap


def layer_types():
    return sorted(_REGISTRY)


def create_layer(param, phase=None):
    cls = _REGISTRY.get(param.type)
    if cls is None:
        # Caffe: "Unknown layer type: X (known types: ...)" from layer_factory.hpp.
        raise NetError("layer '%s': unknown layer type: %r (known types: %s)"
                       % (param.name, param.type, ", ".join(layer_types())))
    return cls(param, phase)
