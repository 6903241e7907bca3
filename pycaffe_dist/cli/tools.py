"""The verbs that look at nets and the machine: net-info, draw, upgrade, device-query."""
import os
import sys
import time

from ..errors import DeviceError
from . import arguments


def cmd_net_info(args):
    from ..io.caffemodel import load_weights
    from ..io.load import read_net
    from ..net.info import format_table
    from ..net.net import Net
    from ..proto import caffe_pb2
    start = time.perf_counter()
    # a pipeline cuts the net it trains: the TRAIN one
    phase = caffe_pb2.TRAIN if args.pipeline is not None else args.phase
    net = Net(read_net(args.net), phase=phase, level=args.level, stages=args.stage,
              fill_params=bool(args.weights))
    if args.weights:
        load_weights(net, args.weights)
    elapsed = time.perf_counter() - start
    cut = None
    if args.pipeline is not None:
        from ..net.partition import format_partition, partition
        cut = format_partition(net, partition(net, args.pipeline))     # an impossible cut: its line alone
    print(format_table(net))
    if cut is not None:
        print(cut)
    print("built in %.3f s" % elapsed)
    return 0


def _nested_nets(solver):
    nets = [solver.net_param] if solver.HasField("net_param") else []
    nets += [solver.train_net_param] if solver.HasField("train_net_param") else []
    return nets + list(solver.test_net_param)


def cmd_upgrade(args):
    from ..io import upgrade
    from ..io.prototxt import read_text, write_text
    from ..proto import caffe_pb2
    from ..proto.binary import read_binary, write_binary
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
        return arguments.EXIT_ERROR
    return 0


def cmd_device_query(args):
    """The machine this build computes on: the CPU, its threads and BLAS; then each GPU, or why there is none."""
    import platform
    from threadpoolctl import threadpool_info
    from .. import common
    from ..backend import kernel_source
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), model)
    except OSError:
        pass
    print("CPU: %s" % model)
    print("Logical cores: %d" % (os.cpu_count() or 1))
    print("Threads used (--threads): %d" % common.num_threads())
    for lib in threadpool_info():
        print("%s: %s %s, %d threads (%s)" % (lib["user_api"].upper(), lib["internal_api"], lib.get("version") or "",
                                              lib["num_threads"], lib["filepath"]))
    fatbins = sorted(kernel_source.BUILD_DIR.glob("*.fatbin"))
    print("CUDA kernels: %s" % ("%d fatbins in %s" % (len(fatbins), kernel_source.BUILD_DIR) if fatbins else
                                "not built (the package was built without nvcc)"))
    try:
        from ..backend.cuda import CudaDevice, device_count
        for index in range(device_count()):
            print("GPU %d:" % index)
            for key, value in CudaDevice(index).describe().items():
                print("  %s: %s" % (key, value))
        if device_count() == 0:
            print("GPU: none (the CUDA driver sees no GPU); training runs on the CPU")
    except DeviceError as exc:
        print("GPU: none (%s); training runs on the CPU" % exc)
    return 0


def cmd_draw(args):
    """Caffe's python/draw_net.py: the net (any format version, upgraded) as a picture in the output's format."""
    from ..draw import draw_net_to_file
    from ..io.load import read_net
    net = read_net(args.net)
    phase = None if args.phase == "ALL" else arguments.phase(args.phase)
    draw_net_to_file(net, args.output, args.rankdir, phase, args.display_lrm)
    print("%s: drawn into %s" % (args.net, args.output))
    return 0


def add_verbs(verbs):
    p = verbs.add_parser("net-info", help="build a net and print its layers, shapes, parameters and FLOPs")
    p.add_argument("net", help="net prototxt (any format version)")
    p.add_argument("--phase", type=arguments.phase, default=arguments.phase("TEST"),
                   help="TRAIN or TEST (default TEST)")
    arguments.add_net_state(p)
    p.add_argument("--weights", help=".caffemodel to load (checks that its blob shapes fit)")
    p.add_argument("--pipeline", type=int, metavar="K", help="also cut the TRAIN net (then the one shown) into K "
                   "stages as `train --pipeline K` does: each layer's stage, FLOPs per stage, bytes across each cut")
    p.set_defaults(func=cmd_net_info)

    p = verbs.add_parser("draw", help="draw a net's graph into a PNG, SVG, PDF, ... (Caffe's draw_net.py; needs "
                         "pydot and Graphviz)")
    p.add_argument("net", help="net prototxt (any format version)")
    p.add_argument("output", help="picture file; its extension is the format (.png, .svg, .pdf; .raw: dot's text)")
    p.add_argument("--rankdir", choices=("LR", "TB", "BT", "RL"), default="LR",
                   help="direction of the layout: LR (default, left to right), TB, BT or RL")
    p.add_argument("--phase", choices=("TRAIN", "TEST", "ALL"), type=str.upper, default="ALL",
                   help="draw only the layers of this phase (default ALL)")
    p.add_argument("--display-lrm", action="store_true", help="show the learning layers' lr_mult")
    p.set_defaults(func=cmd_draw)

    p = verbs.add_parser("device-query", help="show the CPU and the GPUs this build can compute on, or why none")
    p.set_defaults(func=cmd_device_query)

    p = verbs.add_parser("upgrade", help="upgrade a V0/V1 net (text or .caffemodel) or a legacy solver")
    p.add_argument("--solver", action="store_true", help="the input is a solver prototxt")
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_upgrade)
