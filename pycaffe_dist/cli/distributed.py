"""The verbs of distributed training: `train --workers N` on one machine (a private redis-server, a master and N
workers, distributed/launch.py), and `master`, `worker`, `status` for many machines. The mode options' flags are
built from the modes' own declarations (distributed/modes: Option), so an option is declared once."""
import argparse
import logging
import signal
import sys

from ..backend import select
from ..distributed.data_parallel import modes
from ..distributed.job import STOPPED_BY_MASTER, modules_flag
from ..errors import PycaffeDistError
from ..metrics import flags as metrics_flags
from . import arguments


MASTER_ERROR = "[master] dist_caffe: "


def add_mode_flags(parser):
    """One flag per mode option (a bool one as --x / --no-x); their defaults are the mode's, so argparse's is None."""
    for option in modes.all_options():
        used_by = ", ".join(modes.modes_using(option))
        if option.type is bool:
            group = parser.add_mutually_exclusive_group()
            group.add_argument(option.flag, dest=option.name, action="store_true", default=None,
                               help="%s (modes: %s)" % (option.help, used_by))
            group.add_argument("--no-" + option.flag[2:], dest=option.name, action="store_false",
                               help="the opposite of %s" % option.flag)
        else:
            default = "" if option.default in (None, 0) else "; default %s" % option.default
            default += "".join(" (%s: %s)" % (mode, modes.default_of(mode, option)) for mode in
                               modes.modes_using(option) if modes.default_of(mode, option) != option.default)
            parser.add_argument(option.flag, dest=option.name, type=option.type, default=None,
                                help="%s (modes: %s%s)" % (option.help, used_by, default))
    parser.add_argument("--heartbeat", type=float, default=5.0, help="seconds without a heartbeat after which a "
                        "worker counts as gone (default 5)")


def add_servers_flag(parser, default):
    parser.add_argument("--servers", type=int, metavar="K", help="parameter server shards: K processes, each "
                        "merging one K-th of W at its own Redis server (one Redis URL each), so that no process "
                        "moves more than 1/K of a merge's bytes; modes with a central W " + default)


def add_python_layers_flag(parser):
    parser.add_argument("--python-layers", metavar="MODULE[,MODULE]", help="modules this process may import for "
                        "the Python layers of a job read from Redis (none by default: no code comes from Redis; "
                        "`train --workers` allows those of its own solver)")


def add_patience_flags(parser):
    """How long a worker-side process waits for what is not there: its master, and an unreachable Redis."""
    parser.add_argument("--master-timeout", type=float, help="seconds without the master's heartbeat before giving "
                        "up (default: 10 x the job's --heartbeat, 50 s at its default)")
    parser.add_argument("--redis-retry", type=float, default=30.0, help="seconds to retry an unreachable Redis before "
                        "giving up (default 30)")


def mode_options_given(args):
    """(Option, value given or None) for every mode option."""
    return [(option, getattr(args, option.name, None)) for option in modes.all_options()]


def mode_options(args):
    """The mode options given on the command line, by name (the master fills in the mode's defaults)."""
    return {option.name: value for option, value in mode_options_given(args) if value is not None}


def add_train_flags(parser):
    """What `train` takes to train on workers."""
    parser.add_argument("--workers", type=int, help="train on N worker processes that meet at a Redis parameter "
                        "store (a private redis-server unless --redis is given)")
    # sandblaster: L-BFGS with a master loop of its own (cli/sandblaster.py); allreduce: no master on the data path
    # (cli/allreduce.py); neither is a mode of master.py
    parser.add_argument("--mode", choices=list(modes.MODES) + ["sandblaster", "allreduce"], help="distributed mode "
                        "(default async)")
    parser.add_argument("--redis", help="Redis URL(s) to use instead of a private server (comma-separated: blobs "
                        "are sharded over them)")
    parser.add_argument("--redis-servers", type=int, help="private redis-servers to shard the weights over "
                        "(default: workers // 2, at least 1, at most 4)")
    add_servers_flag(parser, "(default: picked from the workers and the net's size, and said)")
    parser.add_argument("--job", help="distributed job id (default: generated)")
    parser.add_argument("--keep", action="store_true", help="keep the job's keys on Redis at the end")
    parser.add_argument("--stats", help="distributed: write the master's summary (rates, tests) to this JSON file")
    parser.add_argument("--slow-worker", metavar="ID:SECONDS", action="append", type=slow_worker, default=[],
                        help="for trying stragglers out: worker ID sleeps SECONDS after every round (repeatable)")
    parser.add_argument("--link", metavar="RATE:DELAY", help="emulate a network link per worker with network "
                        "namespaces and tc netem, needs root; e.g. 1gbit:0.2ms, 100mbit:2ms (each direction has "
                        "the rate and the one-way delay)")
    parser.add_argument("--pipeline", type=int, metavar="K", help="pipelined model parallelism: cut the TRAIN net "
                        "into K stages of balanced FLOPs, each a process (`net-info NET --pipeline K` shows the cut)")
    parser.add_argument("--micro-batches", type=int, metavar="M", help="with --pipeline: micro-batches per batch "
                        "(a divisor of the batch; default: the least divisor that is at least K)")
    add_mode_flags(parser)


def ring_place(text):
    """'RANK/SIZE[/WORLD]' -> (rank, size, world number): an all-reduce worker's place in a world on sockets, started
    one by one (the Ansible playbook's workers: world 0) or by its coordinator behind an emulated link (the world's
    number counts the coordinator's restarts)."""
    try:
        parts = [int(part) for part in text.split("/")]
        if len(parts) in (2, 3):
            rank, size, world = (parts + [0])[:3]
            if 0 <= rank < size and world >= 0:
                return rank, size, world
    except ValueError:
        pass
    raise argparse.ArgumentTypeError("expected RANK/SIZE (0 <= RANK < SIZE), got %r" % text)


def slow_worker(text):
    """'ID:SECONDS' -> (id, seconds), for --slow-worker."""
    worker, sep, seconds = text.partition(":")
    try:
        if sep and int(worker) >= 0 and float(seconds) >= 0:
            return int(worker), float(seconds)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError("expected ID:SECONDS (a worker id and the seconds it sleeps after each round), "
                                     "got %r" % text)


def cmd_train_distributed(args):
    """`train --workers N`: a private redis-server (or --redis), the master and N workers on this machine."""
    from ..distributed import launch
    from ..distributed.data_parallel.master import Settings
    if args.workers < 1:
        raise PycaffeDistError("--workers must be at least 1, got %d" % args.workers)
    link = checked_link(args)
    settings = Settings(solver=args.solver, workers=args.workers, mode=args.mode or "async",
                        options=mode_options(args), job=args.job, snapshot=args.snapshot, weights=args.weights,
                        heartbeat_s=args.heartbeat, keep=args.keep, max_iter=args.iterations,
                        stats_path=args.stats, log=args.log)
    if args.redis is not None:
        settings.redis = args.redis
    resolved = modes.resolve_options(settings.mode, settings.options)   # a bad option: one line, before any start
    if resolved.get("backup", 0) >= args.workers:
        raise PycaffeDistError("--backup %d leaves no worker to wait for: give fewer backups than --workers (%d)"
                               % (resolved["backup"], args.workers))
    if args.redis_servers is not None and args.redis_servers < 1:
        raise PycaffeDistError("--redis-servers must be at least 1, got %d" % args.redis_servers)
    if args.redis_servers is not None and args.redis is not None:
        raise PycaffeDistError("--redis-servers starts private servers: not with --redis (list several URLs there "
                               "to shard over them)")
    slow = dict(args.slow_worker)
    if any(i >= args.workers for i in slow):
        raise PycaffeDistError("--slow-worker names worker %d, but the workers are 0 to %d"
                               % (max(slow), args.workers - 1))
    settings.servers, settings.servers_chosen = chosen_servers(args, settings.mode, resolved)
    return run_launched_job(
        lambda progress, sink: launch.run_local(
            settings, worker_threads=args.threads or 1, progress=progress, sink=sink,
            gpus=select.parse_gpus(args.gpu), private_redis=args.redis is None, link=link, slow_workers=slow,
            # --servers 1 given: one parameter server, the master with its one redis-server
            redis_servers=args.redis_servers or (1 if args.servers == 1 else None)),
        "the master and the workers", "the master", args)


def chosen_servers(args, mode, options):
    """(--servers checked, None), or the one-machine default (shards.default_servers) with why, for the master to
    say once the job starts."""
    from ..distributed.data_parallel import shards
    if args.servers is not None:
        if args.servers < 1:
            raise PycaffeDistError("--servers must be at least 1, got %d" % args.servers)
        if args.servers > 1 and args.redis_servers is not None and args.redis_servers != args.servers:
            raise PycaffeDistError("--servers %d runs one private redis-server per shard: no --redis-servers %d "
                                   "with it" % (args.servers, args.redis_servers))
        from ..io.load import read_solver
        urls = args.redis.split(",") if args.redis is not None else ["private"] * args.servers
        shards.check_shardable(mode, options, read_solver(args.solver), args.servers, urls)   # before any start
        return args.servers, None
    if mode not in shards.SHARDED_MODES or args.redis is not None or args.redis_servers is not None \
            or options.get("compress", "none") != "none":
        return 1, None
    try:
        nbytes = shards.model_bytes(args.solver)
    except (PycaffeDistError, OSError):
        return 1, None          # (the master says what is wrong with the net, in its one line)
    return shards.default_servers(args.workers, nbytes)


def checked_link(args):
    """--link's spec, checked before any process starts (a bad one: one line), or None."""
    if args.link is None:
        return None
    from ..distributed.links import parse_link
    link = parse_link(args.link)
    if args.redis is not None:
        raise PycaffeDistError("--link runs the workers in network namespaces that reach only the private "
                               "redis-server: no --redis with it")
    return link


def run_launched_job(start, children, master, args=None):
    """Run a job that launch.py starts on this machine (`start(progress, sink)` -> the master's exit code) under one
    progress line on a terminal; the master's own error line becomes this command's one error line, at the end.
    `children` and `master` name the processes in the lines that say how it stopped. The master's progress records
    also go to `train`'s --tensorboard and --metrics-port, where `args` give them (metrics/flags.py)."""
    from ..distributed.launch import print_line
    from ..solver import training_log
    handler = training_log.TerminalHandler(sys.stderr) if sys.stderr.isatty() else None
    show = handler.write_line if handler is not None else print_line
    master_errors = []

    def sink(line):
        if line.startswith(MASTER_ERROR):
            text = line[len(MASTER_ERROR):]
            master_errors.append(text[len("error: "):] if text.startswith("error: ") else text)
        elif "] dist_caffe: error: job " in line and STOPPED_BY_MASTER in line:
            pass                # a worker echoing the master's failure: the launcher's one line is the master's
        else:
            show(line)
    shown = training_log.DistributedProgress(handler) if handler is not None else None
    try:
        with metrics_flags.watching_job(args, shown) as progress:
            code = start(progress, sink)
    finally:
        if handler is not None:
            handler.finish()
    if code > 128:
        why = "interrupted" if code == arguments.EXIT_INTERRUPTED else signal.Signals(code - 128).name
        print("dist_caffe: %s: stopped %s" % (why, children), file=sys.stderr)
    elif code and master_errors:
        raise PycaffeDistError(master_errors[-1])
    elif code:
        raise PycaffeDistError("%s exited with status %d (see its log lines above)" % (master, code))
    return code


def cmd_master(args):
    """The master of a distributed job: publishes it on Redis, merges the workers' results, tests, snapshots."""
    from ..distributed.data_parallel.master import Master, Settings
    from ..distributed.redis_client import describe
    from ..solver import training_log
    if args.settings is not None:
        if args.solver or args.resume:
            raise PycaffeDistError("--settings gives every setting of the master: no --solver or --resume with it")
        settings = Settings.read(args.settings)
    else:
        if not args.resume and not args.solver:
            raise PycaffeDistError("master needs --solver (or --resume with --job)")
        settings = Settings(redis=args.redis, solver=args.solver, workers=args.workers, mode=args.mode,
                            options=mode_options(args), job=args.job, resume=args.resume, snapshot=args.snapshot,
                            weights=args.weights, threads=args.threads or 1, heartbeat_s=args.heartbeat,
                            join_timeout_s=args.join_timeout, keep=args.keep, max_iter=args.iterations,
                            stats_path=args.stats, retry_s=args.redis_retry, log=args.log,
                            python_layers=modules_flag(args.python_layers), servers=args.servers or 1)
    if args.servers is not None and args.servers < 1:
        raise PycaffeDistError("--servers must be at least 1, got %d" % args.servers)
    metrics_flags.check(args)
    training_log.attach(logging.getLogger("pycaffe_dist"), settings.log)
    master = Master(settings)
    print("job %s on %s" % (master.job, describe(master.store.urls[0])), file=sys.stderr, flush=True)
    with metrics_flags.serving_job(args, settings.redis, master.job):
        master.run()
    return 0


def choose_process_gpu(gpu_flag):
    """A worker's or stage's device, from its --gpu (None: the CPU), said on stderr where it is a GPU: the launcher
    shows the line under the process's name."""
    if select.choose(gpu_flag) is not None:
        print("computing on GPU %s: %s" % (gpu_flag, select.current().name), file=sys.stderr, flush=True)


def cmd_worker(args):
    """A worker of a distributed job: everything it needs comes from Redis, but the data paths. On an all-reduce
    job, one rank of its MPI world (cli/allreduce.py)."""
    from ..distributed.data_parallel.worker import Worker
    from ..distributed.job_process import job_kind
    from ..solver import training_log
    kind = job_kind(args.redis, args.job, args.wait, args.redis_retry)
    if kind == "allreduce":
        return run_allreduce_worker(args)
    if args.ring is not None:
        raise PycaffeDistError("--ring: a place in an all-reduce world; the job %sis a %s job, whose workers take "
                               "none" % ("%s " % args.job if args.job else "", kind or "data-parallel"))
    training_log.attach(logging.getLogger("pycaffe_dist.distributed"))
    # The master reports the job's training (and a divergence, once): the workers' own solvers stay quiet.
    logging.getLogger("pycaffe_dist.solver").setLevel(logging.ERROR)
    choose_process_gpu(args.gpu)
    worker = Worker(args.redis, args.job, threads=args.threads or 1, master_timeout_s=args.master_timeout,
                    wait_for_job_s=args.wait, worker_id=args.id, retry_s=args.redis_retry, delay_s=args.delay,
                    python_layers=modules_flag(args.python_layers))
    stats = worker.run()
    by_update = " (W pulled as %d compressed updates, %d times whole)" % (
        stats["pulls_by_update"], stats["whole_pulls"]) if "pulls_by_update" in stats else ""
    print("worker %s: %d rounds, %d images%s" % (worker.id, stats["rounds"], stats["images"], by_update),
          file=sys.stderr)
    return 0


def cmd_shard(args):
    """A parameter server shard: merges its slice of W as its master's events say (data_parallel/shard.py)."""
    from ..distributed.data_parallel.shard import Shard
    from ..solver import training_log
    training_log.attach(logging.getLogger("pycaffe_dist.distributed"))
    shard = Shard(args.redis, args.job, args.index, wait_for_job_s=args.wait, master_timeout_s=args.master_timeout,
                  retry_s=args.redis_retry)
    stats = shard.run()
    print("shard %d: W published at merge %d" % (args.index, stats["merges"]), file=sys.stderr)
    return 0


def run_allreduce_worker(args):
    """`dist_caffe worker` on an all-reduce job: one rank of the MPI world (mpiexec, srun), or of a world on sockets
    (--ring RANK/SIZE)."""
    from ..distributed.allreduce.worker import AllreduceWorker, mpi_world
    from ..solver import training_log
    gpus = select.parse_gpus(args.gpu)
    if gpus:
        # a list: worker r takes gpus[r % len(gpus)] (one world across a machine's GPUs, from one command line)
        rank = args.ring[0] if args.ring is not None else mpi_world().Get_rank()
        choose_process_gpu(str(gpus[rank % len(gpus)]))
    worker = AllreduceWorker(args.redis, args.job, threads=args.threads or 1, master_timeout_s=args.master_timeout,
                             wait_for_job_s=args.wait, retry_s=args.redis_retry,
                             python_layers=modules_flag(args.python_layers), ring=args.ring)
    # worker 0 says Caffe's lines for the job (its solver's display, its keeper's tests); the others stay quiet
    training_log.attach(logging.getLogger("pycaffe_dist.distributed"))
    logging.getLogger("pycaffe_dist.solver").setLevel(logging.INFO if worker.rank == 0 else logging.ERROR)
    if worker.rank == 0:
        training_log.attach(logging.getLogger("pycaffe_dist.solver"))
    stats = worker.run()
    print("worker %d: %d iterations, %d images; the ring took %.1f s, %.1f s of it not hidden behind the backward" % (
        worker.rank, stats["iterations"], stats["images"], stats["exchange_s"], stats["wait_s"]), file=sys.stderr)
    return 0


def cmd_status(args):
    """A distributed job's members, rates, global iteration, last test and snapshots, read from Redis."""
    from ..distributed.status import show
    print(show(args.redis, args.job, as_json=args.json, remove=args.remove))
    return 0


def add_verbs(verbs):
    p = verbs.add_parser("master", help="the master of a distributed job on Redis")
    p.add_argument("--solver", help="solver prototxt")
    p.add_argument("--workers", type=int, default=1, help="workers to wait for before starting (default 1)")
    p.add_argument("--mode", choices=list(modes.MODES), default="async", help="distributed mode (default async)")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis URL(s), comma-separated to shard")
    p.add_argument("--job", help="job id (default: generated from the solver's name)")
    p.add_argument("--resume", action="store_true", help="continue the job --job from its state on Redis")
    add_python_layers_flag(p)
    p.add_argument("--snapshot", help=".solverstate to start from (weights, merge count, history)")
    p.add_argument("--weights", help=".caffemodel to start the weights from")
    p.add_argument("--iterations", type=int, help="merges to run (overrides the solver's max_iter)")
    p.add_argument("--threads", type=int, help="CPU threads of the master (tests; default 1)")
    p.add_argument("--join-timeout", type=float, default=300.0, help="seconds to wait for the workers (and the "
                   "shards) before starting with those there (default 300)")
    add_servers_flag(p, "(default 1: this master merges W; with K, start `dist_caffe shard --index S` for each "
                     "S < K, at any host that reaches the servers)")
    p.add_argument("--keep", action="store_true", help="keep the job's keys on Redis at the end")
    p.add_argument("--stats", help="write a summary (rates, tests) to this JSON file")
    p.add_argument("--log", help="also write the log lines to this file")
    p.add_argument("--redis-retry", type=float, default=30.0, help="seconds to retry an unreachable Redis before "
                   "giving up (default 30)")
    p.add_argument("--settings", help="read every setting from this JSON file ('-': standard input) instead of the "
                   "flags, as the one-machine launcher hands them over (master.Settings)")
    metrics_flags.add_serving_flags(p)
    add_mode_flags(p)
    p.set_defaults(func=cmd_master)

    p = verbs.add_parser("worker", help="a worker of a distributed job on Redis")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis URL(s), as the master's")
    p.add_argument("--job", help="job id (default: the only job on the server)")
    p.add_argument("--threads", type=int, help="CPU threads (default 1)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the job to be published "
                   "(default 60)")
    p.add_argument("--id", type=int, help="this worker's id (default: the next free one)")
    add_python_layers_flag(p)
    p.add_argument("--gpu", help="compute on this GPU id (default: the CPU; on an all-reduce job, a list: worker r "
                   "takes the (r mod n)-th)")
    p.add_argument("--delay", type=float, default=0.0, help="sleep this many seconds after every round: a straggler "
                   "on purpose, for trying out backup workers and weed-out (default 0)")
    add_patience_flags(p)
    p.add_argument("--ring", type=ring_place, metavar="RANK/SIZE", help="on an all-reduce job: this worker is rank "
                   "RANK of SIZE workers whose ring runs on TCP sockets, without MPI (each started on its own, as the "
                   "Ansible playbook does; they meet through the job's Redis and must reach each other's addresses)")
    p.set_defaults(func=cmd_worker)

    p = verbs.add_parser("shard", help="a parameter server shard of a distributed job on Redis (master --servers K)")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis URL(s), as the master's")
    p.add_argument("--job", help="job id (default: the only job on the server)")
    p.add_argument("--index", type=int, required=True, help="which shard: S of 0 to K-1, the slice of W on the "
                   "S-th Redis server")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the job to be published "
                   "(default 60)")
    p.add_argument("--python-layers", help=argparse.SUPPRESS)     # (a shard builds no net: what train hands all)
    add_patience_flags(p)
    p.set_defaults(func=cmd_shard)

    p = verbs.add_parser("status", help="a distributed job's workers, rates, iteration, last test and snapshots")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis URL(s)")
    p.add_argument("--job", help="the job (default: every job on the server)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--remove", action="store_true", help="then delete the job's keys (after a job that did not end "
                   "cleanly)")
    p.set_defaults(func=cmd_status)
