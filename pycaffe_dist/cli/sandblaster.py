"""The verbs of Sandblaster L-BFGS: `train --workers N --mode sandblaster` on one machine (a private redis-server,
the coordinator and N workers, distributed/launch.py), and `sandblaster-master` and `sandblaster-worker`, the
processes it starts (and what runs it on many machines)."""
import logging
import sys

from ..backend import select
from ..errors import PycaffeDistError
from ..distributed.job import modules_flag
from ..metrics import flags as metrics_flags
from .distributed import (add_patience_flags, add_python_layers_flag, checked_link, choose_process_gpu,
                          run_launched_job)

MODE = "sandblaster"
# (flag, Settings field, help); their defaults are distributed/sandblaster/master.py's
FLAGS = (("--lbfgs-memory", "memory", "(s, y) pairs L-BFGS keeps"),
         ("--sample-batches", "sample_batches", "batches of the training data an evaluation of the objective covers "
                                                "(one sample per L-BFGS iteration)"),
         ("--unit-batches", "unit_batches", "batches in one work unit, the piece of an evaluation a worker takes"))


def add_train_flags(parser):
    from ..distributed.sandblaster import master as coordinator
    for flag, field, text in FLAGS:
        parser.add_argument(flag, dest=field, type=int, default=None, help="with --mode sandblaster: %s (default "
                            "%d)" % (text, getattr(coordinator.Settings, field)))


def flags_given(args):
    return [flag for flag, field, _ in FLAGS if getattr(args, field, None) is not None]


def cmd_train_sandblaster(args):
    """`train --workers N --mode sandblaster`: the coordinator and N workers as processes, at a private
    redis-server."""
    from ..distributed import launch
    from ..distributed.sandblaster.master import Settings
    gpus = select.parse_gpus(args.gpu)
    link = checked_link(args)
    slow = dict(args.slow_worker)
    if any(i >= args.workers for i in slow):
        raise PycaffeDistError("--slow-worker names worker %d, but the workers are 0 to %d"
                               % (max(slow), args.workers - 1))
    settings = Settings(solver=args.solver, workers=args.workers, job=args.job, snapshot=args.snapshot,
                        weights=args.weights, heartbeat_s=args.heartbeat, keep=args.keep, max_iter=args.iterations,
                        stats_path=args.stats, log=args.log,
                        **{field: getattr(args, field) for _, field, _ in FLAGS if getattr(args, field) is not None})
    settings.check()                        # a bad value: one line, before any process starts
    return run_launched_job(
        lambda progress, sink: launch.run_sandblaster_local(settings, threads=args.threads or 1, progress=progress,
                                                            sink=sink, slow_workers=slow, link=link, gpus=gpus),
        "the master and the workers", "the Sandblaster master", args)


def cmd_sandblaster_master(args):
    from ..distributed.sandblaster.master import SandblasterMaster, Settings
    from ..solver import training_log
    metrics_flags.check(args)
    settings = Settings.read(args.settings)
    training_log.attach(logging.getLogger("pycaffe_dist"), settings.log)
    master = SandblasterMaster(settings)
    print("job %s" % master.job, file=sys.stderr, flush=True)
    with metrics_flags.serving_job(args, settings.redis, master.job):
        master.run()
    return 0


def cmd_sandblaster_worker(args):
    from ..distributed.sandblaster.worker import SandblasterWorker
    from ..solver import training_log
    training_log.attach(logging.getLogger("pycaffe_dist.distributed"))
    logging.getLogger("pycaffe_dist.solver").setLevel(logging.ERROR)
    choose_process_gpu(args.gpu)
    worker = SandblasterWorker(args.redis, args.job, threads=args.threads or 1, wait_for_job_s=args.wait,
                               worker_id=args.id, delay_s=args.delay, python_layers=modules_flag(args.python_layers),
                               master_timeout_s=args.master_timeout, retry_s=args.redis_retry)
    stats = worker.run()
    print("worker %s: %d units (%d batches) in %d pushes, %.1f s computing" % (
        worker.id, stats["units"], stats["batches"], stats["pushes"], stats["compute_s"]), file=sys.stderr)
    return 0


def add_verbs(verbs):
    p = verbs.add_parser("sandblaster-master", help="the coordinator of Sandblaster L-BFGS (what `train --mode "
                         "sandblaster` starts)")
    p.add_argument("--settings", required=True, help="its settings as JSON, from this file ('-': standard input): "
                   "the fields of distributed/sandblaster/master.py's Settings")
    metrics_flags.add_serving_flags(p)
    p.set_defaults(func=cmd_sandblaster_master)

    p = verbs.add_parser("sandblaster-worker", help="a worker of Sandblaster L-BFGS (what `train --mode sandblaster` "
                         "starts)")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis URL, as the master's")
    p.add_argument("--job", help="job id (default: the only job on the server)")
    p.add_argument("--id", type=int, help="this worker's id (default: the next free one)")
    add_python_layers_flag(p)
    add_patience_flags(p)
    p.add_argument("--threads", type=int, help="CPU threads (default 1)")
    p.add_argument("--gpu", help="compute on this GPU id (default: the CPU)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the job to be published "
                   "(default 60)")
    p.add_argument("--delay", type=float, default=0.0, help="sleep this many seconds after every unit: a straggler "
                   "on purpose (default 0)")
    p.set_defaults(func=cmd_sandblaster_worker)
