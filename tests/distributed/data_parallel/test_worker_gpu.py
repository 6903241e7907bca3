"""Workers on a GPU: `train --workers N --gpu 0` (N workers sharing GPU 0, each with its own context and stream on
a real GPU), in every mode, on the emulated device everywhere and on the real one where there is one (skipped
with the reason elsewhere). W moves between the device and the workers' pinned buffers (worker.ExchangeBuffers)."""
import json
import os
import subprocess
import sys

import pytest

from pycaffe_dist.distributed.data_parallel import modes
from tests.distributed.test_launch import _running

pytestmark = [pytest.mark.redis, pytest.mark.slow]
MODES = list(modes.MODES)       # every data-parallel mode, gossip and local SGD among them


def _real_gpu_or_skip():
    from tests.cli.test_training_gpu import NO_GPU
    if NO_GPU is not None:
        pytest.skip("no GPU: " + NO_GPU)


def use_device(monkeypatch, device):
    """The processes a test starts from now on compute on `device` ("emulated", or "cuda": skipped without a
    GPU) when given --gpu."""
    if device == "emulated":
        monkeypatch.setenv("PCD_DEVICE", "emulated")
    else:
        _real_gpu_or_skip()
        monkeypatch.delenv("PCD_DEVICE", raising=False)


@pytest.mark.parametrize("device", ["emulated", "cuda"])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_with_workers_sharing_one_gpu(make_solver, tmp_path, device, mode):
    env = dict(os.environ)
    env.pop("PCD_REDIS_PASSWORD", None)
    if device == "emulated":
        env["PCD_DEVICE"] = "emulated"
    else:
        _real_gpu_or_skip()
        env.pop("PCD_DEVICE", None)
    job = "gpu-%s-%s" % (device, mode)
    workers = 2 if device == "emulated" else 4
    proc = subprocess.run([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(make_solver(max_iter=200)),
                           "--workers", str(workers), "--gpu", "0", "--mode", mode, "--job", job, "--stats",
                           str(tmp_path / "stats.json")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for i in range(workers):
        assert "[worker %d] computing on GPU 0: " % i in proc.stderr, proc.stderr[-3000:]
    if device == "emulated":
        assert "[worker 0] computing on GPU 0: emulated GPU" in proc.stderr
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["mode"] == mode and stats["tests"][-1]["scores"]["accuracy"] > 0.8, stats["tests"][-1]
    assert not _running("--job " + job)
