"""Nets written in Python (pycaffe's python/caffe/net_spec.py): `NetSpec`, `layers`, `params`, `to_proto`.

    n = NetSpec()
    n.data, n.label = layers.Data(source='train_lmdb', batch_size=64, backend=params.Data.LMDB, ntop=2)
    n.conv1 = layers.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type='xavier'))
    net_param = n.to_proto()

pycaffe's rules, which this module keeps:
- a layer and its first top take the NetSpec attribute name they are assigned to; a top that was never assigned
  gets `<Type><k>`, k counting per layer type in the order the graph is walked (tops and unnamed layers share the
  count); a layer with `ntop=0` that is not assigned gets `<Type><k>` too;
- `ntop=N` gives N tops, `in_place=True` makes the tops the bottoms;
- a keyword goes to the layer's own parameter message (`<type>_param`, found from the message's type name, so
  ReLU -> relu_param, HDF5Data -> hdf5_data_param, LRN -> lrn_param) when that message has such a field, else to
  LayerParameter itself (`loss_weight`, `include`, `name`, ...); a keyword ending in `param` always goes to
  LayerParameter (`param=[...]`, `transform_param=...`, `convolution_param=...`);
- values: dicts fill messages, lists fill repeated fields (a list of dicts adds one message per dict), a single
  value given for a repeated field becomes a one-element list.
"""
import collections
import sys

from google.protobuf.message import Message

from .proto import caffe_pb2


def _param_field_names():
    """{'Convolution': 'convolution_param', 'ReLU': 'relu_param', ...} from LayerParameter's message types, as
    pycaffe's param_name_dict does (the type name of each *_param message, less 'Parameter')."""
    table = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            table[field.message_type.name[:-len("Parameter")]] = field.name
    # Layer types whose parameters live in another type's message. pycaffe has no entry for them, so there a
    # bare keyword (L.Deconvolution(x, num_output=8)) is an error; here it reaches the message Caffe reads.
    for layer_type, owner in (("Deconvolution", "Convolution"), ("Im2col", "Convolution"),
                              ("RNN", "Recurrent"), ("LSTM", "Recurrent")):
        table.setdefault(layer_type, table[owner])
    return table


_PARAM_FIELDS = _param_field_names()


def _has_field(message, name):
    return name in message.DESCRIPTOR.fields_by_name


def assign_proto(proto, name, value):
    """Set field `name` of message `proto` from a Python value: a dict fills a message, a list (or tuple) fills a
    repeated field, one value for a repeated field counts as a one-element list."""
    if not _has_field(proto, name):
        raise AttributeError("%s has no field '%s'" % (proto.DESCRIPTOR.name, name))
    field = getattr(proto, name)
    if hasattr(field, "extend"):   # a repeated field (pycaffe's test)
        is_message = proto.DESCRIPTOR.fields_by_name[name].message_type is not None
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, dict):
                _fill(field.add(), item)
            elif is_message:
                field.add().CopyFrom(item)
            else:
                field.append(item)
    elif isinstance(value, dict):
        _fill(field, value)
    elif isinstance(value, Message) and isinstance(field, Message):
        field.CopyFrom(value)
    else:
        setattr(proto, name, value)


def _fill(message, values):
    for key, value in values.items():
        assign_proto(message, key, value)


class Top:
    """One output blob of a layer: the `n`-th top of Function `fn`."""

    def __init__(self, fn, n):
        self.fn = fn
        self.n = n

    def to_proto(self):
        """A NetParameter with every layer needed to compute this top."""
        return to_proto(self)

    def _update(self, params):
        self.fn._update(params)

    def _to_proto(self, layers, names, autonames):
        return self.fn._to_proto(layers, names, autonames)


class Function:
    """A layer: its type, its input Tops and its parameters (keywords)."""

    def __init__(self, type_name, inputs, params):
        for index, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                raise TypeError("%s input %d is not a Top (type is %s)" % (type_name, index, type(inp)))
        self.type_name = type_name
        self.inputs = tuple(inputs)
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _autoname(self, autonames):
        autonames[self.type_name] += 1
        return "%s%d" % (self.type_name, autonames[self.type_name])

    def _top_name(self, top, names, autonames):
        if top not in names:
            names[top] = self._autoname(autonames)
        return names[top]

    def _name(self, names, autonames):
        if self not in names:
            names[self] = self._top_name(self.tops[0], names, autonames) if self.ntop > 0 \
                else self._autoname(autonames)
        return names[self]

    def _update(self, params):
        self.params.update(params)

    def _to_proto(self, layers, names, autonames):
        if self in layers:
            return
        bottoms = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottoms.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter(type=self.type_name, bottom=bottoms)
        if self.in_place:
            layer.top.extend(bottoms)
        else:
            layer.top.extend(self._top_name(top, names, autonames) for top in self.tops)
        layer.name = self._name(names, autonames)
        for key, value in self.params.items():
            self._assign(layer, key, value)
        layers[self] = layer

    def _assign(self, layer, key, value):
        field = _PARAM_FIELDS.get(self.type_name)
        if not key.endswith("param") and field is not None and _has_field(getattr(layer, field), key):
            assign_proto(getattr(layer, field), key, value)
        elif _has_field(layer, key):
            assign_proto(layer, key, value)
        else:
            where = "%s nor of LayerParameter" % field if field else "LayerParameter"
            raise AttributeError("layer '%s' (%s): unknown parameter '%s': not a field of %s"
                                 % (layer.name, self.type_name, key, where))


class NetSpec:
    """Tops assigned as attributes (or items); to_proto() writes every layer they need, named after the
    attributes."""

    def __init__(self):
        super().__setattr__("tops", collections.OrderedDict())

    def __setattr__(self, name, value):
        self.tops[name] = value

    def __getattr__(self, name):
        if name == "tops":   # not yet set (copy, pickle): no recursion through self.tops
            raise AttributeError(name)
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError("NetSpec has no top '%s'" % name) from None

    def __setitem__(self, name, value):
        self.tops[name] = value

    def __getitem__(self, name):
        return self.tops[name]

    def __delitem__(self, name):
        del self.tops[name]

    def keys(self):
        return list(self.tops.keys())

    def vals(self):
        return list(self.tops.values())

    def update(self, name, params):
        self.tops[name]._update(params)

    def to_proto(self):
        names = {value: name for name, value in self.tops.items()}
        layers = collections.OrderedDict()
        autonames = collections.Counter()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        return caffe_pb2.NetParameter(layer=list(layers.values()))


def to_proto(*tops):
    """A NetParameter with every layer needed to compute `tops` (names of unassigned tops are generated)."""
    layers = collections.OrderedDict()
    autonames = collections.Counter()
    names = {}
    for top in tops:
        top.fn._to_proto(layers, names, autonames)
    return caffe_pb2.NetParameter(layer=list(layers.values()))


class Layers:
    """`layers.Convolution(bottom, kernel_size=3)`: a Top (ntop=1), a tuple of Tops (ntop>1) or the Function
    itself (ntop=0)."""

    def __getattr__(self, type_name):
        if type_name.startswith("__"):
            raise AttributeError(type_name)
        # On the package, pycaffe's `layers` hides the subpackage pycaffe_dist.layers (the layer classes), so
        # `import pycaffe_dist.layers as m` or mock.patch("pycaffe_dist.layers.conv...") land here: its lowercase
        # names (modules, functions) are handed on. Caffe's layer types all start with a capital.
        package = sys.modules.get(__package__ + ".layers")
        if not type_name[:1].isupper() and hasattr(package, type_name):
            return getattr(package, type_name)

        def layer_fn(*inputs, **params):
            fn = Function(type_name, inputs, params)
            if fn.ntop == 0:
                return fn
            return fn.tops[0] if fn.ntop == 1 else fn.tops
        layer_fn.__name__ = type_name
        return layer_fn


class _EnumValues:
    def __init__(self, message):
        self._message = message

    def __getattr__(self, name):
        return getattr(self._message, name)


class Parameters:
    """`params.Pooling.MAX`: the constants of caffe_pb2.PoolingParameter (enum values)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        message = getattr(caffe_pb2, name + "Parameter", None)
        if message is None:
            raise AttributeError("caffe_pb2 has no message %sParameter" % name)
        return _EnumValues(message)


layers = Layers()
params = Parameters()
