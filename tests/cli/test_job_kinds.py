"""`train` chooses the kind of job in one place (cli/job_kinds.py): the flags given pick one process, data-parallel
workers, Sandblaster or a pipeline, and every flag is checked against the kind chosen, in one line."""
import pytest

from pycaffe_dist.cli import build_parser, job_kinds
from pycaffe_dist.errors import PycaffeDistError


def _args(*flags):
    return build_parser().parse_args(["train", "--solver", "s.prototxt"] + list(flags))


@pytest.mark.parametrize("flags, kind", [
    ([], "one process"),
    (["--workers", "2"], "data-parallel workers"),
    (["--workers", "2", "--mode", "gossip", "--tau", "3"], "data-parallel workers"),
    (["--workers", "2", "--redis", "redis://h:1"], "data-parallel workers"),
    (["--gpu", "0,1"], "data-parallel workers"),             # several GPUs: Caffe's multi-GPU training
    (["--workers", "3", "--mode", "sandblaster", "--lbfgs-memory", "4"], "Sandblaster"),
    (["--pipeline", "2", "--micro-batches", "4"], "a pipeline"),
])
def test_the_flags_choose_the_kind(flags, kind):
    args = _args(*flags)
    assert job_kinds.choose(args).name == kind


def test_several_gpus_are_synchronous_workers_one_per_gpu():
    args = _args("--gpu", "0,1,2")
    job_kinds.choose(args)
    assert (args.workers, args.mode) == (3, "sync")


@pytest.mark.parametrize("flags, line", [
    (["--snapshot", "a", "--weights", "b", "--workers", "2"], "give a snapshot to resume training or weights to "
                                                              "finetune but not both"),
    (["--mode", "sandblaster"], "--mode sandblaster trains on workers: give --workers N"),
    (["--workers", "2", "--mode", "sandblaster", "--tau", "2"], "--tau: not options of mode sandblaster (it takes "
                                                                "--lbfgs-memory, --sample-batches, --unit-batches)"),
    (["--workers", "2", "--mode", "sandblaster", "--redis", "redis://h:1"],
     "--redis is not supported with --mode sandblaster (its workers run on this machine, at a private "
     "redis-server)"),
    (["--lbfgs-memory", "2", "--unit-batches", "1"], "--lbfgs-memory, --unit-batches: options of --mode sandblaster"),
    (["--micro-batches", "2"], "--micro-batches cuts the batches of a pipeline: give --pipeline K"),
    (["--pipeline", "2", "--tau", "2"], "--pipeline with data-parallel --workers/--mode: K stages x N replicas is not "
                                        "supported yet; give one of them"),
    (["--pipeline", "2", "--slow-worker", "0:1"], "--slow-worker is not supported with --pipeline (its stages run "
                                                  "on this machine, at a private redis-server)"),
    (["--mode", "async", "--link", "1gbit:0"], "--link emulates the workers' network links: give --workers N"),
    (["--redis", "redis://h:1"], "--mode and --redis train on workers: give --workers N"),
    (["--tau", "2", "--outer-lr", "0.5"], "--tau, --outer-lr: options of the distributed modes: give --workers N"),
])
def test_a_flag_the_kind_cannot_take_is_one_line(flags, line):
    with pytest.raises(PycaffeDistError) as caught:
        job_kinds.choose(_args(*flags))
    assert str(caught.value) == line
