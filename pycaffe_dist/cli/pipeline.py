"""The verbs of pipelined model parallelism: `train --pipeline K` on one machine (a private redis-server, the
pipeline's master and K stage processes, distributed/launch.py), and `pipeline-master` and `stage`, the processes
it starts."""
import logging
import sys

from ..backend import select
from ..errors import PycaffeDistError
from ..distributed.job import modules_flag
from ..metrics import flags as metrics_flags
from .distributed import (add_patience_flags, add_python_layers_flag, checked_link, choose_process_gpu,
                          run_launched_job)


def cmd_train_pipeline(args):
    """`train --pipeline K [--micro-batches M]`: the stages as processes, meeting at a private redis-server."""
    from ..distributed import launch
    from ..distributed.pipeline.master import Settings
    if args.pipeline < 1:
        raise PycaffeDistError("--pipeline must be at least 1, got %d" % args.pipeline)
    if args.micro_batches is not None and args.micro_batches < 1:
        raise PycaffeDistError("--micro-batches must be at least 1, got %d" % args.micro_batches)
    gpus = select.parse_gpus(args.gpu)
    link = checked_link(args)
    settings = Settings(solver=args.solver, stages=args.pipeline, micro_batches=args.micro_batches, job=args.job,
                        snapshot=args.snapshot, weights=args.weights, heartbeat_s=args.heartbeat, keep=args.keep,
                        max_iter=args.iterations, stats_path=args.stats, log=args.log)
    return run_launched_job(
        lambda progress, sink: launch.run_pipeline_local(settings, threads=args.threads or 1, progress=progress,
                                                         sink=sink, link=link, gpus=gpus),
        "the master and the stages", "the pipeline's master", args)


def cmd_pipeline_master(args):
    from ..distributed.pipeline.master import PipelineMaster, Settings
    from ..solver import training_log
    metrics_flags.check(args)
    settings = Settings.read(args.settings)
    training_log.attach(logging.getLogger("pycaffe_dist"), settings.log)
    master = PipelineMaster(settings)
    with metrics_flags.serving_job(args, settings.redis, master.job):
        master.run()
    return 0


def cmd_stage(args):
    from ..distributed.pipeline.stage import Stage
    from ..solver import training_log
    training_log.attach(logging.getLogger("pycaffe_dist.distributed"))
    logging.getLogger("pycaffe_dist.solver").setLevel(logging.ERROR)
    choose_process_gpu(args.gpu)
    stage = Stage(args.redis, args.job, args.stage, threads=args.threads or 1, wait_for_job_s=args.wait,
                  python_layers=modules_flag(args.python_layers), master_timeout_s=args.master_timeout,
                  retry_s=args.redis_retry)
    stats = stage.run()
    print("stage %d: %d iterations, %.1f s computing, %.1f s waiting" % (
        args.stage, stats["iterations"], stats["compute_s"], stats["wait_s"]), file=sys.stderr)
    return 0


def add_verbs(verbs):
    p = verbs.add_parser("pipeline-master", help="the master of a pipeline (what `train --pipeline K` starts)")
    p.add_argument("--settings", required=True, help="its settings as JSON, from this file ('-': standard input): "
                   "the fields of distributed/pipeline/master.py's Settings")
    metrics_flags.add_serving_flags(p)
    p.set_defaults(func=cmd_pipeline_master)

    p = verbs.add_parser("stage", help="a stage of a pipeline (what `train --pipeline K` starts)")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis URL, as the master's")
    p.add_argument("--job", help="job id (default: the only job on the server)")
    p.add_argument("--stage", type=int, required=True, help="which stage (0: the data and the first layers)")
    add_python_layers_flag(p)
    add_patience_flags(p)
    p.add_argument("--threads", type=int, help="CPU threads (default 1)")
    p.add_argument("--gpu", help="compute on this GPU id (default: the CPU)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the job to be published "
                   "(default 60)")
    p.set_defaults(func=cmd_stage)
