"""Reading Caffe-format training logs (solver/training_log.py parse_log): times from glog's prefix, and lines
that cannot be read named."""
import pytest

from pycaffe_dist.errors import DataError
from pycaffe_dist.solver.training_log import parse_log


def test_times_across_new_year_and_microseconds_as_written(tmp_path):
    (tmp_path / "t.log").write_text(
        "I1231 23:59:59.004636  42 solver.cpp:218] Iteration 0 (0 iter/s, 0.01s/20 iters), loss = 2.5\n"
        "I0101 00:00:01.000001  42 solver.cpp:218] Iteration 20, loss = 1.5\n")
    assert parse_log(tmp_path / "t.log")["train"] == [(0, 0.0, 2.5), (20, 1.995365, 1.5)]


@pytest.mark.parametrize("line, message", [
    ("I1331 10:00:00.000000  42 solver.cpp:218] Iteration 0, loss = 1\n", r"t.log:1: the time stamp .* is no date"),
    ("Iteration 5, loss = high\n", r"t.log:1: 'high' is not a number"),
    ("Iteration 5, lr = 0.cpp\n", r"t.log:1: '0.cpp' is not a number"),
    ("    Test net output #0: ip2 = ip2\n", r"t.log:1: 'ip2' is not a number"),
])
def test_lines_that_cannot_be_read_are_named(tmp_path, line, message):
    """float() and datetime() raised ValueError (found by tests/fuzz)."""
    (tmp_path / "t.log").write_text(line)
    with pytest.raises(DataError, match=message):
        parse_log(tmp_path / "t.log")


def test_files_that_cannot_be_read(tmp_path):
    with pytest.raises(DataError, match=r"none.log: no such log file"):
        parse_log(tmp_path / "none.log")
    with pytest.raises(DataError, match=r"cannot read the log"):
        parse_log(tmp_path)
