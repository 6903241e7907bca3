"""The verb that writes a trained net in another format: export-onnx (a deploy prototxt and its .caffemodel as an
ONNX model, checked in onnxruntime against our own forward with --check)."""
import argparse
import os
import sys
import time


def input_shape(value):
    """--input-shape NAME=D1,D2,... (or D1,D2,... for a net with one input) -> (name or None, shape)."""
    name, _, dims = value.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("input shape must be NAME=D1,D2,... or D1,D2,... (integers), not %r"
                                         % value) from None
    if not shape or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError("input shape %r must have positive dimensions" % value)
    return name or None, shape


def _shapes(net_inputs, overrides, model):
    """{input: shape} from the --input-shape options; an unnamed one needs a net with one input."""
    from ..errors import ExportError
    shapes = {}
    for name, shape in overrides:
        if name is None:
            if len(net_inputs) != 1:
                raise ExportError("%s: the net has %d inputs (%s): name the one to reshape, --input-shape NAME=%s"
                                  % (model, len(net_inputs), ", ".join(net_inputs) or "none",
                                     ",".join(map(str, shape))))
            name = net_inputs[0]
        shapes[name] = shape
    return shapes


def _describe(values):
    return ", ".join("%s %s" % (v.name, tuple(d.dim_value for d in v.type.tensor_type.shape.dim)) for v in values)


def _step(what):
    print("export-onnx: %s ..." % what, file=sys.stderr, flush=True)


def cmd_export_onnx(args):
    from ..errors import ExportError
    from ..export import onnx_check, onnx_graph
    # Each step of a big net (VGG: half a gigabyte of weights) takes seconds: say which one is running.
    start = time.perf_counter()
    _step("loading %s with %s" % (args.model, args.weights))
    net = onnx_graph.load_net(args.model, args.weights)
    onnx_graph.reshape_inputs(net, _shapes(net.inputs, args.input_shape, args.model))
    _step("building the ONNX graph of %d layers and writing %s" % (len(net.layers), args.output))
    model = onnx_graph.to_onnx(net, args.output, opset=args.opset)
    size = os.path.getsize(args.output)
    print("wrote %s: %d nodes, %d weight tensors, %.1f MB, opset %d (%.1f s)"
          % (args.output, len(model.graph.node), len(model.graph.initializer), size / 1e6, args.opset,
             time.perf_counter() - start), file=sys.stderr)
    print("inputs: %s; outputs: %s" % (_describe(model.graph.input), _describe(model.graph.output)), file=sys.stderr)
    if not args.check:
        return 0
    start = time.perf_counter()
    _step("checking: a random input through onnxruntime and through our forward")
    differences = onnx_check.compare(net, model, seed=args.seed)
    for name, difference in differences.items():
        print("check: output %s: max relative difference %.3g (onnxruntime vs our forward)" % (name, difference))
    print("checked in %.1f s" % (time.perf_counter() - start), file=sys.stderr)
    worst = max(differences, key=differences.get)
    if differences[worst] > args.tolerance:
        raise ExportError("%s: output '%s' of the exported model differs from our forward by %.3g (tolerance %g); "
                          "the model was written anyway" % (args.output, worst, differences[worst], args.tolerance))
    return 0


def add_verbs(verbs):
    from ..export.onnx_check import TOLERANCE
    from ..export.onnx_graph import DEFAULT_OPSET, MIN_OPSET
    p = verbs.add_parser("export-onnx", help="write a trained net (deploy prototxt + .caffemodel) as an ONNX model")
    p.add_argument("--model", required=True, help="deploy net prototxt (Input layers; built for the TEST phase)")
    p.add_argument("--weights", required=True, help="trained weights (.caffemodel or HDF5)")
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write (replaced only on success)")
    p.add_argument("--input-shape", type=input_shape, action="append", default=[], metavar="[NAME=]D1,D2,...",
                   help="export with this input shape instead of the prototxt's (repeatable; e.g. data=1,3,224,224)")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                   help="ONNX opset version (default %d, at least %d)" % (DEFAULT_OPSET, MIN_OPSET))
    p.add_argument("--check", action="store_true", help="run the model in onnxruntime on a random input and print "
                   "each output's max difference from our forward, relative to the output's largest magnitude")
    p.add_argument("--tolerance", type=float, default=TOLERANCE,
                   help="with --check: the largest relative difference accepted (default %g)" % TOLERANCE)
    p.add_argument("--seed", type=int, default=0, help="with --check: seed of the random input (default 0)")
    p.set_defaults(func=cmd_export_onnx)
