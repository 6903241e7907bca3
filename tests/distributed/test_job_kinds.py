"""A worker started on a job of another kind (a data-parallel `worker` on a pipeline, a `stage` or a
`sandblaster-worker` on a data-parallel job, ...) stops at once with one line naming the job and its mode
(job.wait_for_spec); before, a plain worker on a pipeline job died of a KeyError."""
import json
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _wait_published(store, timeout=60):
    deadline = time.monotonic() + timeout
    while store.job_spec() is None:
        assert time.monotonic() < deadline, "the job was not published"
        time.sleep(0.1)


def _refused(env, url, job, *verb):
    proc = subprocess.run([sys.executable, "-m", "pycaffe_dist", *verb, "--redis", url, "--job", job],
                          capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def test_workers_of_the_wrong_kind_are_one_line(procs, make_solver, store_for, env, redis_server, tmp_path):
    job = "kinds-dp"
    procs.master(job, make_solver(max_iter=50), "async", 1)
    _wait_published(store_for(job))
    line = _refused(env, redis_server.url, job, "sandblaster-worker", "--id", "0")
    assert line == ("dist_caffe: error: job %s is not a Sandblaster job: it is of mode async, whose workers this "
                    "command does not run" % job)
    line = _refused(env, redis_server.url, job, "stage", "--stage", "0")
    assert line == ("dist_caffe: error: job %s is not a pipeline: it is of mode async, whose workers this command "
                    "does not run" % job)

    job = "kinds-pipe"
    settings = tmp_path / "pipeline.json"
    settings.write_text(json.dumps({"solver": str(make_solver(max_iter=50)), "stages": 2, "redis": redis_server.url,
                                    "job": job}))
    procs.start("pipeline-master", "pipeline-master", "--settings", settings)
    _wait_published(store_for(job))
    line = _refused(env, redis_server.url, job, "worker", "--id", "0")
    assert line == ("dist_caffe: error: job %s is not a data-parallel job: it is of mode pipeline, whose workers "
                    "this command does not run" % job)
    line = _refused(env, redis_server.url, job, "sandblaster-worker", "--id", "0")
    assert "job %s is not a Sandblaster job: it is of mode pipeline" % job in line
