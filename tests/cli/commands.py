"""Running `dist_caffe` as a user does (a real process) and checking that an error is one clean line."""
import subprocess
import sys

from tests.conftest import REPO


def dist_caffe(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pycaffe_dist", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={"PYTHONPATH": str(REPO)})


def assert_clean_error(run, *fragments):
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    lines = [l for l in run.stderr.splitlines() if l.startswith("dist_caffe: error:")]
    assert len(lines) == 1, run.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
