"""A job's description, as the master publishes it and workers read it: the solver with its train net inlined
(so that a worker needs nothing but the data paths), the mode and its options, and the learnable blobs' names
and shapes. JSON, never pickle. And a job's end, as every kind of master ends it (end_job)."""
import json
import os
import secrets
import time

from google.protobuf import text_format

from ..errors import StoreError
from ..io.load import read_net
from ..proto import caffe_pb2
from .store import job_ids

SPEC_VERSION = 1


def find_job(urls, job):
    """The job to join or resume: the one given, or the only one on the (first) server."""
    if job:
        return job
    found = job_ids(urls.split(",")[0])
    if len(found) != 1:
        raise StoreError("%s jobs on this Redis%s: give --job" % ("no" if not found else len(found),
                                                                 "" if not found else " (%s)" % ", ".join(found)))
    return found[0]


def new_job_id(net_name):
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in (net_name or "net").lower())[:24] or "net"
    return "%s-%s" % (stem, secrets.token_hex(3))


def inline_nets(param):
    """A copy of the solver whose train and test nets are inlined (net -> net_param, train_net ->
    train_net_param, test_net -> test_net_param), read as Caffe reads them, relative to the working directory."""
    p = caffe_pb2.SolverParameter()
    p.CopyFrom(param)
    if p.HasField("net"):
        p.net_param.CopyFrom(read_net(p.net))
        p.ClearField("net")
    if p.HasField("train_net"):
        p.train_net_param.CopyFrom(read_net(p.train_net))
        p.ClearField("train_net")
    for path in list(p.test_net):
        p.test_net_param.add().CopyFrom(read_net(path))
    p.ClearField("test_net")
    return p


def worker_solver(solver_text, slot):
    """The solver a worker runs: the job's, without tests, snapshots, display or finetuning files (the master does
    those), with a random seed of its own when the job has one (so that workers' dropout and shuffles differ)."""
    p = caffe_pb2.SolverParameter()
    text_format.Parse(solver_text, p)
    for field in ("test_net_param", "test_iter", "test_state", "weights"):
        p.ClearField(field)
    p.test_interval = 0
    p.test_initialization = False
    p.snapshot = 0
    p.snapshot_after_train = False
    p.display = 0
    if p.random_seed >= 0:
        p.random_seed = p.random_seed + 1 + slot
    return p


def make_spec(param, mode, options, names, shapes, heartbeat_s, workers):
    return {"version": SPEC_VERSION, "solver": text_format.MessageToString(param), "mode": mode,
            "options": options, "blobs": [{"name": n, "shape": list(s)} for n, s in zip(names, shapes)],
            "heartbeat_s": heartbeat_s, "workers": workers, "cwd": os.getcwd()}


def check_spec(spec, where):
    if not isinstance(spec, dict) or spec.get("version") != SPEC_VERSION:
        raise StoreError("%s: not a job spec of this version (%r)" % (where, spec.get("version") if isinstance(
            spec, dict) else spec))
    for field in ("solver", "mode", "options", "blobs", "heartbeat_s", "workers"):
        if field not in spec:
            raise StoreError("%s: the job spec has no %r" % (where, field))
    return spec


def wait_for_spec(store, job, wait_s, kind, what):
    """The job's spec once its master has published it (waiting up to wait_s), checked. Its "kind" (absent for the
    data-parallel modes, "pipeline", "sandblaster") must be `kind`: a worker of another kind is refused in one line
    (`what` names the kind expected)."""
    deadline = time.monotonic() + wait_s
    while True:
        spec = store.job_spec()
        if spec is not None:
            spec = check_spec(spec, "job %s" % job)
            if spec.get("kind") != kind:
                raise StoreError("job %s is not %s: it is of mode %s, whose workers this command does not run"
                                 % (job, what, spec.get("mode")))
            return spec
        if time.monotonic() > deadline:
            raise StoreError("job %s has not been published on %s within %.0f s" % (job, store.urls[0], wait_s))
        time.sleep(0.2)


def end_job(store, controls, names, wait_s, stats_path=None, summary=None, keep=False):
    """A master's last act: mark the job done, send stop to each process's control queue, wait up to wait_s for
    their heartbeats (names) to lapse, write the stats (summary() as JSON) where asked, and remove the job's keys
    unless `keep`."""
    stop_processes(store, controls, names, wait_s)
    if stats_path:
        with open(stats_path, "w") as f:
            json.dump(summary(), f, indent=1)
    if not keep:
        store.remove_job()


def stop_processes(store, controls, names, wait_s):
    """Mark the job done, send stop to each process's control queue, and wait up to wait_s until none of the
    processes `names` beats its heart any more."""
    store.finish_job()
    for queue in controls:
        store.reply_to(queue, {"status": "stop"})
    deadline = time.monotonic() + wait_s
    names = list(names)
    while names and time.monotonic() < deadline:
        names = [n for n, alive in zip(names, store.workers_alive(names)) if alive]
        time.sleep(0.05)
