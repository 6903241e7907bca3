"""metrics/tensorboard.py: `train --tensorboard DIR` leaves event files that TensorBoard's own reader lists with
every figure of the log's lines; a distributed job's records and summary as scalars; tensorboardX missing is one
line before anything trains."""
import pytest

from pycaffe_dist.metrics.tensorboard import JobScalars, open_writer
from pycaffe_dist.solver.training_log import parse_log
from tests.cli.commands import assert_clean_error, child_env
from tests.metrics.conftest import BATCH, iters_per_s, scalars


def test_a_runs_event_files_hold_every_figure_of_its_log_lines(trained):
    got = scalars(trained.events)
    log = parse_log(trained.log)
    assert sorted(got) == ["test0/accuracy", "test0/loss", "train/images_per_s", "train/loss", "train/lr",
                           "train_output/loss"]
    # each display's smoothed loss, the one after the last update too (Iteration 20, loss = ...)
    assert [it for it, _ in got["train/loss"]] == [0, 5, 10, 15, 20]
    same(got["train/loss"], [(it, loss) for it, _, loss in log["train"]])
    same(got["train/lr"], [(it, lr) for it, _, lr in log["lr"]])
    assert [lr for _, lr in got["train/lr"]] == pytest.approx([0.05, 0.05, 0.025, 0.025])      # (step policy)
    same(got["train_output/loss"], [(it, v) for it, _, _, v in log["outputs"]])
    for net_output in ("accuracy", "loss"):
        want = [(it, v) for it, _, net, name, v in log["test"] if (net, name) == (0, net_output)]
        assert [it for it, _ in want] == [0, 10, 20]
        same(got["test0/%s" % net_output], want)
    # images/s: the display line's iter/s times the batch (none at iteration 0, which has no iterations behind it)
    rates = iters_per_s(trained.log)
    same(got["train/images_per_s"], [(it, rates[it] * BATCH) for it in (5, 10, 15)])


def same(points, want):
    """The same steps, and the values as the log prints them (6 significant digits; the events hold the float32
    figures themselves)."""
    assert [step for step, _ in points] == [step for step, _ in want]
    assert [value for _, value in points] == pytest.approx([value for _, value in want], rel=1e-5, abs=1e-9)


def test_outputs_of_several_elements_get_a_tag_each(tmp_path):
    from pycaffe_dist.metrics.tensorboard import output_tags
    assert output_tags("test1", [(0, "accuracy", 0.5), (1, "prob", 0.25), (2, "prob", 0.75)]) == [
        ("test1/accuracy", 0.5), ("test1/prob/1", 0.25), ("test1/prob/2", 0.75)]


def test_a_jobs_records_become_scalars_and_its_summary_adds_the_tests_they_missed(tmp_path):
    writer = open_writer(str(tmp_path / "tb"))
    job = JobScalars(writer)
    job({"started": False, "count": 0, "workers": {}})                 # waiting for workers: nothing
    record = {"started": True, "mode": "async", "count": 10, "loss": 1.5, "elapsed_s": 2.0, "exchange_share": 0.25,
              "mean_staleness": 1.5, "workers": {"0": 100.0, "1": 50.0},
              "test": {"iter": 0, "net": 1, "time_s": 0.1, "scores": {"accuracy": 0.5}}}
    job(record)
    job(dict(record, loss=9.0))                                         # the same merge read again: not written
    job(dict(record, count=20, loss=1.0, workers={"0": 110.0, "1": "fast"}, exchange_share=None))   # damaged
    # the summary lists every test: net 0's test at 0 (its record was replaced by net 1's at once) and those at 30
    job.finish({"count": 30, "loss": 0.5, "elapsed_s": 6.0, "workers": {"0": 120.0, "1": 60.0},
                "images_per_s": 175.0, "exchange_share": 0.2, "mean_staleness": 1.25,
                "tests": [{"iter": 0, "net": 0, "scores": {"accuracy": 0.25}},
                          {"iter": 0, "net": 1, "scores": {"accuracy": 0.5}},
                          {"iter": 30, "net": 0, "scores": {"accuracy": 0.75, "loss": 0.5}}]})
    writer.close()
    got = scalars(tmp_path / "tb")
    assert got["train/loss"] == [(10, 1.5), (20, 1.0), (30, 0.5)]
    assert got["train/images_per_s"] == [(10, 150.0), (20, 110.0), (30, 175.0)]
    assert got["workers/0/images_per_s"] == [(10, 100.0), (20, 110.0), (30, 120.0)]
    assert got["workers/1/images_per_s"] == [(10, 50.0), (30, 60.0)]
    assert got["job/workers"] == [(10, 2.0), (20, 1.0), (30, 2.0)]
    assert got["job/merges_per_s"] == [(10, 5.0), (20, pytest.approx(10.0)), (30, 5.0)]
    assert got["job/exchange_share"] == [(10, 0.25), (30, pytest.approx(0.2))]
    assert got["job/mean_staleness"] == [(10, 1.5), (20, 1.5), (30, 1.25)]
    assert got["test0/accuracy"] == [(0, 0.25), (30, 0.75)]
    assert got["test1/accuracy"] == [(0, 0.5)]
    assert got["test0/loss"] == [(30, 0.5)]


def test_without_tensorboardx_the_flag_is_one_line_before_anything_trains(trained, tmp_path):
    blocker = tmp_path / "blocked"
    (blocker / "tensorboardX").mkdir(parents=True)
    (blocker / "tensorboardX" / "__init__.py").write_text("raise ImportError('no tensorboardX here')\n")
    import subprocess
    import sys
    env = child_env()
    env["PYTHONPATH"] = str(blocker) + ":" + env["PYTHONPATH"]
    run = subprocess.run([sys.executable, "-m", "pycaffe_dist", "train", "--solver", trained.folder / "solver.prototxt",
                          "--tensorboard", tmp_path / "tb"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert_clean_error(run, "--tensorboard needs tensorboardX: pip install tensorboardX")
    assert "Solving" not in run.stderr and not (tmp_path / "tb").exists()


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    from pycaffe_dist.errors import PycaffeDistError
    with pytest.raises(PycaffeDistError, match="--tensorboard .*file/tb: cannot write the event files there"):
        open_writer(str(tmp_path / "file" / "tb"))
