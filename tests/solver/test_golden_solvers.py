"""Every solver case of the real Caffe (tests/fixtures/golden/solvers): the same losses, learning rates, parameters and
history after 10 iterations; Caffe's own .solverstate restores and continues like an uninterrupted run; our
snapshot files parse with the schema and look like Caffe's; the log lines are Caffe's."""
import io
import json
import logging
import re

import numpy as np
import pytest

from pycaffe_dist.proto.binary import read_binary
from pycaffe_dist.io.load import read_solver
from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.solver.lr_policy import learning_rate
from pycaffe_dist.pycaffe import Solver
from tests.conftest import GOLDEN, load_npz

SOLVERS = GOLDEN / "solvers"
CASES = sorted(json.loads((SOLVERS / "manifest.json").read_text())["cases"])


def meta(case):
    return json.loads((SOLVERS / case / "case.json").read_text())


def make_solver(case, tmp_path, monkeypatch, weights=True):
    """Caffe's run: cwd = the case dir, `caffe train -solver solver.prototxt -weights init.caffemodel`; our
    snapshots go to tmp_path (the fixtures are read-only)."""
    monkeypatch.chdir(SOLVERS / case)
    param = read_solver("solver.prototxt")
    param.snapshot_prefix = str(tmp_path / "snap")
    if weights:
        param.weights.append("init.caffemodel")
    return Solver(param)


def params_of(solver):
    return {"param/%s/%d" % (name, i): blob.data.copy() for name, blobs in solver.net.params.items()
            for i, blob in enumerate(blobs)}


@pytest.mark.parametrize("case", CASES)
def test_learning_rates_are_caffes_exact_floats(case):
    param = read_solver(SOLVERS / case / "solver.prototxt")
    step = 0
    for row in meta(case)["per_iteration"]:
        rate, step = learning_rate(param, row["iter"], step)
        assert float(rate) == row["lr"], (case, row["iter"])


@pytest.mark.parametrize("case", CASES)
def test_ten_iterations_match_caffe(case, tmp_path, monkeypatch):
    m = meta(case)
    tol = m["tolerance"]
    solver = make_solver(case, tmp_path, monkeypatch)
    for row in m["per_iteration"]:
        assert solver.lr == row["lr"]
        solver.step(1)
        assert float(solver.rate) == row["lr"]
        loss = float(solver.net.blobs["loss"].data)
        assert loss == pytest.approx(row["loss_last_forward"], rel=tol["loss"]["rtol"], abs=tol["loss"]["atol"])
    got = params_of(solver)
    for key, want in load_npz(SOLVERS / case / "params_iter10.npz").items():
        np.testing.assert_allclose(got[key], want, **tol["params_iter10"], err_msg=key)
    state = load_npz(SOLVERS / case / "solverstate_iter10.npz")
    assert solver.iter == int(state["iter"]) == 10 and solver.current_step == int(state["current_step"])
    history = [state["history/%d" % i] for i in range(len(solver.history))]
    assert len(history) == len([k for k in state if k.startswith("history/")])
    for i, (ours, theirs) in enumerate(zip(solver.history, history)):
        # AdaGrad/RMSProp/AdaDelta/Adam histories hold squared gradients: small values, compared on their scale.
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6 * max(1.0, np.abs(theirs).max()),
                                   err_msg="history/%d" % i)


@pytest.mark.parametrize("case", CASES)
def test_caffes_solverstate_restores_and_continues(case, tmp_path, monkeypatch):
    """Restore snap_iter_10.solverstate (Caffe's: it names snap_iter_10.caffemodel in the case dir), train on to
    15, and compare with our run from init.caffemodel straight to 15: the data (train and test cursors) must be
    where the uninterrupted run has it."""
    whole = make_solver(case, tmp_path, monkeypatch)
    whole.step(15)
    resumed = make_solver(case, tmp_path, monkeypatch, weights=False)
    resumed.restore("snap_iter_10.solverstate")
    assert resumed.iter == 10
    resumed.step(5)
    ours, theirs = params_of(whole), params_of(resumed)
    for key in ours:
        np.testing.assert_allclose(theirs[key], ours[key], rtol=1e-4, atol=1e-6, err_msg=key)
    assert float(resumed.net.blobs["loss"].data) == pytest.approx(float(whole.net.blobs["loss"].data), rel=1e-5)
    assert resumed.test_scores[0][0][1] == whole.test_scores[0][0][1]          # test at 10: same batches


def test_our_snapshots_parse_and_mirror_caffes(tmp_path, monkeypatch):
    solver = make_solver("adam", tmp_path, monkeypatch)
    solver.solve()                          # snapshot: 10 in the solver file
    ours = read_binary(tmp_path / "snap_iter_10.caffemodel", caffe_pb2.NetParameter())
    theirs = read_binary(SOLVERS / "adam" / "snap_iter_10.caffemodel", caffe_pb2.NetParameter())
    assert [(l.name, l.type, [tuple(b.shape.dim) for b in l.blobs]) for l in ours.layer] == \
        [(l.name, l.type, [tuple(b.shape.dim) for b in l.blobs]) for l in theirs.layer]
    state = read_binary(tmp_path / "snap_iter_10.solverstate", caffe_pb2.SolverState())
    caffes = read_binary(SOLVERS / "adam" / "snap_iter_10.solverstate", caffe_pb2.SolverState())
    assert (state.iter, state.current_step, len(state.history)) == (caffes.iter, caffes.current_step, 8)
    assert state.learned_net == str(tmp_path / "snap_iter_10.caffemodel")
    assert [tuple(h.shape.dim) for h in state.history] == [tuple(h.shape.dim) for h in caffes.history]
    (tmp_path / "x").mkdir()
    again = make_solver("adam", tmp_path / "x", monkeypatch, weights=False)
    again.restore(tmp_path / "snap_iter_10.solverstate")
    for key, value in params_of(solver).items():
        np.testing.assert_array_equal(params_of(again)[key], value)


NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|inf")


def solver_lines(lines):
    """The solver's lines from 'Solving' on, without the data reader's and the timing numbers."""
    start = next(i for i, line in enumerate(lines) if line.startswith("Solving"))
    skip = ("Restarting data prefetching", "Waiting for data")
    return [re.sub(r"\(\S+ iter/s, \S+ iters\)", "(timing)", line) for line in lines[start:]
            if not any(s in line for s in skip)]


@pytest.mark.parametrize("case", ["sgd_clip_gradients", "sgd_lr_multistep", "sgd_iter_size2", "adam"])
def test_log_lines_are_caffes(case, tmp_path, monkeypatch):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("pycaffe_dist.solver")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        make_solver(case, tmp_path, monkeypatch).solve()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    caffe_log = [re.sub(r"^I \S+\] ", "", line) for line in (SOLVERS / case / "caffe_train.log").read_text()
                 .splitlines() if "caffe.cpp" not in line]      # the solver's lines, not the command's
    ours = solver_lines(stream.getvalue().replace(str(tmp_path) + "/", "").splitlines())
    theirs = solver_lines(caffe_log)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert NUMBER.sub("#", a) == NUMBER.sub("#", b)
        for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
            assert float(x) == pytest.approx(float(y), rel=2e-5), (a, b)
