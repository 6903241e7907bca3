"""Caffe's upgrade rules for old nets (V0, V1, input fields, BatchNorm params) and solvers (solver_type enum).

One function per function of Caffe's src/caffe/util/upgrade_proto.cpp (BVLC master 9b89154), same order, same
meaning; the rules are summarised in tests/fixtures/reference/caffe_upgrade.md. Everything works on caffe_pb2
messages in place (or, like Caffe, from an input message into an output message) and copies only fields that
are set, because presence (has_*) is part of the result.

Where Caffe LOG(FATAL)s or CHECK-fails we raise UpgradeError naming the layer; where it only LOG(ERROR)s we add
the line to the messages and report the upgrade as not fully compatible. Log lines are plain text, without
glog's severity/file prefix. `log` arguments are lists the lines are appended to (None: dropped).

Deliberate differences from Caffe (each also noted where it happens):
  * a net with both `layer` and `layers` is refused before any step (Caffe refuses it in UpgradeV1Net, but a
    V0 net's `layer` entries are silently dropped by UpgradeV0Net before that check can see them);
  * a V1 layer whose `type` is an enum number this schema does not know (only possible from a binary proto,
    where protobuf keeps it as an unknown field) is refused; Caffe would silently lose the type;
  * upgrade_solver also upgrades nets nested in net_param / train_net_param / test_net_param
    (upgrade_solver_proto_text leaves them alone).
"""
import os

from google.protobuf.unknown_fields import UnknownFieldSet

from ..errors import UpgradeError
from ..proto import caffe_pb2

V1 = caffe_pb2.V1LayerParameter


def _log(log, line):
    if log is not None:
        log.append(line)


def _name(layer):
    return layer.name if layer.name else "<unnamed>"


def _copy_if_set(src, src_field, dst, dst_field):
    """dst.dst_field = src.src_field if src has it set (scalar or message)."""
    if not src.HasField(src_field):
        return
    value = getattr(src, src_field)
    if hasattr(value, "CopyFrom"):
        getattr(dst, dst_field).CopyFrom(value)
    else:
        setattr(dst, dst_field, value)


# ------------------------------------------------------------------------------------------------ V0 -> V1

def net_needs_v0_to_v1_upgrade(net):
    """NetNeedsV0ToV1Upgrade: any `layers` entry carrying a nested V0 `layer`."""
    return any(l.HasField("layer") for l in net.layers)


def upgrade_v0_padding_layers(param, out):
    """UpgradeV0PaddingLayers: fold each V0 "padding" layer into the conv/pool layer that consumes it.

    `out` becomes a copy of `param` without the padding layers; the consumer gets the padding's `pad` and
    the padding's bottom. Idempotent.
    """
    out.CopyFrom(param)
    del out.layers[:]
    last_top_idx = {name: -1 for name in param.input}       # blob -> index of the layer that last wrote it
    for i, connection in enumerate(param.layers):
        layer = connection.layer
        if layer.type != "padding":
            out.layers.add().CopyFrom(connection)
        for j, blob in enumerate(connection.bottom):
            if blob not in last_top_idx:
                raise UpgradeError("Unknown blob input %r to layer %r (bottom %d)" % (blob, _name(layer), j))
            top_idx = last_top_idx[blob]
            if top_idx == -1:                                   # a net input
                continue
            source = param.layers[top_idx]
            if source.layer.type != "padding":
                continue
            # upgrade_proto.cpp: CHECKs; other cases have undefined behaviour in Caffe.
            if layer.type not in ("conv", "pool"):
                raise UpgradeError("Padding layer %r input to non-convolutional / non-pooling layer %r of type %r"
                                   % (_name(source.layer), _name(layer), layer.type))
            if len(connection.bottom) != 1:
                raise UpgradeError("layer %r: Conv Layer takes a single blob as input (padding layer %r feeds it)"
                                   % (_name(layer), _name(source.layer)))
            if len(source.bottom) != 1:
                raise UpgradeError("padding layer %r: Padding Layer takes a single blob as input"
                                   % _name(source.layer))
            if len(source.top) != 1:
                raise UpgradeError("padding layer %r: Padding Layer produces a single blob as output"
                                   % _name(source.layer))
            consumer = out.layers[-1]
            consumer.layer.pad = source.layer.pad
            consumer.bottom[j] = source.bottom[0]
        for blob in connection.top:
            last_top_idx[blob] = i


def upgrade_v0_net(v0_net, out, log=None):
    """UpgradeV0Net: padding fold, then every layer to V1. Only name, layers, input, input_dim and
    force_backward survive (Caffe copies nothing else). Returns whether every layer was fully compatible."""
    padded = caffe_pb2.NetParameter()
    upgrade_v0_padding_layers(v0_net, padded)
    out.Clear()
    if padded.HasField("name"):
        out.name = padded.name
    ok = True
    for connection in padded.layers:
        ok &= upgrade_v0_layer_parameter(connection, out.layers.add(), log)
    out.input.extend(padded.input)
    out.input_dim.extend(padded.input_dim)
    if padded.HasField("force_backward"):
        out.force_backward = padded.force_backward
    return ok


# V0 field -> {V0 layer type: (V1 sub-message, its field)} for the fields that depend on the layer type,
# in Caffe's order of checks. A set V0 field whose layer type is missing here is LOG(ERROR)ed. Fields in
# _V0_TRANSFORM go to transform_param for any layer type.
_V0_TYPED = {
    "num_output": {"conv": ("convolution_param", "num_output"), "innerproduct": ("inner_product_param", "num_output")},
    "biasterm": {"conv": ("convolution_param", "bias_term"), "innerproduct": ("inner_product_param", "bias_term")},
    "weight_filler": {"conv": ("convolution_param", "weight_filler"),
                      "innerproduct": ("inner_product_param", "weight_filler")},
    "bias_filler": {"conv": ("convolution_param", "bias_filler"),
                    "innerproduct": ("inner_product_param", "bias_filler")},
    "pad": {"conv": ("convolution_param", "pad"), "pool": ("pooling_param", "pad")},
    "kernelsize": {"conv": ("convolution_param", "kernel_size"), "pool": ("pooling_param", "kernel_size")},
    "group": {"conv": ("convolution_param", "group")},
    "stride": {"conv": ("convolution_param", "stride"), "pool": ("pooling_param", "stride")},
    "pool": {"pool": ("pooling_param", "pool")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio")},
    "local_size": {"lrn": ("lrn_param", "local_size")},
    "alpha": {"lrn": ("lrn_param", "alpha")},
    "beta": {"lrn": ("lrn_param", "beta")},
    "k": {"lrn": ("lrn_param", "k")},
    "source": {"data": ("data_param", "source"), "hdf5_data": ("hdf5_data_param", "source"),
               "images": ("image_data_param", "source"), "window_data": ("window_data_param", "source"),
               "infogain_loss": ("infogain_loss_param", "source")},
    "scale": None, "meanfile": None,                      # transform_param, at this point of Caffe's order
    "batchsize": {"data": ("data_param", "batch_size"), "hdf5_data": ("hdf5_data_param", "batch_size"),
                  "images": ("image_data_param", "batch_size"), "window_data": ("window_data_param", "batch_size")},
    "cropsize": None, "mirror": None,
    "rand_skip": {"data": ("data_param", "rand_skip"), "images": ("image_data_param", "rand_skip")},
    "shuffle_images": {"images": ("image_data_param", "shuffle")},
    "new_height": {"images": ("image_data_param", "new_height")},
    "new_width": {"images": ("image_data_param", "new_width")},
    "concat_dim": {"concat": ("concat_param", "concat_dim")},
    "det_fg_threshold": {"window_data": ("window_data_param", "fg_threshold")},
    "det_bg_threshold": {"window_data": ("window_data_param", "bg_threshold")},
    "det_fg_fraction": {"window_data": ("window_data_param", "fg_fraction")},
    "det_context_pad": {"window_data": ("window_data_param", "context_pad")},
    "det_crop_mode": {"window_data": ("window_data_param", "crop_mode")},
    "hdf5_output_param": {"hdf5_output": ("hdf5_output_param", None)},     # None: the whole message
}
_V0_TRANSFORM = {"scale": "scale", "meanfile": "mean_file", "cropsize": "crop_size", "mirror": "mirror"}
# upgrade_proto.cpp names shuffle_images "shuffle" in its error line.
_V0_ERROR_NAME = {"shuffle_images": "shuffle"}


def upgrade_v0_layer_parameter(v0_connection, out, log=None):
    """UpgradeV0LayerParameter: one V0 `layers { layer {...} bottom top }` entry -> V1LayerParameter `out`.
    Returns False (and logs "Unknown parameter X for layer type T") when a set V0 field has no place."""
    ok = True
    out.Clear()
    out.bottom.extend(v0_connection.bottom)
    out.top.extend(v0_connection.top)
    if not v0_connection.HasField("layer"):
        return ok
    v0 = v0_connection.layer
    if v0.HasField("name"):
        out.name = v0.name
    kind = v0.type
    if v0.HasField("type"):
        try:
            out.type = upgrade_v0_layer_type(kind)
        except UpgradeError as exc:
            raise UpgradeError("layer %r: %s" % (_name(v0), exc)) from None
    out.blobs.extend(v0.blobs)
    out.blobs_lr.extend(v0.blobs_lr)
    out.weight_decay.extend(v0.weight_decay)
    for field, targets in _V0_TYPED.items():
        if not v0.HasField(field):
            continue
        if targets is None:                                     # scale, meanfile, cropsize, mirror
            setattr(out.transform_param, _V0_TRANSFORM[field], getattr(v0, field))
            continue
        if kind not in targets:
            _log(log, "Unknown parameter %s for layer type %s" % (_V0_ERROR_NAME.get(field, field), kind))
            ok = False
            continue
        sub_name, target = targets[kind]
        sub = getattr(out, sub_name)
        value = getattr(v0, field)
        if target is None:
            sub.CopyFrom(value)
        elif field == "pool":                                   # same enum names in V0 and PoolingParameter
            sub.pool = caffe_pb2.PoolingParameter.PoolMethod.Value(
                caffe_pb2.V0LayerParameter.PoolMethod.Name(value))
        elif hasattr(value, "CopyFrom"):                        # fillers
            getattr(sub, target).CopyFrom(value)
        elif sub_name == "convolution_param" and target in ("pad", "kernel_size", "stride"):
            getattr(sub, target).append(value)                  # repeated in ConvolutionParameter
        else:
            setattr(sub, target, value)
    return ok


_V0_LAYER_TYPES = {
    "accuracy": V1.ACCURACY, "bnll": V1.BNLL, "concat": V1.CONCAT, "conv": V1.CONVOLUTION, "data": V1.DATA,
    "dropout": V1.DROPOUT, "euclidean_loss": V1.EUCLIDEAN_LOSS, "flatten": V1.FLATTEN, "hdf5_data": V1.HDF5_DATA,
    "hdf5_output": V1.HDF5_OUTPUT, "im2col": V1.IM2COL, "images": V1.IMAGE_DATA,
    "infogain_loss": V1.INFOGAIN_LOSS, "innerproduct": V1.INNER_PRODUCT, "lrn": V1.LRN,
    "multinomial_logistic_loss": V1.MULTINOMIAL_LOGISTIC_LOSS, "pool": V1.POOLING, "relu": V1.RELU,
    "sigmoid": V1.SIGMOID, "softmax": V1.SOFTMAX, "softmax_loss": V1.SOFTMAX_LOSS, "split": V1.SPLIT,
    "tanh": V1.TANH, "window_data": V1.WINDOW_DATA,
}


def upgrade_v0_layer_type(type_name):
    """UpgradeV0LayerType: V0 lower-case type string -> V1 LayerType enum value."""
    try:
        return _V0_LAYER_TYPES[type_name]
    except KeyError:
        raise UpgradeError("Unknown layer name: %r" % type_name) from None


# ------------------------------------------------------------------------------------------------ data transform

_DATA_PARAMS = {V1.DATA: "data_param", V1.IMAGE_DATA: "image_data_param", V1.WINDOW_DATA: "window_data_param"}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def net_needs_data_upgrade(net):
    """NetNeedsDataUpgrade: a V1 data layer with scale/mean_file/crop_size/mirror in its own parameter."""
    for layer in net.layers:
        sub_name = _DATA_PARAMS.get(layer.type)
        if sub_name and any(getattr(layer, sub_name).HasField(f) for f in _TRANSFORM_FIELDS):
            return True
    return False


def upgrade_net_data_transformation(net):
    """UpgradeNetDataTransformation: move those fields of V1 data layers into transform_param."""
    for layer in net.layers:
        sub_name = _DATA_PARAMS.get(layer.type)
        if not sub_name:
            continue
        sub = getattr(layer, sub_name)
        for field in _TRANSFORM_FIELDS:
            if sub.HasField(field):
                setattr(layer.transform_param, field, getattr(sub, field))
                sub.ClearField(field)


# ------------------------------------------------------------------------------------------------ V1 -> V2

def net_needs_v1_to_v2_upgrade(net):
    """NetNeedsV1ToV2Upgrade: any `layers` entry at all."""
    return len(net.layers) > 0


def _refuse_layer_and_layers():
    raise UpgradeError("Refusing to upgrade inconsistent NetParameter input; the definition includes both "
                       "'layer' and 'layers' fields. The current format defines 'layer' fields with string type "
                       "like layer { type: 'Layer' ... } and not layers { type: LAYER ... }. Manually switch the "
                       "definition to 'layer' format to continue.")


def upgrade_v1_net(v1_net, out, log=None):
    """UpgradeV1Net: `out` = `v1_net` with every V1 `layers` entry turned into a `layer`."""
    if len(v1_net.layer) > 0:
        _refuse_layer_and_layers()
    ok = True
    out.CopyFrom(v1_net)
    del out.layers[:]
    del out.layer[:]
    for i, v1_layer in enumerate(v1_net.layers):
        try:
            layer_ok = upgrade_v1_layer_parameter(v1_layer, out.layer.add(), log)
        except UpgradeError as exc:
            raise UpgradeError("layers[%d]: %s" % (i, exc)) from None     # the index: names may be empty
        if not layer_ok:
            _log(log, "Upgrade of input layer %d failed." % i)
            ok = False
    return ok


# Sub-messages UpgradeV1LayerParameter copies verbatim, in its order.
_V1_COPIED_PARAMS = (
    "accuracy_param", "argmax_param", "concat_param", "contrastive_loss_param", "convolution_param", "data_param",
    "dropout_param", "dummy_data_param", "eltwise_param", "exp_param", "hdf5_data_param", "hdf5_output_param",
    "hinge_loss_param", "image_data_param", "infogain_loss_param", "inner_product_param", "lrn_param",
    "memory_data_param", "mvn_param", "pooling_param", "power_param", "relu_param", "sigmoid_param",
    "softmax_param", "slice_param", "tanh_param", "threshold_param", "window_data_param", "transform_param",
    "loss_param",
)
_V1_TYPE_FIELD = V1.DESCRIPTOR.fields_by_name["type"].number
_WIRETYPE_VARINT = 0    # protobuf's wire type of int and enum fields


def upgrade_v1_layer_parameter(v1_layer, out, log=None):
    """UpgradeV1LayerParameter: V1LayerParameter -> LayerParameter `out`. Returns False if the V1 layer still
    holds a V0 `layer` (ignored, as in Caffe)."""
    ok = True
    out.Clear()
    out.bottom.extend(v1_layer.bottom)
    out.top.extend(v1_layer.top)
    if v1_layer.HasField("name"):
        out.name = v1_layer.name
    out.include.extend(v1_layer.include)
    out.exclude.extend(v1_layer.exclude)
    try:
        if v1_layer.HasField("type"):
            out.type = upgrade_v1_layer_type(v1_layer.type)
        else:
            # Deliberate: an enum number unknown to the schema (binary input) lands in the unknown fields;
            # Caffe would drop it silently, which UpgradeV1LayerType would have refused (LOG(FATAL)).
            for field in UnknownFieldSet(v1_layer):
                if field.field_number == _V1_TYPE_FIELD:
                    # a varint holds an enum number; any other wire type is a field of the wrong kind, which
                    # protobuf also sets aside here instead of refusing the file
                    if field.wire_type != _WIRETYPE_VARINT:
                        raise UpgradeError("field 'type' (%d) has wire type %d, not a varint enum; corrupt file?"
                                           % (_V1_TYPE_FIELD, field.wire_type))
                    upgrade_v1_layer_type(field.data)
    except UpgradeError as exc:
        raise UpgradeError("layer %r: %s" % (_name(v1_layer), exc)) from None
    out.blobs.extend(v1_layer.blobs)

    def spec(i):                                          # param(i), growing the ParamSpec list as Caffe does
        while len(out.param) <= i:
            out.param.add()
        return out.param[i]

    for i, name in enumerate(v1_layer.param):
        spec(i).name = name
    for i, mode in enumerate(v1_layer.blob_share_mode):  # STRICT/PERMISSIVE have the same numbers in ParamSpec
        spec(i).share_mode = mode
    for i, lr in enumerate(v1_layer.blobs_lr):
        spec(i).lr_mult = lr
    for i, decay in enumerate(v1_layer.weight_decay):
        spec(i).decay_mult = decay
    out.loss_weight.extend(v1_layer.loss_weight)
    for sub_name in _V1_COPIED_PARAMS:
        _copy_if_set(v1_layer, sub_name, out, sub_name)
    if v1_layer.HasField("layer"):
        _log(log, "Input NetParameter has V0 layer -- ignoring.")
        ok = False
    return ok


_V1_LAYER_TYPES = {
    V1.NONE: "", V1.ABSVAL: "AbsVal", V1.ACCURACY: "Accuracy", V1.ARGMAX: "ArgMax", V1.BNLL: "BNLL",
    V1.CONCAT: "Concat", V1.CONTRASTIVE_LOSS: "ContrastiveLoss", V1.CONVOLUTION: "Convolution",
    V1.DECONVOLUTION: "Deconvolution", V1.DATA: "Data", V1.DROPOUT: "Dropout", V1.DUMMY_DATA: "DummyData",
    V1.EUCLIDEAN_LOSS: "EuclideanLoss", V1.ELTWISE: "Eltwise", V1.EXP: "Exp", V1.FLATTEN: "Flatten",
    V1.HDF5_DATA: "HDF5Data", V1.HDF5_OUTPUT: "HDF5Output", V1.HINGE_LOSS: "HingeLoss", V1.IM2COL: "Im2col",
    V1.IMAGE_DATA: "ImageData", V1.INFOGAIN_LOSS: "InfogainLoss", V1.INNER_PRODUCT: "InnerProduct",
    V1.LRN: "LRN", V1.MEMORY_DATA: "MemoryData", V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss",
    V1.MVN: "MVN", V1.POOLING: "Pooling", V1.POWER: "Power", V1.RELU: "ReLU", V1.SIGMOID: "Sigmoid",
    V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss", V1.SILENCE: "Silence", V1.SOFTMAX: "Softmax",
    V1.SOFTMAX_LOSS: "SoftmaxWithLoss", V1.SPLIT: "Split", V1.SLICE: "Slice", V1.TANH: "TanH",
    V1.WINDOW_DATA: "WindowData", V1.THRESHOLD: "Threshold",
}


def upgrade_v1_layer_type(type_value):
    """UpgradeV1LayerType: V1 LayerType enum value -> V2 type string."""
    try:
        return _V1_LAYER_TYPES[type_value]
    except KeyError:
        raise UpgradeError("Unknown V1LayerParameter layer type: %d" % type_value) from None


# ------------------------------------------------------------------------------------------------ input fields

def net_needs_input_upgrade(net):
    """NetNeedsInputUpgrade: the net still lists `input` names."""
    return len(net.input) > 0


def upgrade_net_input(net):
    """UpgradeNetInput: input + input_shape / input_dim -> one Input layer named "input", placed first.
    Names without any shape (legacy caffemodels) are just dropped."""
    has_shape, has_dim = len(net.input_shape) > 0, len(net.input_dim) > 0
    if has_shape or has_dim:
        # Caffe reads input_shape(i) / input_dim(4i..4i+3) unchecked; we refuse what would read past the end.
        if has_shape and len(net.input_shape) < len(net.input):
            raise UpgradeError("%d inputs but only %d input_shape entries" % (len(net.input), len(net.input_shape)))
        if not has_shape and len(net.input_dim) < 4 * len(net.input):
            raise UpgradeError("%d inputs need %d input_dim entries (4 each), got %d"
                               % (len(net.input), 4 * len(net.input), len(net.input_dim)))
        layer = caffe_pb2.LayerParameter(name="input", type="Input")
        for i, name in enumerate(net.input):
            layer.top.append(name)
            shape = layer.input_param.shape.add()
            if has_shape:
                shape.CopyFrom(net.input_shape[i])
            else:
                shape.dim.extend(net.input_dim[4 * i:4 * i + 4])
        rest = caffe_pb2.NetParameter()
        rest.layer.extend(net.layer)                      # copies; Caffe appends the layer, then bubbles it
        del net.layer[:]                                  # to the front keeping the others' order
        net.layer.add().CopyFrom(layer)
        net.layer.extend(rest.layer)
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


# ------------------------------------------------------------------------------------------------ BatchNorm

def _old_batchnorm(layer):
    return layer.type == "BatchNorm" and len(layer.param) == 3


def net_needs_batchnorm_upgrade(net):
    """NetNeedsBatchNormUpgrade: a BatchNorm layer with exactly 3 param specs (the old definition)."""
    return any(_old_batchnorm(l) for l in net.layer)


def upgrade_net_batchnorm(net):
    """UpgradeNetBatchNorm: zero lr_mult and decay_mult of those 3 specs; the specs themselves stay, so the
    net still "needs" this upgrade afterwards (a fixed point, as in Caffe)."""
    for layer in net.layer:
        if _old_batchnorm(layer):
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


# ------------------------------------------------------------------------------------------------ drivers

def net_needs_upgrade(net):
    """NetNeedsUpgrade: any of the five steps of upgrade_net would do something."""
    return (net_needs_v0_to_v1_upgrade(net) or net_needs_v1_to_v2_upgrade(net) or net_needs_data_upgrade(net)
            or net_needs_input_upgrade(net) or net_needs_batchnorm_upgrade(net))


def upgrade_net(net, source="<net>"):
    """UpgradeNetAsNeeded: upgrade the NetParameter `net` in place, step by step as Caffe does.

    Returns (ok, messages): ok is False when a step reported a problem (the net is upgraded as far as
    possible, as Caffe continues); messages are the lines Caffe logs, `source` standing for the file name.
    Raises UpgradeError where Caffe aborts.
    """
    messages = []
    ok = True
    if len(net.layer) > 0 and len(net.layers) > 0:        # deliberate: checked up front, see the module doc
        _refuse_layer_and_layers()
    if net_needs_v0_to_v1_upgrade(net):
        messages.append("Attempting to upgrade input file specified using deprecated V0LayerParameter: %s" % source)
        original = caffe_pb2.NetParameter()
        original.CopyFrom(net)
        if not upgrade_v0_net(original, net, messages):
            ok = False
            messages.append("Warning: had one or more problems upgrading V0NetParameter to NetParameter "
                            "(see above); continuing anyway.")
        else:
            messages.append("Successfully upgraded file specified using deprecated V0LayerParameter")
        messages.append("Note that future Caffe releases will not support V0NetParameter; use "
                        "./build/tools/upgrade_net_proto_text for prototxt and ./build/tools/upgrade_net_proto_binary "
                        "for model weights upgrade this and any other net protos to the new format.")
    if net_needs_data_upgrade(net):
        messages.append("Attempting to upgrade input file specified using deprecated transformation parameters: %s"
                        % source)
        upgrade_net_data_transformation(net)
        messages.append("Successfully upgraded file specified using deprecated data transformation parameters.")
        messages.append("Note that future Caffe releases will only support transform_param messages for "
                        "transformation fields.")
    if net_needs_v1_to_v2_upgrade(net):
        messages.append("Attempting to upgrade input file specified using deprecated V1LayerParameter: %s" % source)
        original = caffe_pb2.NetParameter()
        original.CopyFrom(net)
        if not upgrade_v1_net(original, net, messages):
            ok = False
            messages.append("Warning: had one or more problems upgrading V1LayerParameter (see above); "
                            "continuing anyway.")
        else:
            messages.append("Successfully upgraded file specified using deprecated V1LayerParameter")
    if net_needs_input_upgrade(net):
        messages.append("Attempting to upgrade input file specified using deprecated input fields: %s" % source)
        upgrade_net_input(net)
        messages.append("Successfully upgraded file specified using deprecated input fields.")
        messages.append("Note that future Caffe releases will only support input layers and not input fields.")
    if net_needs_batchnorm_upgrade(net):
        messages.append("Attempting to upgrade batch norm layers using deprecated params: %s" % source)
        upgrade_net_batchnorm(net)
        messages.append("Successfully upgraded batch norm layers using deprecated params.")
    return ok, messages


# ------------------------------------------------------------------------------------------------ solvers

_SOLVER_TYPES = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad", "RMSPROP": "RMSProp",
                 "ADADELTA": "AdaDelta", "ADAM": "Adam"}


def solver_needs_upgrade(solver):
    """SolverNeedsTypeUpgrade: the legacy `solver_type` enum is set."""
    return solver.HasField("solver_type")


def upgrade_solver_type(solver):
    """UpgradeSolverType: solver_type enum -> type string (both set: refused, as Caffe's CHECK)."""
    if solver.HasField("solver_type") and solver.HasField("type"):
        raise UpgradeError("Failed to upgrade solver: old solver_type field (enum) and new type field (string) "
                           "cannot be both specified in solver proto text.")
    enum_name = caffe_pb2.SolverParameter.SolverType.Name(solver.solver_type)
    solver.type = _SOLVER_TYPES[enum_name]
    solver.ClearField("solver_type")


def upgrade_solver(solver, source="<solver>", nested_nets=True):
    """UpgradeSolverAsNeeded on `solver` in place, plus (when nested_nets, a deliberate improvement over
    Caffe) upgrade_net on net_param, train_net_param and every test_net_param. Returns (ok, messages)."""
    messages = []
    ok = True
    if solver_needs_upgrade(solver):
        messages.append("Attempting to upgrade input file specified using deprecated 'solver_type' field (enum)': %s"
                        % source)
        upgrade_solver_type(solver)
        messages.append("Successfully upgraded file specified using deprecated 'solver_type' field (enum) to "
                        "'type' field (string).")
        messages.append("Note that future Caffe releases will only support 'type' field (string) for a solver's "
                        "type.")
    if nested_nets:
        nested = [(name, getattr(solver, name)) for name in ("net_param", "train_net_param") if solver.HasField(name)]
        nested += [("test_net_param[%d]" % i, net) for i, net in enumerate(solver.test_net_param)]
        for name, net in nested:
            if net_needs_upgrade(net):
                net_ok, net_messages = upgrade_net(net, "%s (%s)" % (source, name))
                ok &= net_ok
                messages.extend(net_messages)
    return ok, messages


def _split_extension(filename):
    """boost::filesystem (v3) stem/extension split of a file name: the extension starts at the last dot."""
    if filename in (".", ".."):
        return filename, ""
    dot = filename.rfind(".")
    return (filename, "") if dot < 0 else (filename[:dot], filename[dot:])


def default_snapshot_prefix(solver, solver_path):
    """UpgradeSnapshotPrefixProperty (upgrade_proto.cpp): applied by ReadSolverParamsFromTextFileOrDie.

    Unset snapshot_prefix -> the solver file's path without its extension; a prefix naming an existing
    directory -> that directory / the solver file's stem. Sets solver.snapshot_prefix in place and returns it.
    """
    solver_path = str(solver_path)
    stem, extension = _split_extension(os.path.basename(solver_path))
    if not solver.HasField("snapshot_prefix"):
        solver.snapshot_prefix = solver_path[:len(solver_path) - len(extension)]   # replace_extension()
    elif os.path.isdir(solver.snapshot_prefix):
        solver.snapshot_prefix = os.path.join(solver.snapshot_prefix, stem)
    return solver.snapshot_prefix
