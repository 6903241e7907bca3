"""The wire, attacked as a user with the Redis password (or a bug) would: one fault each on a running job (a
password-protected Redis, the password in the URL as users give it, a master and two workers started by hand).
Each test asserts the line, the exit codes, that every process ended within 60 s, that no key of the job is left
and that no line holds the password."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from ..conftest import os_signal_masks
from .conftest import keys_of, wait_for_merges

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ENDED_WITHIN_S = 60


class Job:
    """A job started by hand: the master and workers of `procs`, with the password in their --redis URL."""

    def __init__(self, procs, redis_server, job, workers=2):
        self.procs, self.job, self.workers = procs, job, workers
        self.password = redis_server.password
        self.url = redis_server.url.replace("redis://", "redis://:%s@" % self.password)
        self.names = ["master"] + ["worker%d" % i for i in range(workers)]

    def start(self, solver, mode="async", *extra, workers_too=True):
        self.procs.start("master", "master", "--redis", self.url, "--job", self.job, "--solver", solver, "--mode",
                         mode, "--workers", self.workers, "--heartbeat", 1.5, "--join-timeout", 8, "--stats",
                         self.procs.tmp / "master.json", *extra)
        if workers_too:
            for i in range(self.workers):
                self.worker(i)

    def worker(self, index, *extra, name=None):
        return self.procs.start(name or "worker%d" % index, "worker", "--redis", self.url, "--job", self.job,
                                "--id", index, "--master-timeout", 30, *extra)

    def ended(self, names=None):
        """{name: exit code}, every process having ended within ENDED_WITHIN_S of now."""
        deadline, codes = time.monotonic() + ENDED_WITHIN_S, {}
        for name in names or self.names:
            try:
                codes[name] = self.procs.procs[name].wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        if None in codes.values():
            # every process's state and log: the one still running is often waiting on another
            pytest.fail("not ended within %d s: %s\n%s" % (ENDED_WITHIN_S, codes, "\n".join(
                "--- %s:\n%s" % (name, self.log(name)[-1500:]) for name in codes)))
        return codes

    def log(self, name):
        return self.procs.log(name)

    def assert_clean(self, client, names=None):
        """No key of the job is left; no process's output holds the password or a traceback."""
        assert keys_of(client, self.job) == []
        for name in names or self.names:
            text = self.log(name)
            assert self.password not in text, "%s printed the password:\n%s" % (name, text[-2000:])
            assert "Traceback" not in text and "internal error" not in text, text[-3000:]


@pytest.fixture
def job(procs, redis_server, request):
    return Job(procs, redis_server, request.node.name.split("[")[0][5:40].replace("_", "-"))


def _overwrite_until_a_worker_stops(job, write, seconds=30):
    """Keep writing the fault (the master writes W again at each merge) until a worker exits."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        write()
        if any(job.procs.procs["worker%d" % i].poll() is not None for i in range(job.workers)):
            return
        time.sleep(0.01)
    pytest.fail("no worker stopped on the damaged W")


@pytest.mark.parametrize("form", ["short", "long", "list", "nan"])
def test_a_damaged_w_stops_every_process_saying_the_data_is_damaged(job, make_solver, store_for, redis_client,
                                                                     form):
    job.start(make_solver(max_iter=100000))
    store = store_for(job.job)
    wait_for_merges(store, 50)
    key = "pcd:%s:W:0" % job.job
    size = redis_client.strlen(key)
    values = np.random.default_rng(0).standard_normal((size - 8) // 4).astype(np.float32)
    values[::7] = np.nan
    # each write only while the key exists (xx): once the master has removed the job's keys, none is made again
    as_list = redis_client.register_script("if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('DEL', KEYS[1]) "
                                           "redis.call('RPUSH', KEYS[1], 'x') end")
    writes = {"short": lambda: redis_client.set(key, b"\0" * 100, xx=True),
              "long": lambda: redis_client.set(key, b"\0" * (64 << 20), xx=True),
              "list": lambda: as_list(keys=[key]),
              "nan": lambda: redis_client.set(key, b"\0" * 8 + values.tobytes(), xx=True)}
    _overwrite_until_a_worker_stops(job, writes[form], seconds=30 if form != "long" else 60)
    codes = job.ended()
    assert codes == {"master": 1, "worker0": 1, "worker1": 1}, codes
    master = job.log("master")
    assert "the job's data on Redis is damaged" in master and key[:-2] in master, master[-2000:]
    assert "lower" not in master.splitlines()[-1]           # not the advice for a rate too high
    assert "the weights at merge" in master                 # the master's own W, on disk
    for i in range(2):
        assert job.log("worker%d" % i).strip().splitlines()[-1].startswith("dist_caffe: "), job.log("worker%d" % i)
    job.assert_clean(redis_client)


def test_a_damaged_result_is_refused_with_a_line_and_its_worker_starts_again(job, make_solver, store_for,
                                                                             redis_client):
    job.start(make_solver(max_iter=1500))
    wait_for_merges(store_for(job.job), 50)
    key = "pcd:%s:x:0:0" % job.job
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:                  # (worker 0 writes its own again each round)
        redis_client.set(key, b"\0" * 12, xx=True)
    assert job.ended() == {"master": 0, "worker0": 0, "worker1": 0}
    master = job.log("master")
    assert "Dropped a message: worker 0's result is not merged: job %s: %s holds 12 bytes" % (job.job, key) in master
    assert job.procs.stats()["count"] == 1500 and job.procs.stats()["refused_messages"] >= 1
    job.assert_clean(redis_client)


@pytest.mark.parametrize("raw, line", [
    (b"not json", "a message that is not JSON"),
    (b"[" * 40 + b"]" * 40, "a message that is not a JSON object"),
    (b" " * (2 << 20), "a message of 2097152 bytes"),
    (b'{"type": "result", "worker": "0", "round": 5, "epoch": "x"}', "whose 'epoch' is 'x'"),
    (b'{"type": "join", "worker": "7", "pid": "abc"}', "whose 'pid' is 'abc'"),
], ids=["not-json", "nested-list", "2MiB", "epoch-text", "pid-text"])
def test_a_bad_inbox_message_is_dropped_with_a_line_and_the_job_goes_on(job, make_solver, store_for, redis_client,
                                                                          raw, line):
    job.start(make_solver(max_iter=600))
    wait_for_merges(store_for(job.job), 50)
    redis_client.lpush("pcd:%s:inbox" % job.job, raw)
    assert job.ended() == {"master": 0, "worker0": 0, "worker1": 0}
    master = job.log("master")
    dropped = [l for l in master.splitlines() if "Dropped a message: pcd:%s:inbox: " % job.job in l]
    assert len(dropped) == 1 and line in dropped[0], master[-2000:]
    stats = job.procs.stats()
    assert stats["count"] == 600 and stats["refused_messages"] == 1
    job.assert_clean(redis_client)


def test_an_inbox_of_the_wrong_type_stops_every_process_naming_the_key(job, make_solver, store_for, redis_client):
    job.start(make_solver(max_iter=100000))
    wait_for_merges(store_for(job.job), 50)
    inbox = "pcd:%s:inbox" % job.job
    redis_client.delete(inbox)
    redis_client.hset(inbox, "a", "b")
    codes = job.ended()
    assert codes["master"] == 1, codes
    master = job.log("master")
    assert "%s holds a value of the wrong type" % inbox in master, master[-3000:]
    for i in range(2):
        assert codes["worker%d" % i] == 1
        last = job.log("worker%d" % i).strip().splitlines()[-1]
        assert inbox in last or "stopped by its master" in last, last
    job.assert_clean(redis_client)


@pytest.mark.parametrize("forged", [["0"], ["0", "1"]])
def test_a_result_from_the_future_is_refused_and_parks_nobody(job, make_solver, store_for, redis_client, forged):
    job.start(make_solver(max_iter=1000))
    wait_for_merges(store_for(job.job), 100)
    for worker in forged:
        redis_client.lpush("pcd:%s:inbox" % job.job, json.dumps(
            {"type": "result", "worker": worker, "round": 10 ** 9, "epoch": 1, "base": 0}))
    assert job.ended() == {"master": 0, "worker0": 0, "worker1": 0}
    master = job.log("master")
    for worker in forged:
        assert "a result from worker %s for round 1000000000, where its last was" % worker in master
    rounds = [int(job.log("worker%d" % i).split("worker %d: " % i)[1].split()[0]) for i in range(2)]
    assert min(rounds) > 0.3 * max(rounds), rounds      # worker 0 was not parked
    job.assert_clean(redis_client)


@pytest.mark.parametrize("field, value, line", [
    ("solver", "base_lr: {", "the job spec's solver does not parse"),
    ("mode", 7, "the job spec's 'mode' is 7, where a string"),
    ("heartbeat_s", "x", "the job spec's 'heartbeat_s' is 'x', where a number"),
    ("options", [], "the job spec's 'options' is [], where a JSON object"),
    ("blobs", [{"name": 1}], "the job spec's 'blobs'"),
    ("depth", "1", "the job spec's 'depth' is '1', where an integer"),
    ("options", {"tau": "many"}, "the job spec's mode and options are not this project's"),
])
def test_a_malformed_spec_stops_a_new_worker_with_a_line_naming_the_key(job, make_solver, redis_client, field,
                                                                         value, line):
    job.start(make_solver(max_iter=300), workers_too=False)
    key = "pcd:%s:job" % job.job
    _wait_for(lambda: redis_client.hget(key, "spec") is not None)
    spec = json.loads(redis_client.hget(key, "spec"))
    spec[field] = value
    redis_client.hset(key, "spec", json.dumps(spec))
    job.worker(0)
    codes = job.ended(["worker0", "master"])
    assert codes == {"worker0": 1, "master": 1}
    last = job.log("worker0").strip().splitlines()[-1]
    assert last.startswith("dist_caffe: error: %s: " % key) and line in last, last
    assert "no worker joined within 8 s" in job.log("master")
    job.assert_clean(redis_client, ["worker0", "master"])


PYTHON_LAYER = '''
layer { name: "py" type: "Python" top: "py" python_param { module: "this" layer: "Nope" } }
'''


def test_a_python_layer_named_by_redis_is_never_imported_unless_allowed(job, make_solver, redis_client):
    job.start(make_solver(max_iter=300), workers_too=False)
    key = "pcd:%s:job" % job.job
    _wait_for(lambda: redis_client.hget(key, "spec") is not None)
    spec = json.loads(redis_client.hget(key, "spec"))
    spec["solver"] = spec["solver"].replace("net_param {", "net_param {" + PYTHON_LAYER, 1)
    assert "module" in spec["solver"]
    redis_client.hset(key, "spec", json.dumps(spec))
    job.worker(0)
    job.worker(1, "--python-layers", "this")
    codes = job.ended()
    assert codes == {"master": 1, "worker0": 1, "worker1": 1}, codes
    refused = job.log("worker0")
    assert "Python layer 'py' of module 'this'" in refused and "--python-layers this" in refused
    assert "Beautiful is better than ugly" not in refused           # the module was not imported
    allowed = job.log("worker1")
    assert "Beautiful is better than ugly" in allowed and "module 'this' has no class 'Nope'" in allowed
    job.assert_clean(redis_client, ["worker0", "master"])


def test_a_second_master_and_a_resume_on_a_live_job_are_refused_naming_its_master(job, make_solver, store_for,
                                                                                    redis_client):
    job.start(make_solver(max_iter=6000))           # (it outlasts the resume's wait for the lease: 2.5 s)
    wait_for_merges(store_for(job.job), 50)
    job.procs.start("second", "master", "--redis", job.url, "--job", job.job, "--solver", make_solver())
    job.procs.start("resume", "master", "--redis", job.url, "--job", job.job, "--resume")
    assert job.ended(["second", "resume"]) == {"second": 1, "resume": 1}
    assert "job %s already" % job.job in job.log("second")
    master_pid = job.procs.procs["master"].pid
    assert "job %s already has a live master (pid %d on " % (job.job, master_pid) in job.log("resume")
    assert job.ended() == {"master": 0, "worker0": 0, "worker1": 0}
    assert job.procs.stats()["count"] == 6000
    job.assert_clean(redis_client, job.names + ["second", "resume"])


def assert_takes_sigint(proc):
    """A process that ignores or blocks SIGINT (inherited from this one: tests/conftest.py's sigint_not_ignored)
    never leaves on Ctrl-C: say so now, not after a minute's wait."""
    fields = dict(line.split(":\t", 1) for line in open("/proc/%d/status" % proc.pid).read().splitlines()
                  if ":\t" in line)
    sigint = 1 << (signal.SIGINT - 1)
    for field in ("SigIgn", "SigBlk"):
        assert not int(fields[field], 16) & sigint, "pid %d has SIGINT in %s (%s); this process: handler %r, " \
            "blocked %s, kernel's (ignored, blocked) bits %s" % (
                proc.pid, field, fields[field], signal.getsignal(signal.SIGINT),
                sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), os_signal_masks())


def test_when_every_worker_leaves_the_master_says_so_waits_then_stops_with_a_snapshot(job, make_solver, store_for,
                                                                                        redis_client):
    job.start(make_solver(max_iter=100000))
    wait_for_merges(store_for(job.job), 50)
    for i in range(2):
        assert_takes_sigint(job.procs.procs["worker%d" % i])
        job.procs.procs["worker%d" % i].send_signal(signal.SIGINT)
    codes = job.ended()
    assert codes["master"] == 1
    master = job.log("master")
    assert "Worker 0 left" in master and "Worker 1 left" in master
    assert "No worker is left: waiting up to 8 s (--join-timeout)" in master
    assert "no worker is left, and none joined within 8 s" in master and "the weights at merge" in master
    model = master.split("the weights at merge")[1].split(" are in ")[1].split(" (")[0]
    assert os.path.exists(model)
    job.assert_clean(redis_client)


def test_a_worker_without_job_or_password_says_so_in_one_line_without_secrets(job, redis_server, make_solver,
                                                                              redis_client):
    wrong = redis_server.url.replace("redis://", "redis://:wrong-%s@" % job.password)
    env = dict(job.procs.env)
    env.pop("PCD_REDIS_PASSWORD")
    job.procs.env = env
    started = time.monotonic()
    job.procs.start("wrong", "worker", "--redis", wrong, "--wait", 30)     # a refused password is not waited out
    job.procs.start("nojob", "worker", "--redis", job.url, "--job", "none-here", "--wait", 1)
    assert job.ended(["wrong", "nojob"]) == {"wrong": 1, "nojob": 1}
    assert time.monotonic() - started < 20
    assert "refused the password" in job.log("wrong")
    assert "job none-here has not been published on redis://127.0.0.1:" in job.log("nojob")
    job.assert_clean(redis_client, ["wrong", "nojob"])
    assert "wrong-" not in job.log("wrong")


def _wait_for(condition, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out")
        time.sleep(0.05)


# --- the other kinds of job: their queues have schemas of their own --------------------------------------------

def _start_kind(job, kind, settings, hosts):
    """A Sandblaster or pipeline job by hand: its master from a settings file, `hosts` workers or stages."""
    path = job.procs.tmp / "settings.json"
    path.write_text(json.dumps(dict(settings, redis=job.url, job=job.job, heartbeat_s=1.5, join_timeout_s=8.0,
                                    stats_path=str(job.procs.tmp / "master.json"))))
    job.procs.start("master", "%s-master" % kind, "--settings", path)
    job.names = ["master"]
    for i in range(hosts):
        name = "worker%d" % i
        if kind == "sandblaster":
            job.procs.start(name, "sandblaster-worker", "--redis", job.url, "--job", job.job, "--id", i)
        else:
            job.procs.start(name, "stage", "--redis", job.url, "--job", job.job, "--stage", i)
        job.names.append(name)


def _start_running(job, kind, make_solver, store_for):
    """A long Sandblaster job of 2 workers, or pipeline of 2 stages, once it has run 2 iterations."""
    solver = str(make_solver(max_iter=100000))
    _start_kind(job, kind, {"solver": solver, "workers": 2, "sample_batches": 4, "unit_batches": 1}
                if kind == "sandblaster" else {"solver": solver, "stages": 2, "micro_batches": 2}, 2)
    _wait_for(lambda: (store_for(job.job).progress() or {}).get("count", 0) >= 2)


GARBAGE = [b"not json", b"[]", b'{"type": "sums", "worker": "0", "eval": "x"}', b'{"status": 5}',
           b'{"type": "taken", "worker": "0", "eval": 999999, "unit": 0}', b'{"kind": "forward", "count": "x"}']


@pytest.mark.parametrize("kind", ["sandblaster", "pipeline"])
def test_garbage_on_every_queue_of_a_sandblaster_or_pipeline_job_is_dropped_and_the_job_finishes(
        job, make_solver, store_for, redis_client, kind):
    _start_running(job, kind, make_solver, store_for)
    queues = ["inbox", "go:units", "go:0", "go:1"] if kind == "sandblaster" else \
        ["inbox", "go:stage0-ctl", "go:stage1-ctl", "go:stage1"]
    for queue in queues:
        for raw in GARBAGE:
            redis_client.lpush("pcd:%s:%s" % (job.job, queue), raw)
    time.sleep(1.0)
    job.procs.procs["master"].send_signal(signal.SIGINT)           # then a clean finish, as a user asks it
    assert set(job.ended().values()) == {0}, {n: job.log(n)[-1500:] for n in job.names}
    logs = "".join(job.log(n) for n in job.names)
    assert "Dropped a message: pcd:%s:" % job.job in logs
    assert job.procs.stats()["refused_messages"] >= 1
    job.assert_clean(redis_client)


@pytest.mark.parametrize("kind", ["sandblaster", "pipeline"])
def test_a_failure_reported_on_the_wire_stops_every_process_of_a_sandblaster_or_pipeline_job(
        job, make_solver, store_for, redis_client, kind):
    _start_running(job, kind, make_solver, store_for)
    failure = dict({"worker": "1"} if kind == "sandblaster" else {"stage": 1}, type="error", error="forged failure")
    redis_client.lpush("pcd:%s:inbox" % job.job, json.dumps(failure))
    assert set(job.ended().values()) == {1}
    assert "forged failure" in job.log("master").strip().splitlines()[-1]
    for name in job.names[1:]:
        assert "stopped by its master" in job.log(name).strip().splitlines()[-1], job.log(name)[-1500:]
    job.assert_clean(redis_client)


def _overwrite_for(redis_client, key, seconds=2.0):
    """Write 12 bytes where a blob of the job belongs, while it is there (its owner writes it again)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        redis_client.set(key, b"\0" * 12, xx=True)


def test_damaged_sums_of_a_sandblaster_worker_are_refused_and_their_units_computed_again(
        job, make_solver, store_for, redis_client):
    _start_running(job, "sandblaster", make_solver, store_for)
    _overwrite_for(redis_client, "pcd:%s:x:sum0:0" % job.job)
    time.sleep(0.5)
    job.procs.procs["master"].send_signal(signal.SIGINT)
    assert set(job.ended().values()) == {0}, {n: job.log(n)[-1500:] for n in job.names}
    master = job.log("master")
    assert "sums from worker 0 not added: job %s: pcd:%s:x:sum0:0 holds 12 bytes" % (job.job, job.job) in master
    assert "worker 0's sums were not readable" in master
    job.assert_clean(redis_client)


def test_a_damaged_activation_between_stages_stops_the_pipeline_naming_the_key(job, make_solver, store_for,
                                                                                redis_client):
    _start_running(job, "pipeline", make_solver, store_for)
    _overwrite_for(redis_client, "pcd:%s:x:stage0-act0:0" % job.job, seconds=10.0)
    assert set(job.ended().values()) == {1}
    assert "pcd:%s:x:stage0-act0:0 holds 12 bytes" % job.job in job.log("master").strip().splitlines()[-1]
    job.assert_clean(redis_client)
