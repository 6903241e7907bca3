"""Running `dist_caffe` as a user does (a real process) and checking that an error is one clean line."""
import os
import subprocess
import sys

from tests.conftest import REPO


def child_env():
    """The environment of a `dist_caffe` child: ours without our PCD_ settings, and this interpreter's sys.path, so
    that packages found through it (pycuda unpacked beside site-packages on a GPU machine, say) are found there
    too; LD_LIBRARY_PATH and PATH stay (the CUDA libraries, redis-server)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PCD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in sys.path if p])
    return env


def dist_caffe(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pycaffe_dist", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=child_env())


def assert_clean_error(run, *fragments):
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    lines = [l for l in run.stderr.splitlines() if l.startswith("dist_caffe: error:")]
    assert len(lines) == 1, run.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
