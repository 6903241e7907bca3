"""`dist_caffe`: the command line. Every verb's errors reach the user as one line and a non-zero exit code."""
import argparse
import logging
import sys
import time

from .errors import PycaffeDistError

EXIT_ERROR, EXIT_INTERNAL = 1, 70


def _phase(value):
    from .proto import caffe_pb2
    try:
        return {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST}[value.upper()]
    except KeyError:
        raise argparse.ArgumentTypeError("phase must be TRAIN or TEST, not %r" % value) from None


def cmd_net_info(args):
    from .io.load import read_net
    from .net.info import format_table
    from .net.net import Net
    start = time.perf_counter()
    net = Net(read_net(args.net), phase=args.phase, level=args.level, stages=args.stage,
              fill_params=bool(args.weights))
    if args.weights:
        from .io.binaryproto import read_net_binary
        net.copy_trained_layers_from(read_net_binary(args.weights), args.weights)
    elapsed = time.perf_counter() - start
    print(format_table(net))
    print("built in %.3f s" % elapsed)
    return 0


def cmd_upgrade(args):
    from .io import upgrade
    from .io.binaryproto import read_binary, write_binary
    from .io.prototxt import read_text, write_text
    from .proto import caffe_pb2
    binary = args.input.endswith((".caffemodel", ".binaryproto"))
    if args.solver:
        message = read_text(args.input, caffe_pb2.SolverParameter())
        needed = upgrade.solver_needs_upgrade(message) or any(
            upgrade.net_needs_upgrade(n) for n in _nested_nets(message))
        ok, messages = upgrade.upgrade_solver(message, source=args.input, nested_nets=True)
    else:
        message = caffe_pb2.NetParameter()
        (read_binary if binary else read_text)(args.input, message)
        needed = upgrade.net_needs_upgrade(message)
        ok, messages = upgrade.upgrade_net(message, args.input) if needed else (True, [])
    for line in messages:
        print(line, file=sys.stderr)
    if not needed:
        print("%s: file already in latest proto format" % args.input, file=sys.stderr)
    (write_binary if binary and not args.solver else write_text)(args.output, message)
    print("wrote upgraded %s to %s" % ("SolverParameter" if args.solver else "NetParameter", args.output),
          file=sys.stderr)
    if not ok:
        print("dist_caffe: error: %s: the upgrade reported errors (see above); the output was written anyway"
              % args.input, file=sys.stderr)
        return EXIT_ERROR
    return 0


def cmd_time(args):
    """Caffe's `caffe time`: per-layer forward/backward timings of a net (inputs as built: zeros, or data)."""
    from . import common
    from .io.load import read_net
    from .net.net import Net
    from .net.timing import format_timings, plot_timings, time_net
    if args.threads:
        common.set_num_threads(args.threads)
    if args.iterations < 1:
        raise PycaffeDistError("--iterations must be at least 1, got %d" % args.iterations)
    net = Net(read_net(args.model), phase=args.phase, level=args.level, stages=args.stage)
    if args.weights:
        from .io.binaryproto import read_net_binary
        net.copy_trained_layers_from(read_net_binary(args.weights), args.weights)
    print("Testing for %d iterations." % args.iterations)

    def progress(it, ms):
        print("Iteration: %d forward-backward time: %.2f ms." % (it, ms), flush=True)
    result = time_net(net, args.iterations, progress)
    print("Initial loss: %g" % result["initial_loss"])
    print(format_timings(result))
    if args.plot:
        plot_timings(result, args.plot)
        print("wrote %s" % args.plot)
    return 0


def _nested_nets(solver):
    nets = [solver.net_param] if solver.HasField("net_param") else []
    nets += [solver.train_net_param] if solver.HasField("train_net_param") else []
    return nets + list(solver.test_net_param)


def build_parser():
    parser = argparse.ArgumentParser(prog="dist_caffe", description="Caffe-compatible training, on one machine or "
                                     "many (a Redis parameter server).")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and notices at INFO level")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks of internal errors")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    p = verbs.add_parser("net-info", help="build a net and print its layers, shapes, parameters and FLOPs")
    p.add_argument("net", help="net prototxt (any format version)")
    p.add_argument("--phase", type=_phase, default=_phase("TEST"), help="TRAIN or TEST (default TEST)")
    p.add_argument("--level", type=int, default=0)
    p.add_argument("--stage", action="append", default=[], help="a NetState stage (repeatable)")
    p.add_argument("--weights", help=".caffemodel to load (checks that its blob shapes fit)")
    p.set_defaults(func=cmd_net_info)

    p = verbs.add_parser("time", help="time a net's forward and backward passes, layer by layer (caffe time)")
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--iterations", type=int, default=50, help="timed iterations (default 50)")
    p.add_argument("--phase", type=_phase, default=_phase("TRAIN"), help="TRAIN (default) or TEST")
    p.add_argument("--level", type=int, default=0)
    p.add_argument("--stage", action="append", default=[], help="a NetState stage (repeatable)")
    p.add_argument("--weights", help=".caffemodel to load first")
    p.add_argument("--threads", type=int, help="CPU threads (BLAS and kernels); default: all cores")
    p.add_argument("--plot", help="also draw the per-layer times into this PNG")
    p.set_defaults(func=cmd_time)

    p = verbs.add_parser("upgrade", help="upgrade a V0/V1 net (text or .caffemodel) or a legacy solver")
    p.add_argument("--solver", action="store_true", help="the input is a solver prototxt")
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_upgrade)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="dist_caffe: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except PycaffeDistError as exc:
        print("dist_caffe: error: %s" % exc, file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("dist_caffe: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:   # a bug of ours: still one line, unless --debug asks for the traceback
        if args.debug:
            raise
        print("dist_caffe: internal error: %s: %s (rerun with --debug for the traceback)"
              % (type(exc).__name__, exc), file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
