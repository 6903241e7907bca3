"""`dist_caffe train / test / plot / device-query` as a user runs them, on copies of Caffe's solver cases."""
import json
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from pycaffe_dist.proto.binary import read_binary
from pycaffe_dist.proto import caffe_pb2
from tests.cli.commands import assert_clean_error, child_env, dist_caffe
from tests.conftest import GOLDEN, load_npz

CASE = GOLDEN / "solvers" / "sgd_momentum"
META = json.loads((CASE / "case.json").read_text())
GLOG = re.compile(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \w+\.py:\d+\] (.*)$")


@pytest.fixture
def case(tmp_path):
    """A writable copy of the case (Caffe's run wrote its snapshots beside the solver)."""
    out = tmp_path / "case"
    shutil.copytree(CASE, out)
    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    for name in ("snap_iter_10.caffemodel", "snap_iter_10.solverstate"):
        (out / name).rename(out / ("caffe_" + name))
    return out


def messages(stderr):
    """The messages of a glog-format log; as in Caffe's, a message may go on over several lines (the solver's
    parameters), which do not start with the prefix."""
    out = []
    for line in stderr.splitlines():
        m = GLOG.match(line)
        assert m or out, "the log starts with a line without glog's prefix: %r" % line
        if m:
            out.append(m.group(1))
    return out


def params(path):
    net = read_binary(path, caffe_pb2.NetParameter())
    return {"param/%s/%d" % (l.name, i): np.array(b.data, np.float32).reshape(tuple(b.shape.dim))
            for l in net.layer for i, b in enumerate(l.blobs)}


def test_train_reproduces_caffes_log_and_weights(case):
    run = dist_caffe("train", "--solver", "solver.prototxt", "--weights", "init.caffemodel", "--log", "train.log",
                     cwd=case)
    assert run.returncode == 0, run.stderr
    lines = messages(run.stderr)
    assert (case / "train.log").read_text().splitlines() == run.stderr.splitlines()
    losses = [float(m.group(1)) for m in map(re.compile(r"^Iteration \d+ \(.*\), loss = (\S+)$").match, lines) if m]
    assert losses == pytest.approx([row["loss_display"] for row in META["per_iteration"]], rel=1e-5)
    assert "Iteration 10, loss = %g" % META["final_forward_after_iter10"]["loss_display_final_forward"] in lines
    accuracy = [float(l.rsplit(" ", 1)[1]) for l in lines if l.startswith("    Test net output #0: accuracy")]
    assert accuracy == pytest.approx([META["tests"][k]["accuracy"] for k in ("0", "5", "10")], rel=1e-5)
    assert lines[-2:] == ["Optimization Done.", "Optimization Done."] and "Finetuning from init.caffemodel" in lines
    got = params(case / "snap_iter_10.caffemodel")
    for key, want in load_npz(CASE / "params_iter10.npz").items():
        np.testing.assert_allclose(got[key], want, rtol=1e-4, atol=1e-6)


def test_resume_from_a_snapshot_equals_the_uninterrupted_run(case):
    assert dist_caffe("train", "--solver", "solver.prototxt", "--weights", "init.caffemodel", cwd=case).returncode == 0
    whole = params(case / "snap_iter_10.caffemodel")
    first = dist_caffe("train", "--solver", "solver.prototxt", "--weights", "init.caffemodel", "--iterations", "7",
                       cwd=case)
    assert first.returncode == 0 and (case / "snap_iter_7.solverstate").exists()     # snapshot_after_train
    second = dist_caffe("train", "--solver", "solver.prototxt", "--snapshot", "snap_iter_7.solverstate", cwd=case)
    assert second.returncode == 0, second.stderr
    assert "Resuming from snap_iter_7.solverstate" in messages(second.stderr)
    for key, value in params(case / "snap_iter_10.caffemodel").items():
        np.testing.assert_array_equal(value, whole[key], err_msg=key)


def long_solver(case):
    """The case's solver, run long enough (tests included) to be interrupted."""
    text = (case / "solver.prototxt").read_text()
    for field, value in (("max_iter", 2500), ("display", 500), ("test_interval", 1000), ("snapshot", 0)):
        text = re.sub(r"(?m)^%s: .*$" % field, "%s: %d" % (field, value), text)
    (case / "long.prototxt").write_text(text)
    return "long.prototxt"


@pytest.mark.parametrize("effect", ["snapshot", "stop"])
def test_sigint_leaves_a_snapshot_that_resumes_to_the_same_result(case, effect):
    """SIGINT after the first display line: `snapshot` writes one and trains on (Caffe's effect), `stop` ends after
    the iteration and Solve's snapshot_after_train writes one; resuming from it ends where an uninterrupted run
    does, bit for bit."""
    solver = long_solver(case)
    proc = subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "train", "--solver", solver, "--weights",
                             "init.caffemodel", "--sigint_effect", effect], cwd=case, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "Iteration 500 (" in line:
            proc.send_signal(signal.SIGINT)
            break
    seen += proc.stderr.readlines()
    assert proc.wait(timeout=300) == 0, "".join(seen[-5:])
    lines = messages("".join(seen))
    snaps = sorted(case.glob("snap_iter_*.solverstate"), key=lambda p: int(re.search(r"_(\d+)\.", p.name).group(1)))
    interrupted = int(re.search(r"_iter_(\d+)\.", snaps[0].name).group(1))
    assert 0 < interrupted < 2500, lines[-5:]
    if effect == "snapshot":
        assert [s.name for s in snaps] == ["snap_iter_%d.solverstate" % interrupted, "snap_iter_2500.solverstate"]
        reference = params(case / "snap_iter_2500.caffemodel")
    else:
        assert "Optimization stopped early." in lines and len(snaps) == 1
        whole = dist_caffe("train", "--solver", solver, "--weights", "init.caffemodel", cwd=case)
        assert whole.returncode == 0, whole.stderr
        reference = params(case / "snap_iter_2500.caffemodel")
        (case / "snap_iter_2500.caffemodel").unlink()
    resumed = dist_caffe("train", "--solver", solver, "--snapshot", snaps[0].name, cwd=case)
    assert resumed.returncode == 0, resumed.stderr
    for key, value in params(case / "snap_iter_2500.caffemodel").items():
        np.testing.assert_array_equal(value, reference[key], err_msg=key)


def test_test_verb_scores_per_batch_and_mean(case):
    run = dist_caffe("test", "--model", "net.prototxt", "--weights", "caffe_snap_iter_10.caffemodel",
                     "--iterations", "8", cwd=case)
    assert run.returncode == 0, run.stderr
    lines = messages(run.stderr)
    assert lines[1] == "Running for 8 iterations."
    assert len([l for l in lines if l.startswith("Batch ")]) == 16 and lines[2].startswith("Batch 0, accuracy = ")
    want = META["tests"]["10"]
    assert lines[-3] == "Loss: %g" % want["loss"]
    assert lines[-2:] == ["accuracy = %g" % want["accuracy"],
                          "loss = %g (* 1 = %g loss)" % (want["loss"], want["loss"])]


def test_plot_reads_caffes_log_and_ours(case, tmp_path):
    run = dist_caffe("plot", case / "caffe_train.log", "-o", tmp_path / "caffe.png")
    assert run.returncode == 0, run.stderr
    assert "last train loss: 2.23408 (iteration 10)" in run.stdout
    assert "last test #0 accuracy: 0.136719 (iteration 10)" in run.stdout
    assert (tmp_path / "caffe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert dist_caffe("train", "--solver", "solver.prototxt", "--weights", "init.caffemodel", "--log", "ours.log",
                      cwd=case).returncode == 0
    run = dist_caffe("plot", case / "ours.log")                 # default output: the log's name, .png
    assert run.returncode == 0 and (case / "ours.png").exists()
    assert "last test #0 accuracy: 0.136719 (iteration 10)" in run.stdout


def test_plot_refuses_a_file_without_training_lines(tmp_path):
    (tmp_path / "x.log").write_text("hello\n")
    assert_clean_error(dist_caffe("plot", tmp_path / "x.log"), "x.log: no training loss or test output lines")


def test_train_errors_are_one_line(case):
    assert_clean_error(dist_caffe("train", "--solver", "solver.prototxt", "--weights", "a.caffemodel",
                                  "--snapshot", "b.solverstate", cwd=case),
                       "give a snapshot to resume training or weights to finetune but not both")
    assert_clean_error(dist_caffe("train", "--solver", "missing.prototxt", cwd=case), "missing.prototxt")
    assert_clean_error(dist_caffe("train", "--solver", "solver.prototxt", "--snapshot", "nope.solverstate",
                                  cwd=case), "nope.solverstate: no such file")
    run = dist_caffe("train", "--solver", "solver.prototxt", "--sigint_effect", "later", cwd=case)
    assert run.returncode == 2 and "invalid signal effect 'later'" in run.stderr


def test_progress_line_on_a_terminal_keeps_the_log_lines_whole(case):
    import os
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "train", "--solver", long_solver(case),
                             "--weights", "init.caffemodel", "--log", "train.log"], cwd=case, stderr=slave,
                            stdout=subprocess.DEVNULL, env=child_env())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:          # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    screen = b"".join(chunks).decode()
    assert re.search(r"\[iter \d+/2500\] loss \S+  lr 0\.1  \d+ images/s  ETA \d:\d\d:\d\d", screen)
    # What the terminal shows once the progress line is erased: exactly the log file's lines.
    shown = [re.sub(r"^.*\r\x1b\[K", "", line) for line in screen.replace("\r\n", "\n").split("\n")]
    assert [l for l in shown if l] == (case / "train.log").read_text().splitlines()


def test_time_prints_caffe_style_per_layer_timings(tmp_path):
    net = GOLDEN / "nets" / "lenet" / "net.prototxt"
    plot = tmp_path / "layers.png"
    run = dist_caffe("time", "--model", net, "--iterations", 2, "--threads", 1, "--plot", plot)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "Testing for 2 iterations." in out and "Iteration: 2 forward-backward time:" in out
    for layer in ("conv1", "pool1", "conv2", "ip1", "relu1", "ip2", "loss"):
        assert "%s\tforward:" % layer in out and "%s\tbackward:" % layer in out, layer
    assert "Average Forward-Backward:" in out and "Total Time:" in out
    assert "Average time per layer type (forward + backward):" in out
    assert any(l.strip().startswith("Convolution\t  2 layers") for l in out.splitlines())
    loss = float(next(l for l in out.splitlines() if l.startswith("Initial loss:")).split()[-1])
    assert abs(loss - 2.302585) < 1e-3          # zero inputs: every class equally likely, loss = ln 10
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_shows_the_wait_for_prefetched_data(tmp_path):
    case = GOLDEN / "solvers" / "sgd_momentum"            # a Data layer on the LMDB Caffe wrote
    run = dist_caffe("time", "--model", case / "net.prototxt", "--iterations", 3, "--threads", 1, cwd=case)
    assert run.returncode == 0, run.stderr
    line = next(l for l in run.stdout.splitlines() if l.startswith("Average wait for prefetched data:"))
    wait_ms, share = float(line.split()[5]), float(line.split("(")[1].split("%")[0])
    assert wait_ms >= 0 and 0 <= share <= 100


def test_time_rejects_zero_iterations():
    run = dist_caffe("time", "--model", GOLDEN / "nets" / "lenet" / "net.prototxt", "--iterations", 0)
    assert_clean_error(run, "--iterations must be at least 1")


def test_a_loss_that_turns_nan_is_said_once(case):
    """Caffe trains on and says nothing; we train on too (it is Caffe's run) but say it, once."""
    text = re.sub(r"(?m)^base_lr: .*$", "base_lr: 1e6", (case / "solver.prototxt").read_text())
    (case / "wild.prototxt").write_text(text)
    run = dist_caffe("train", "--solver", "wild.prototxt", "--weights", "init.caffemodel", cwd=case)
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if "training has diverged" in line]
    assert len(warnings) == 1, run.stderr[-2000:]
    assert re.search(r"Iteration \d+: loss = (nan|inf|-nan): training has diverged .* lower base_lr", warnings[0])
