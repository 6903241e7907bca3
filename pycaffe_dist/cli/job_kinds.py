"""Which kind of job `train` runs, chosen in one place from declarations: all-reduce (--mode allreduce), Sandblaster
(--mode sandblaster), a pipeline (--pipeline K), data-parallel workers (--workers N, a mode, --redis; several GPUs
too) or one process (Caffe's `caffe train`). Each kind says what chooses it and the checks of the flags given
against it, in order: a flag it cannot take, or one it needs, is one line before anything starts. The kinds are
tried in the order below; the first chosen runs its own verb."""
import dataclasses
from typing import Callable, Tuple

from ..backend import select
from ..distributed.data_parallel import modes
from ..errors import PycaffeDistError


def _flag(dest):
    return "--" + dest.replace("_", "-")


def _given(args, dests):
    """The flags among `dests` that were given (a value, or a non-empty list)."""
    return [_flag(d) for d in dests if getattr(args, d, None) not in (None, [])]


def _mode_options(args):
    return [option.flag for option in modes.all_options() if getattr(args, option.name, None) is not None]


@dataclasses.dataclass(frozen=True)
class Check:
    """Flags the kind refuses (`offending(args)`: those given, or the one missing) and the line that says so (a
    format of them, or a function of their list); `each`: the line names the first of them only."""
    offending: Callable
    line: object
    each: bool = False

    def apply(self, args):
        found = self.offending(args)
        if not found:
            return
        if callable(self.line):
            raise PycaffeDistError(self.line(found))
        raise PycaffeDistError(self.line % (found[0] if self.each else ", ".join(found)) if "%s" in self.line
                               else self.line)


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    chosen: Callable                    # args -> whether the flags given choose this kind
    checks: Tuple[Check, ...]
    run: Callable                       # args -> exit code
    prepare: Callable = None            # args -> None: flags implied before `chosen` is asked (several GPUs)


def _sandblaster_flags(args):
    from . import sandblaster
    return sandblaster.flags_given(args)


def _sandblaster_takes(found):
    from . import sandblaster
    return "%s: not options of mode sandblaster (it takes %s)" % (", ".join(found), ", ".join(
        flag for flag, _, _ in sandblaster.FLAGS))


def _run_sandblaster(args):
    from .sandblaster import cmd_train_sandblaster
    return cmd_train_sandblaster(args)


def _run_allreduce(args):
    from .allreduce import cmd_train_allreduce
    return cmd_train_allreduce(args)


def _allreduce_flags(args):
    from . import allreduce
    return allreduce.flags_given(args)


def _allreduce_refuses(args):
    from . import allreduce
    return allreduce.options_not_taken(args)


def _run_pipeline(args):
    from .pipeline import cmd_train_pipeline
    return cmd_train_pipeline(args)


def _run_workers(args):
    from .distributed import cmd_train_distributed
    return cmd_train_distributed(args)


def _several_gpus_are_workers(args):
    """Several GPUs train one net as Caffe's multi-GPU training does: synchronously, one worker per GPU."""
    gpus = select.parse_gpus(args.gpu)
    if len(gpus) > 1 and args.workers is None:
        args.workers, args.mode = len(gpus), args.mode or "sync"


SANDBLASTER_ONLY = Check(_sandblaster_flags, lambda found: "%s: option%s of --mode sandblaster" % (
    ", ".join(found), "s" if len(found) > 1 else ""))
ON_THIS_MACHINE = "%s is not supported with {} (its {} run on this machine, at a private redis-server)"

ALLREDUCE_ONLY = Check(_allreduce_flags, lambda found: "%s: option%s of --mode allreduce" % (
    ", ".join(found), "s" if len(found) > 1 else ""))

KINDS = (
    Kind("all-reduce workers", lambda args: args.mode == "allreduce", (
        SANDBLASTER_ONLY,
        Check(lambda args: [] if args.workers is not None else ["--workers"],
              "--mode allreduce trains on workers: give --workers N"),
        Check(lambda args: [] if args.workers is None or args.workers >= 1 else ["--workers"],
              "--workers must be at least 1"),
        Check(_allreduce_refuses, "%s: not options of mode allreduce (it takes --lr-scaling, --lr-warmup, --lars)"),
        Check(lambda args: _given(args, ("pipeline", "micro_batches", "redis", "redis_servers", "servers",
                                             "slow_worker")),
              ON_THIS_MACHINE.format("--mode allreduce", "workers"), each=True),
    ), _run_allreduce),
    Kind("Sandblaster", lambda args: args.mode == "sandblaster", (
        ALLREDUCE_ONLY,
        Check(lambda args: [] if args.workers is not None else ["--workers"],
              "--mode sandblaster trains on workers: give --workers N"),
        Check(_mode_options, _sandblaster_takes),
        Check(lambda args: _given(args, ("pipeline", "micro_batches", "redis", "redis_servers", "servers")),
              ON_THIS_MACHINE.format("--mode sandblaster", "workers"), each=True),
    ), _run_sandblaster),
    Kind("a pipeline", lambda args: args.pipeline is not None or args.micro_batches is not None, (
        SANDBLASTER_ONLY, ALLREDUCE_ONLY,
        Check(lambda args: [] if args.pipeline is not None else ["--pipeline"],
              "--micro-batches cuts the batches of a pipeline: give --pipeline K"),
        Check(lambda args: _given(args, ("workers", "mode")) + _mode_options(args),
              "--pipeline with data-parallel --workers/--mode: K stages x N replicas is not supported yet; give one "
              "of them"),
        Check(lambda args: _given(args, ("redis", "redis_servers", "servers", "slow_worker")),
              ON_THIS_MACHINE.format("--pipeline", "stages"), each=True),
    ), _run_pipeline),
    Kind("data-parallel workers", lambda args: _given(args, ("workers", "mode", "redis")) != [], (
        SANDBLASTER_ONLY, ALLREDUCE_ONLY,
        Check(lambda args: _given(args, ("link",)) if args.workers is None else [],
              "--link emulates the workers' network links: give --workers N"),
        Check(lambda args: [] if args.workers is not None else ["--workers"],
              "--mode and --redis train on workers: give --workers N"),
    ), _run_workers, prepare=_several_gpus_are_workers),
    Kind("one process", lambda args: True, (
        SANDBLASTER_ONLY, ALLREDUCE_ONLY,
        Check(lambda args: _given(args, ("link",)), "--link emulates the workers' network links: give --workers N"),
        Check(_mode_options, "%s: options of the distributed modes: give --workers N"),
    ), None),
)


def choose(args):
    """The kind of job the flags given choose, every flag checked against it (one line for the first that does
    not fit); also a snapshot and weights at once, which no kind takes."""
    if args.snapshot and args.weights:
        raise PycaffeDistError("give a snapshot to resume training or weights to finetune but not both")
    for kind in KINDS:
        if kind.prepare is not None:
            kind.prepare(args)
        if kind.chosen(args):
            for check in kind.checks:
                check.apply(args)
            return kind
    raise AssertionError("the last kind is always chosen")
