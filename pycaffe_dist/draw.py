"""A net's graph as a picture (pycaffe's `caffe.draw`, Caffe's python/draw_net.py; `dist_caffe draw`): layers are
boxes, blobs octagons, through pydot and Graphviz's `dot`.

The look is Caffe's, so that a picture drawn here reads like the ones in Caffe's docs and papers: a layer's box
says its name and type (the pooling method too), a convolution's or pooling's kernel, stride and pad; colours by
type (convolutions red, pooling orange, inner products purple, in-place neuron layers green); the edge out of a
layer says its batch or its output count. The node ids are ours, not the labels (Caffe's use the label as the id,
so two layers that read alike are drawn as one box)."""
import contextlib
import io

from .errors import PycaffeDistError
from .proto import caffe_pb2

LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}
TYPE_COLORS = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
               "InnerProduct": "#CC33FF"}
LEARNING_TYPES = ("Convolution", "Deconvolution", "InnerProduct")


class DrawError(PycaffeDistError, RuntimeError):
    """pydot or Graphviz's `dot` is missing, or `dot` refused the graph."""


def _pydot():
    try:
        import pydot
    except ImportError:
        raise DrawError("drawing a net needs pydot and Graphviz: pip install pydot, and apt-get install graphviz "
                        "(or your system's graphviz package)") from None
    return pydot


def get_pooling_types_dict():
    """{number: name} of PoolingParameter.PoolMethod (0: 'MAX', ...)."""
    return {value.number: name
            for name, value in caffe_pb2.PoolingParameter.PoolMethod.DESCRIPTOR.values_by_name.items()}


def get_edge_label(layer):
    """What the edge out of a layer says: a Data layer's batch, a learning layer's output count, else nothing."""
    if layer.type == "Data":
        return "Batch %d" % layer.data_param.batch_size
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return '""'


def get_layer_lr_mult(layer):
    """(weights', biases') lr_mult of a Convolution, Deconvolution or InnerProduct layer; 1.0 where not given."""
    if layer.type not in LEARNING_TYPES:
        raise ValueError("%s layers do not have a learning rate multiplier" % layer.type)
    if len(layer.param) > 2:
        raise ValueError("Could not parse the learning rate multiplier")
    mults = [spec.lr_mult for spec in layer.param] + [1.0] * (2 - len(layer.param))
    return tuple(mults)


def _first(values, default):
    return values[0] if len(values) else default


def get_layer_label(layer, rankdir, display_lrm=False):
    """A layer's box text, quoted for dot: its name, (type), the window of a spatial layer, and lr_mult on
    request. Words stack on new lines in a left-right graph, where height is free, and stand side by side in a
    top-bottom one."""
    separator = " " if rankdir in ("TB", "BT") else r"\n"
    kind = layer.type
    if kind == "Pooling":
        kind += " " + get_pooling_types_dict()[layer.pooling_param.pool]
    parts = [layer.name, "(%s)" % kind]
    if layer.type == "Pooling":
        window = layer.pooling_param.kernel_size, layer.pooling_param.stride, layer.pooling_param.pad
    elif layer.type in ("Convolution", "Deconvolution"):
        conv = layer.convolution_param
        window = _first(conv.kernel_size, 1), _first(conv.stride, 1), _first(conv.pad, 0)
    else:
        window = None
    if window is not None:
        parts.append(separator.join(["kernel size: %d" % window[0], "stride: %d" % window[1],
                                     "pad: %d" % window[2]]))
    if display_lrm and layer.type in LEARNING_TYPES:
        mults = get_layer_lr_mult(layer)
        if any(mults):
            parts.append("lr mult: %.1f, %.1f" % mults)
    return '"%s"' % separator.join(parts)


def choose_color_by_layertype(layertype):
    return TYPE_COLORS.get(layertype, LAYER_STYLE_DEFAULT["fillcolor"])


def _in_phase(layer, phase):
    """Whether a layer is drawn for `phase` (None: every layer), by its include/exclude phase rules only, as
    Caffe's draw does (levels and stages are not a picture's concern)."""
    if phase is None:
        return True
    if layer.include and layer.exclude:
        raise ValueError("layer %s has both include and exclude specified." % layer.name)
    if layer.include:
        return any(rule.phase == phase for rule in layer.include)
    return not any(rule.phase == phase for rule in layer.exclude)


def get_pydot_graph(caffe_net, rankdir, label_edges=True, phase=None, display_lrm=False):
    """The pydot Dot graph of a NetParameter; `phase` (caffe_pb2.TRAIN or TEST) keeps that phase's layers."""
    pydot = _pydot()
    graph = pydot.Dot(caffe_net.name or "Net", graph_type="digraph", rankdir=rankdir)
    blob_ids = {}

    def blob_node(name):
        # One node per blob name, so an in-place layer's edges loop on its blob, as in Caffe's pictures.
        if name not in blob_ids:
            blob_ids[name] = "blob%d" % len(blob_ids)
            graph.add_node(pydot.Node(blob_ids[name], label='"%s"' % name, **BLOB_STYLE))
        return blob_ids[name]

    for index, layer in enumerate(caffe_net.layer):
        if not _in_phase(layer, phase):
            continue
        in_place = len(layer.bottom) == 1 and len(layer.top) == 1 and layer.bottom[0] == layer.top[0]
        style = dict(NEURON_LAYER_STYLE if in_place else LAYER_STYLE_DEFAULT)
        if not in_place:
            style["fillcolor"] = choose_color_by_layertype(layer.type)
        node = "layer%d" % index
        graph.add_node(pydot.Node(node, label=get_layer_label(layer, rankdir, display_lrm), **style))
        for bottom in layer.bottom:
            graph.add_edge(pydot.Edge(blob_node(bottom), node, label='""'))
        for top in layer.top:
            graph.add_edge(pydot.Edge(node, blob_node(top), label=get_edge_label(layer) if label_edges else '""'))
    return graph


def draw_net(caffe_net, rankdir, ext="png", phase=None, display_lrm=False):
    """The picture of a NetParameter as bytes in format `ext` (png, svg, pdf, ...; 'raw' or 'dot': dot's text)."""
    graph = get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm)
    if ext in ("raw", "dot"):
        return graph.to_string().encode()
    if ext not in graph.formats:
        raise DrawError("cannot draw into a .%s file: Graphviz writes %s" % (ext, ", ".join(sorted(graph.formats))))
    try:
        # pydot prints dot's complaints before raising: they are kept for our one line instead.
        with contextlib.redirect_stdout(io.StringIO()) as said:
            return graph.create(format=ext)
    except FileNotFoundError:
        raise DrawError("Graphviz's dot is not installed: apt-get install graphviz (or your system's graphviz "
                        "package)") from None
    except AssertionError:      # dot ran and failed
        complaint = [line for line in said.getvalue().splitlines() if line.strip() and "b''" not in line]
        reason = complaint[-1] if complaint else "no reason given"
        raise DrawError("Graphviz's dot could not draw %s as %s: %s" % (caffe_net.name or "the net", ext, reason))


def draw_net_to_file(caffe_net, filename, rankdir="LR", phase=None, display_lrm=False):
    """Draw a NetParameter into `filename`, in the format its extension names ('.raw': the dot text)."""
    ext = filename[filename.rfind(".") + 1:]
    image = draw_net(caffe_net, rankdir, ext, phase, display_lrm)
    with open(filename, "wb") as out:
        out.write(image)
