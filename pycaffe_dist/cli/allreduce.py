"""The verbs of all-reduce data parallelism: `train --workers N --mode allreduce` on one machine (a private
redis-server and the coordinator, which starts the workers' MPI world: distributed/launch.py), and
`allreduce-master`, the coordinator it starts (on a cluster: with --settings naming launch false, while mpiexec or
srun runs `dist_caffe worker` on the hosts)."""
import logging
import sys

from ..backend import select
from ..metrics import flags as metrics_flags
from .distributed import checked_link, mode_options, run_launched_job

OPTIONS = ("lr_scaling", "lr_warmup", "lars")      # the mode options it takes (lr_scaling.py's, and LARS)


def add_train_flags(parser):
    from ..distributed.allreduce import buckets
    parser.add_argument("--checkpoint-every", type=int, metavar="ITERS", help="with --mode allreduce: iterations "
                        "between the checkpoints a lost worker's others go on from (default: max_iter / 20, at most "
                        "100)")
    parser.add_argument("--bucket-mb", type=float, help="with --mode allreduce: the gradients' buckets, each "
                        "all-reduced as soon as the backward has made it (default %g, PyTorch DDP's)"
                        % (buckets.BUCKET_BYTES / (1 << 20)))


def flags_given(args):
    return [flag for flag, dest in (("--checkpoint-every", "checkpoint_every"), ("--bucket-mb", "bucket_mb"))
            if getattr(args, dest, None) is not None]


def cmd_train_allreduce(args):
    """`train --workers N --mode allreduce`: the coordinator and its MPI world of N workers, at a private
    redis-server."""
    from ..distributed import launch
    from ..distributed.allreduce.master import Settings
    settings = Settings(solver=args.solver, workers=args.workers, job=args.job, snapshot=args.snapshot,
                        weights=args.weights, heartbeat_s=args.heartbeat, keep=args.keep, max_iter=args.iterations,
                        stats_path=args.stats, log=args.log, options=mode_options(args),
                        checkpoint_every=args.checkpoint_every, worker_threads=args.threads or 1,
                        gpus=select.parse_gpus(args.gpu),
                        **({"bucket_mb": args.bucket_mb} if args.bucket_mb is not None else {}))
    settings.check()                        # a bad value: one line, before any process starts
    link = checked_link(args)
    return run_launched_job(
        lambda progress, sink: launch.run_allreduce_local(settings, progress=progress, sink=sink, link=link),
        "the coordinator and the workers", "the all-reduce coordinator", args)


def cmd_allreduce_master(args):
    from ..distributed.allreduce.master import AllreduceCoordinator, Settings
    from ..distributed.redis_client import describe
    from ..solver import training_log
    metrics_flags.check(args)
    settings = Settings.read(args.settings)
    training_log.attach(logging.getLogger("pycaffe_dist"), settings.log)
    coordinator = AllreduceCoordinator(settings)
    print("job %s on %s" % (coordinator.job, describe(coordinator.store.urls[0])), file=sys.stderr, flush=True)
    with metrics_flags.serving_job(args, settings.redis, coordinator.job):      # (worker 0 writes the record)
        coordinator.run()
    return 0


def add_verbs(verbs):
    p = verbs.add_parser("allreduce-master", help="the coordinator of an all-reduce job (what `train --mode "
                         "allreduce` starts)")
    p.add_argument("--settings", required=True, help="its settings as JSON, from this file ('-': standard input): "
                   "the fields of distributed/allreduce/master.py's Settings")
    metrics_flags.add_serving_flags(p)
    p.set_defaults(func=cmd_allreduce_master)


def options_not_taken(args):
    """The mode options given that --mode allreduce does not take."""
    from ..distributed.data_parallel import modes
    return [o.flag for o in modes.all_options() if getattr(args, o.name, None) is not None and o.name not in OPTIONS]
