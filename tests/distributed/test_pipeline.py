"""`dist_caffe train --pipeline K` (distributed/pipeline/: stage.py, master.py; launch.py): the stages as real
processes at a real redis-server train what one process trains, and the errors are one line."""
import os
import subprocess
import sys

import numpy as np
import pytest

from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.proto.binary import read_binary

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def train(solver, *extra, timeout=300):
    env = dict(os.environ)
    env.pop("PCD_REDIS_PASSWORD", None)
    return subprocess.run([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver)] +
                          [str(a) for a in extra], capture_output=True, text=True, env=env, timeout=timeout)


def weights(path):
    model = caffe_pb2.NetParameter()
    read_binary(str(path), model)
    return {layer.name: [np.array(b.data, np.float64) for b in layer.blobs] for layer in model.layer if layer.blobs}


def relative(a, b):
    """|a - b| / |a| over every blob of the model at once, and the worst blob's own."""
    x = np.concatenate([w.ravel() for name in sorted(a) for w in a[name]])
    y = np.concatenate([w.ravel() for name in sorted(a) for w in b[name]])
    worst = max(np.linalg.norm(p - q) / np.linalg.norm(p) for name in a for p, q in zip(a[name], b[name]))
    return np.linalg.norm(x - y) / np.linalg.norm(x), worst


@pytest.mark.parametrize("stages, micro", [(2, None), (3, 4)])
def test_the_pipeline_trains_what_one_process_trains(make_solver, tmp_path, stages, micro):
    """Same solver, seed and data: the snapshot after 20 iterations is one process's to rounding (the micro-batches
    add their gradients in another order than one batch's GEMMs: 2 iterations agree to 1e-6 per blob, 20 to 1e-5
    over the model, as Caffe's own iter_size does)."""
    for iterations, tolerance in ((2, 1e-6), (20, 1e-5)):
        one = train(make_solver(max_iter=iterations, snapshot_prefix=str(tmp_path / "one")))
        assert one.returncode == 0, one.stderr[-3000:]
        extra = ["--micro-batches", micro] if micro else []
        piped = train(make_solver(max_iter=iterations, snapshot_prefix=str(tmp_path / "pipe")), "--pipeline", stages,
                      "--stats", tmp_path / "stats.json", *extra)
        assert piped.returncode == 0, piped.stderr[-3000:]
        assert "Optimization Done after %d iterations." % iterations in piped.stderr
        assert all("[stage %d] " % s in piped.stderr for s in range(stages)), piped.stderr[-3000:]
        whole, worst = relative(weights(tmp_path / ("one_iter_%d.caffemodel" % iterations)),
                                weights(tmp_path / ("pipe_iter_%d.caffemodel" % iterations)))
        assert (worst if iterations == 2 else whole) < tolerance, (iterations, whole, worst)
    assert (tmp_path / "pipe_iter_20.solverstate").exists()
    assert "Test net output #0: accuracy" in piped.stderr


def test_a_batch_that_does_not_divide_into_the_micro_batches_is_one_line(make_solver):
    run = train(make_solver(max_iter=5), "--pipeline", 2, "--micro-batches", 5)
    errors = [line for line in run.stderr.splitlines() if line.startswith("dist_caffe: ")]
    assert run.returncode == 1 and len(errors) == 1, run.stderr[-3000:]
    assert errors[0] == "dist_caffe: error: --micro-batches 5 does not divide the batch of 32 (top 'data'): give a " \
        "divisor of it", errors


def test_more_stages_than_the_layers_allow_is_one_line(make_solver):
    run = train(make_solver(max_iter=5), "--pipeline", 9)
    errors = [line for line in run.stderr.splitlines() if line.startswith("dist_caffe: ")]
    assert run.returncode == 1 and len(errors) == 1, run.stderr[-3000:]
    assert "cannot be cut into 9 stages" in errors[0] and "at most 5 stages" in errors[0], errors


@pytest.mark.parametrize("extra", [["--workers", "2"], ["--mode", "sync"], ["--tau", "2"]])
def test_stages_times_replicas_is_refused_in_one_line(make_solver, extra):
    run = train(make_solver(max_iter=5), "--pipeline", 2, *extra)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == ["dist_caffe: error: --pipeline with data-parallel --workers/--mode: "
                                               "K stages x N replicas is not supported yet; give one of them"]
