"""The verbs of Caffe's `caffe` tool: train (on one process; with --workers, distributed.py's launcher), test,
time, and plot of a training log."""
import argparse
import logging
import os
import signal

from ..backend import select
from ..errors import PycaffeDistError
from ..metrics import flags as metrics_flags
from . import allreduce, arguments, distributed, job_kinds, sandblaster

SIGNAL_EFFECTS = ("stop", "snapshot", "none")


class SignalActions:
    """Caffe's SignalHandler: SIGINT and SIGHUP become solver actions (stop, snapshot or none), each signal
    reported once to the solver, which polls after every update and before every test batch. "snapshot"
    writes a snapshot and trains on, as Caffe does; "stop" ends training after the current iteration (then
    Solve's snapshot_after_train writes the final snapshot)."""

    def __init__(self, sigint_effect, sighup_effect):
        self.effects = {signal.SIGINT: sigint_effect, signal.SIGHUP: sighup_effect}
        self.pending = []
        for number in self.effects:
            signal.signal(number, self._handle)

    def _handle(self, number, frame):
        self.pending.append(self.effects[number])

    def __call__(self):
        from ..solver.solver import NONE
        while self.pending:
            effect = self.pending.pop(0)
            if effect != "none":
                return effect
        return NONE


def _signal_effect(value):
    if value not in SIGNAL_EFFECTS:
        raise argparse.ArgumentTypeError("invalid signal effect %r: use stop, snapshot or none" % value)
    return value


def cmd_train(args):
    """Caffe's `caffe train`: finetune from --weights or resume from --snapshot; Caffe's log lines on stderr (and
    in --log); on a terminal, a progress line under them. --workers (or several GPUs) trains distributed.
    --tensorboard and --metrics-port watch it (metrics/flags.py)."""
    from .. import common
    from ..io.load import read_solver
    from ..solver import training_log
    from ..solver.solver import Solver
    kind = job_kinds.choose(args)           # one line for a flag the kind chosen cannot take
    metrics_flags.check(args)               # (a missing package: one line before anything starts)
    if kind.run is not None:
        with metrics_flags.job_summary(args):
            return kind.run(args)
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
        solver.iteration_hooks.append(training_log.Progress(terminal, solver.images_per_iteration, param.max_iter))
    if args.snapshot:
        log.info("Resuming from %s", args.snapshot)
        solver.restore(args.snapshot)
    log.info("Starting Optimization")
    try:
        with metrics_flags.watching_solver(args, solver):
            solver.solve()
    finally:
        if terminal is not None:
            terminal.finish()
    log.info("Optimization Done.")
    return 0


def cmd_test(args):
    """Caffe's `caffe test`: score a trained net for --iterations batches; per-batch and mean outputs, scored by
    the Solver's own code (solver.score)."""
    from .. import common
    from ..io.caffemodel import load_weights
    from ..pycaffe import TEST, Net
    from ..solver import training_log
    from ..solver.solver import score
    training_log.attach(logging.getLogger("pycaffe_dist"))
    log = logging.getLogger("pycaffe_dist.cli")
    if args.iterations < 1:
        raise PycaffeDistError("--iterations must be at least 1, got %d" % args.iterations)
    if args.threads:
        common.set_num_threads(args.threads)
    select.choose(args.gpu)
    net = Net(args.model, TEST, level=args.level, stages=args.stage)
    load_weights(net, args.weights)
    log.info("Running for %d iterations.", args.iterations)

    def each_batch(i, outputs):
        for _, name, value, _ in outputs:
            log.info("Batch %d, %s = %g", i, name, value)
    loss, means = score(net, args.iterations, after_batch=each_batch)
    log.info("Loss: %g", loss)
    for _, name, mean, weight in means:
        log.info("%s = %g%s", name, mean, training_log.loss_note(weight, mean))
    return 0


def cmd_time(args):
    """Caffe's `caffe time`: per-layer forward/backward timings of a net (inputs as built: zeros, or data)."""
    from .. import common
    from ..io.caffemodel import load_weights
    from ..io.load import read_net
    from ..net.net import Net
    from ..net.timing import format_timings, plot_timings, time_net
    if args.threads:
        common.set_num_threads(args.threads)
    select.choose(args.gpu)
    if args.iterations < 1:
        raise PycaffeDistError("--iterations must be at least 1, got %d" % args.iterations)
    net = Net(read_net(args.model), phase=args.phase, level=args.level, stages=args.stage)
    if args.weights:
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


def cmd_plot(args):
    """Plot a Caffe-format training log: loss and test outputs against iterations (and seconds); with --csv, also
    Caffe's parse_log.py tables of it (metrics/log_csv.py)."""
    from ..solver import training_log
    if args.csv_dir is not None and not os.path.isdir(args.csv_dir):
        raise PycaffeDistError("--csv-dir %s: no such folder (the tables go into an existing one)" % args.csv_dir)
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
    if args.csv or args.csv_dir is not None:
        from ..metrics.log_csv import write_tables
        for path in write_tables(args.log, parsed, args.csv_dir):
            print("wrote %s" % path)
    return 0


def add_verbs(verbs):
    p = verbs.add_parser("time", help="time a net's forward and backward passes, layer by layer (caffe time)")
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--iterations", type=int, default=50, help="timed iterations (default 50)")
    p.add_argument("--phase", type=arguments.phase, default=arguments.phase("TRAIN"), help="TRAIN (default) or TEST")
    arguments.add_net_state(p)
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
    arguments.add_net_state(p, "train_state")
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
    distributed.add_train_flags(p)
    sandblaster.add_train_flags(p)
    allreduce.add_train_flags(p)
    metrics_flags.add_train_flags(p)
    p.set_defaults(func=cmd_train)

    p = verbs.add_parser("test", help="score a trained net on its TEST phase (caffe test)")
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--weights", required=True, help=".caffemodel (or .caffemodel.h5)")
    p.add_argument("--iterations", type=int, default=50, help="batches to score (default 50)")
    arguments.add_net_state(p)
    p.add_argument("--threads", type=int, help="CPU threads (BLAS and kernels); default: all cores")
    p.add_argument("--gpu", help="score on this GPU id (default: the CPU)")
    p.set_defaults(func=cmd_test)

    p = verbs.add_parser("plot", help="plot loss and test accuracy of a Caffe-format training log")
    p.add_argument("log", help="training log (ours, or Caffe's)")
    p.add_argument("-o", "--output", help="PNG to write (default: the log's name with .png)")
    p.add_argument("--csv", action="store_true", help="also write Caffe's parse_log.py tables, LOG.train and "
                   "LOG.test, beside the log (or into --csv-dir)")
    p.add_argument("--csv-dir", metavar="DIR", help="the folder of --csv's tables (implies --csv)")
    p.set_defaults(func=cmd_plot)
