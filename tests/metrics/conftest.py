"""Fixtures of the metrics tests: the distributed tests' tiny data set, solver and real redis-server (their
conftest's fixtures, imported), and one short one-process `train` run with every metrics flag, shared by the tests
that read what it left (its log, its event files)."""
import dataclasses
import pathlib
import re

import pytest

from tests.cli.commands import dist_caffe
from tests.distributed.conftest import env, make_solver, procs, redis_server, tiny_data

__all__ = ["env", "make_solver", "procs", "redis_server", "tiny_data"]     # (the fixtures, used by their names)
BATCH = 32                  # the tiny net's train batch (tests/distributed/conftest.py NET)


@dataclasses.dataclass
class Run:
    folder: pathlib.Path
    log: pathlib.Path
    events: pathlib.Path
    stderr: str


@pytest.fixture(scope="session")
def trained(tiny_data, tmp_path_factory):
    """`dist_caffe train --tensorboard --log --metrics-port 0` of the tiny net: 20 iterations, a display every 5, a
    test every 10 (8 batches), the last test after the last update."""
    folder = tmp_path_factory.mktemp("run")
    solver = folder / "solver.prototxt"
    solver.write_text('net: "%s"\ntest_iter: 8\ntest_interval: 10\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "step"\n'
                      'gamma: 0.5\nstepsize: 8\ndisplay: 5\nmax_iter: 20\nsnapshot_prefix: "%s"\nrandom_seed: 1\n'
                      'solver_mode: CPU\n' % (tiny_data / "net.prototxt", folder / "snap"))
    run = dist_caffe("train", "--solver", solver, "--tensorboard", folder / "tb", "--log", folder / "train.log",
                     "--metrics-port", 0, cwd=folder)
    assert run.returncode == 0, run.stderr
    return Run(folder, folder / "train.log", folder / "tb", run.stderr)


def scalars(folder):
    """{tag: [(step, value)]} of the event files in `folder`, as TensorBoard's own reader lists them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    reader = EventAccumulator(str(folder), size_guidance={"scalars": 0})      # (0: every point, not a sample)
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def iters_per_s(log):
    """{iteration: iter/s} of the display lines of a log."""
    found = re.findall(r"Iteration (\d+) \(([^ ]+) iter/s", log.read_text())
    return {int(it): float(rate) for it, rate in found}
