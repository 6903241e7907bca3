"""`dist_caffe`: the command line. Every verb's errors reach the user as one line and a non-zero exit code."""
import argparse
import logging
import os
import sys
import time

from .backend import select
from .data import commands as data_commands
from .errors import PycaffeDistError

EXIT_ERROR, EXIT_INTERNAL = 1, 70
MODE_NAMES = ("sync", "async", "partial-sync", "weed-out", "easgd", "gradient-only")


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
        from .io.caffemodel import load_weights
        load_weights(net, args.weights)
    elapsed = time.perf_counter() - start
    print(format_table(net))
    print("built in %.3f s" % elapsed)
    return 0


def cmd_upgrade(args):
    from .io import upgrade
    from .proto.binary import read_binary, write_binary
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
    select.choose(args.gpu)
    if args.iterations < 1:
        raise PycaffeDistError("--iterations must be at least 1, got %d" % args.iterations)
    net = Net(read_net(args.model), phase=args.phase, level=args.level, stages=args.stage)
    if args.weights:
        from .io.caffemodel import load_weights
        load_weights(net, args.weights)
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


SIGNAL_EFFECTS = ("stop", "snapshot", "none")


class SignalActions:
    """Caffe's SignalHandler: SIGINT and SIGHUP become solver actions (stop, snapshot or none), each signal
    reported once to the solver, which polls after every update and before every test batch. "snapshot"
    writes a snapshot and trains on, as Caffe does; "stop" ends training after the current iteration (then
    Solve's snapshot_after_train writes the final snapshot)."""

    def __init__(self, sigint_effect, sighup_effect):
        import signal
        self.effects = {signal.SIGINT: sigint_effect, signal.SIGHUP: sighup_effect}
        self.pending = []
        for number in self.effects:
            signal.signal(number, self._handle)

    def _handle(self, number, frame):
        self.pending.append(self.effects[number])

    def __call__(self):
        from .solver.solver import NONE
        while self.pending:
            effect = self.pending.pop(0)
            if effect != "none":
                return effect
        return NONE


def cmd_train(args):
    """Caffe's `caffe train`: finetune from --weights or resume from --snapshot; Caffe's log lines on stderr (and
    in --log); on a terminal, a progress line under them."""
    from . import common
    from .io.load import read_solver
    from .solver import training_log
    from .solver.solver import Solver, images_per_iteration
    gpus = select.parse_gpus(args.gpu)
    if len(gpus) > 1 and args.workers is None:
        # Several GPUs train one net as Caffe's multi-GPU training does: synchronously, one worker per GPU.
        args.workers, args.mode = len(gpus), args.mode or "sync"
    if args.workers is not None or args.mode is not None or args.redis is not None:
        if args.workers is None:
            raise PycaffeDistError("--mode and --redis train on workers: give --workers N")
        args.mode = args.mode or "async"
        return cmd_train_distributed(args)
    if args.snapshot and args.weights:
        raise PycaffeDistError("give a snapshot to resume training or weights to finetune but not both")
    if args.threads:
        common.set_num_threads(args.threads)
    logger = logging.getLogger("pycaffe_dist")
    terminal = training_log.attach(logger, args.log)
    actions = SignalActions(args.sigint_effect, args.sighup_effect)
    param = read_solver(args.solver)
    param.train_state.level = args.level
    param.train_state.stage.extend(args.stage)
    if args.iterations is not None:
        param.max_iter = args.iterations
    if args.snapshot or args.weights:
        param.ClearField("weights")
    if args.weights:
        param.weights.append(args.weights)
    log = logging.getLogger("pycaffe_dist.cli")
    select.choose(args.gpu, param)
    solver = Solver(param)
    solver.set_action_function(actions)
    if terminal is not None:
        solver.iteration_hooks.append(training_log.Progress(terminal, images_per_iteration(solver), param.max_iter))
    if args.snapshot:
        log.info("Resuming from %s", args.snapshot)
        solver.restore(args.snapshot)
    log.info("Starting Optimization")
    try:
        solver.solve()
    finally:
        if terminal is not None:
            terminal.finish()
    log.info("Optimization Done.")
    return 0


def _mode_options(args):
    return {"tau": args.tau, "factor": args.factor, "max_advance": args.max_advance, "weedout": args.weedout,
            "moving_rate": args.moving_rate, "overlap": args.overlap}


def cmd_train_distributed(args):
    """`train --workers N`: a private redis-server (or --redis), the master and N workers on this machine."""
    from .distributed import launch
    from .solver import training_log
    if args.snapshot and args.weights:
        raise PycaffeDistError("give a snapshot to resume training or weights to finetune but not both")
    if args.workers < 1:
        raise PycaffeDistError("--workers must be at least 1, got %d" % args.workers)
    master = ["--solver", args.solver, "--workers", str(args.workers), "--mode", args.mode,
              "--heartbeat", str(args.heartbeat)]
    for flag, value in (("--tau", args.tau), ("--factor", args.factor), ("--max-advance", args.max_advance),
                        ("--weedout", args.weedout), ("--moving-rate", args.moving_rate),
                        ("--iterations", args.iterations), ("--snapshot", args.snapshot), ("--weights", args.weights),
                        ("--log", args.log), ("--stats", args.stats)):
        if value is not None:
            master += [flag, str(value)]
    if args.keep:
        master.append("--keep")
    if args.overlap is not None:
        master.append("--overlap" if args.overlap else "--no-overlap")
    handler = training_log.TerminalHandler(sys.stderr) if sys.stderr.isatty() else None
    sink = handler.write_line if handler is not None else (lambda line: print(line, file=sys.stderr, flush=True))
    progress = training_log.DistributedProgress(handler) if handler is not None else None
    try:
        code = launch.run_local(master, args.workers, redis_url=args.redis, worker_threads=args.threads or 1,
                                job=args.job, progress=progress, sink=sink, gpus=select.parse_gpus(args.gpu))
    finally:
        if handler is not None:
            handler.finish()
    if code == 130:
        print("dist_caffe: interrupted: stopped the master and the workers", file=sys.stderr)
    elif code:
        raise PycaffeDistError("the master exited with status %d (see its log lines above)" % code)
    return code


def cmd_master(args):
    """The master of a distributed job: publishes it on Redis, merges the workers' results, tests, snapshots."""
    from .distributed.master import Master
    from .solver import training_log
    if not args.resume and not args.solver:
        raise PycaffeDistError("master needs --solver (or --resume with --job)")
    training_log.attach(logging.getLogger("pycaffe_dist"), args.log)
    master = Master(args.redis, args.solver, args.mode, _mode_options(args), args.workers, job=args.job,
                    resume=args.resume, snapshot=args.snapshot, weights=args.weights, threads=args.threads or 1,
                    heartbeat_s=args.heartbeat, join_timeout_s=args.join_timeout, keep=args.keep,
                    max_iter=args.iterations, stats_path=args.stats, retry_s=args.redis_retry)
    from .distributed.store import describe
    print("job %s on %s" % (master.job, describe(master.store.urls[0])), file=sys.stderr, flush=True)
    master.run()
    return 0


def cmd_worker(args):
    """A worker of a distributed job: everything it needs comes from Redis, but the data paths."""
    from .distributed.worker import Worker
    from .solver import training_log
    training_log.attach(logging.getLogger("pycaffe_dist.distributed"))
    logging.getLogger("pycaffe_dist.solver").setLevel(logging.WARNING)
    if select.choose(args.gpu) is not None:
        print("computing on GPU %s: %s" % (args.gpu, select.current().name), file=sys.stderr, flush=True)
    worker = Worker(args.redis, args.job, threads=args.threads or 1, master_timeout_s=args.master_timeout,
                    wait_for_job_s=args.wait, worker_id=args.id, retry_s=args.redis_retry)
    stats = worker.run()
    print("worker %s: %d rounds, %d images" % (worker.id, stats["rounds"], stats["images"]), file=sys.stderr)
    return 0


def cmd_status(args):
    """A distributed job's members, rates, global iteration, last test and snapshots, read from Redis."""
    from .distributed.status import show
    print(show(args.redis, args.job, as_json=args.json, remove=args.remove))
    return 0


def _add_mode_options(p):
    p.add_argument("--tau", type=int, help="local solver steps per round (default 1)")
    p.add_argument("--factor", type=float, help="async: W += delta / FACTOR (default 1)")
    p.add_argument("--max-advance", type=int, help="partial-sync: rounds a worker may run ahead of the slowest "
                   "(default 1)")
    p.add_argument("--weedout", type=int, help="weed-out: merge a result only if its worker is among the last N "
                   "to report")
    p.add_argument("--moving-rate", type=float, help="easgd: the elastic moving rate alpha (default 0.5)")
    overlap = p.add_mutually_exclusive_group()
    overlap.add_argument("--overlap", dest="overlap", action="store_true", default=None,
                         help="workers compute their next round while the last result travels (the default, but "
                         "in gradient-only)")
    overlap.add_argument("--no-overlap", dest="overlap", action="store_false",
                         help="workers wait for each reply before their next round (SpeeDO's schedule)")
    p.add_argument("--heartbeat", type=float, default=5.0, help="seconds without a heartbeat after which a worker "
                   "counts as gone (default 5)")


def cmd_test(args):
    """Caffe's `caffe test`: score a trained net for --iterations batches; per-batch and mean outputs."""
    import numpy as np
    from .pycaffe import TEST, Net
    from .solver import training_log
    from .io.caffemodel import load_weights
    from .solver.solver import output_values
    training_log.attach(logging.getLogger("pycaffe_dist"))
    log = logging.getLogger("pycaffe_dist.cli")
    if args.iterations < 1:
        raise PycaffeDistError("--iterations must be at least 1, got %d" % args.iterations)
    if args.threads:
        from . import common
        common.set_num_threads(args.threads)
    select.choose(args.gpu)
    net = Net(args.model, TEST, level=args.level, stages=args.stage)
    load_weights(net, args.weights)
    log.info("Running for %d iterations.", args.iterations)
    scores, outputs, loss = None, [], np.float32(0)
    for i in range(args.iterations):
        loss += np.float32(net.forward_from_to())
        outputs = list(output_values(net))
        for _, name, value, _ in outputs:
            log.info("Batch %d, %s = %g", i, name, value)
        values = np.array([o[2] for o in outputs], dtype=np.float32)
        scores = values if scores is None else scores + values
    log.info("Loss: %g", loss / np.float32(args.iterations))
    for (_, name, _, weight), total in zip(outputs, scores if scores is not None else []):
        mean = total / np.float32(args.iterations)
        note = " (* %g = %g loss)" % (weight, np.float32(weight * mean)) if weight else ""
        log.info("%s = %g%s", name, mean, note)
    return 0


def cmd_plot(args):
    """Plot a Caffe-format training log: loss and test outputs against iterations (and seconds)."""
    from .solver import training_log
    parsed = training_log.parse_log(args.log)
    if not parsed["train"] and not parsed["test"]:
        raise PycaffeDistError("%s: no training loss or test output lines found (is it a Caffe training log?)"
                               % args.log)
    out = args.output or training_log.default_plot_path(args.log)
    training_log.plot_log(parsed, out, title=os.path.basename(args.log))
    if parsed["train"]:
        it, _, loss = parsed["train"][-1]
        print("last train loss: %g (iteration %d)" % (loss, it))
    for net_id, name in sorted({(t[2], t[3]) for t in parsed["test"]}):
        it, _, _, _, value = [t for t in parsed["test"] if (t[2], t[3]) == (net_id, name)][-1]
        print("last test #%d %s: %g (iteration %d)" % (net_id, name, value, it))
    print("wrote %s" % out)
    return 0


def cmd_device_query(args):
    """The machine this build computes on: the CPU, its threads and BLAS; then each GPU, or why there is none."""
    import platform
    from threadpoolctl import threadpool_info
    from . import common
    from .backend import kernel_source
    from .errors import DeviceError
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
        from .backend.cuda import CudaDevice, device_count
        for index in range(device_count()):
            print("GPU %d:" % index)
            for key, value in CudaDevice(index).describe().items():
                print("  %s: %s" % (key, value))
        if device_count() == 0:
            print("GPU: none (the CUDA driver sees no GPU); training runs on the CPU")
    except DeviceError as exc:
        print("GPU: none (%s); training runs on the CPU" % exc)
    return 0


def _signal_effect(value):
    if value not in SIGNAL_EFFECTS:
        raise argparse.ArgumentTypeError("invalid signal effect %r: use stop, snapshot or none" % value)
    return value


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
    p.add_argument("--gpu", help="time on this GPU id (default: the CPU)")
    p.set_defaults(func=cmd_time)

    p = verbs.add_parser("train", help="train a net with a solver (caffe train)")
    p.add_argument("--solver", required=True, help="solver prototxt")
    p.add_argument("--snapshot", help=".solverstate (or .solverstate.h5) to resume from")
    p.add_argument("--weights", help="pretrained .caffemodel(s) to finetune from, comma-separated")
    p.add_argument("--iterations", type=int, help="train to this iteration (overrides the solver's max_iter)")
    p.add_argument("--level", type=int, default=0, help="train_state level")
    p.add_argument("--stage", action="append", default=[], help="a train_state stage (repeatable)")
    p.add_argument("--threads", type=int, help="CPU threads (BLAS and kernels); default: all cores (with --workers: "
                   "threads of each worker, default 1)")
    p.add_argument("--sigint_effect", type=_signal_effect, default="stop",
                   help="on SIGINT (Ctrl-C): stop (default; snapshot_after_train still snapshots), snapshot "
                        "(and train on) or none")
    p.add_argument("--sighup_effect", type=_signal_effect, default="snapshot",
                   help="on SIGHUP: snapshot (default), stop or none")
    p.add_argument("--log", help="also write the log lines to this file")
    p.add_argument("--gpu", help="GPU id(s): N, N,M,... or all (default: the solver's solver_mode and device_id; "
                   "a solver's GPU mode falls back to the CPU with a warning where there is no GPU, --gpu does not). "
                   "Several GPUs train synchronously, one worker each; with --workers, workers take them in turn")
    p.add_argument("--workers", type=int, help="train on N worker processes that meet at a Redis parameter store "
                   "(a private redis-server unless --redis is given)")
    p.add_argument("--mode", choices=MODE_NAMES, help="distributed mode (default async)")
    p.add_argument("--redis", help="Redis URL(s) to use instead of a private server (comma-separated: blobs are "
                   "sharded over them)")
    p.add_argument("--job", help="distributed job id (default: generated)")
    p.add_argument("--keep", action="store_true", help="keep the job's keys on Redis at the end")
    p.add_argument("--stats", help="distributed: write the master's summary (rates, tests) to this JSON file")
    _add_mode_options(p)
    p.set_defaults(func=cmd_train)

    p = verbs.add_parser("master", help="the master of a distributed job on Redis")
    p.add_argument("--solver", help="solver prototxt")
    p.add_argument("--workers", type=int, default=1, help="workers to wait for before starting (default 1)")
    p.add_argument("--mode", choices=MODE_NAMES, default="async", help="distributed mode (default async)")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis URL(s), comma-separated to shard")
    p.add_argument("--job", help="job id (default: generated from the solver's name)")
    p.add_argument("--resume", action="store_true", help="continue the job --job from its state on Redis")
    p.add_argument("--snapshot", help=".solverstate to start from (weights, merge count, history)")
    p.add_argument("--weights", help=".caffemodel to start the weights from")
    p.add_argument("--iterations", type=int, help="merges to run (overrides the solver's max_iter)")
    p.add_argument("--threads", type=int, help="CPU threads of the master (tests; default 1)")
    p.add_argument("--join-timeout", type=float, default=300.0, help="seconds to wait for the workers before "
                   "starting with those there (default 300)")
    p.add_argument("--keep", action="store_true", help="keep the job's keys on Redis at the end")
    p.add_argument("--stats", help="write a summary (rates, tests) to this JSON file")
    p.add_argument("--log", help="also write the log lines to this file")
    p.add_argument("--redis-retry", type=float, default=30.0, help="seconds to retry an unreachable Redis before "
                   "giving up (default 30)")
    _add_mode_options(p)
    p.set_defaults(func=cmd_master)

    p = verbs.add_parser("worker", help="a worker of a distributed job on Redis")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis URL(s), as the master's")
    p.add_argument("--job", help="job id (default: the only job on the server)")
    p.add_argument("--threads", type=int, help="CPU threads (default 1)")
    p.add_argument("--master-timeout", type=float, default=120.0, help="seconds without the master before giving "
                   "up (default 120)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the job to be published "
                   "(default 60)")
    p.add_argument("--id", type=int, help="this worker's id (default: the next free one)")
    p.add_argument("--gpu", help="compute on this GPU id (default: the CPU)")
    p.add_argument("--redis-retry", type=float, default=30.0, help="seconds to retry an unreachable Redis before "
                   "giving up (default 30)")
    p.set_defaults(func=cmd_worker)

    p = verbs.add_parser("status", help="a distributed job's workers, rates, iteration, last test and snapshots")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis URL(s)")
    p.add_argument("--job", help="the job (default: every job on the server)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--remove", action="store_true", help="then delete the job's keys (after a job that did not end "
                   "cleanly)")
    p.set_defaults(func=cmd_status)

    p = verbs.add_parser("test", help="score a trained net on its TEST phase (caffe test)")
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--weights", required=True, help=".caffemodel (or .caffemodel.h5)")
    p.add_argument("--iterations", type=int, default=50, help="batches to score (default 50)")
    p.add_argument("--level", type=int, default=0)
    p.add_argument("--stage", action="append", default=[], help="a NetState stage (repeatable)")
    p.add_argument("--threads", type=int, help="CPU threads (BLAS and kernels); default: all cores")
    p.add_argument("--gpu", help="score on this GPU id (default: the CPU)")
    p.set_defaults(func=cmd_test)

    p = verbs.add_parser("plot", help="plot loss and test accuracy of a Caffe-format training log")
    p.add_argument("log", help="training log (ours, or Caffe's)")
    p.add_argument("-o", "--output", help="PNG to write (default: the log's name with .png)")
    p.set_defaults(func=cmd_plot)

    p = verbs.add_parser("device-query", help="show the CPU and the GPUs this build can compute on, or why none")
    p.set_defaults(func=cmd_device_query)

    p = verbs.add_parser("upgrade", help="upgrade a V0/V1 net (text or .caffemodel) or a legacy solver")
    p.add_argument("--solver", action="store_true", help="the input is a solver prototxt")
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_upgrade)
    data_commands.add_verbs(verbs)
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
