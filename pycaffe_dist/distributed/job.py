"""A job's description, as the master publishes it and workers read it: the solver with its train net inlined
(so that a worker needs nothing but the data paths), the mode and its options, and the learnable blobs' names
and shapes. JSON, never pickle. And a job's end, as every kind of master ends it (end_job).

A spec read from Redis is checked field by field before anything is built from it (check_spec), and a net in it
that names a Python layer is refused unless its module is on the process's allow-list (--python-layers): importing
a module is running its code, and no code comes from Redis."""
import dataclasses
import json
import os
import secrets
import time
from typing import Callable, Optional

from google.protobuf import text_format

from ..errors import StoreError
from ..io.load import read_net
from ..proto import caffe_pb2
from . import wire
from .redis_client import describe
from .store import job_ids
from .wire import DamagedData

SPEC_VERSION = 1
STOPPED_BY_MASTER = "was stopped by its master: "     # a process's line when its master ends the job on a failure


def stopped_by_master(job, why):
    """The error of a worker or stage whose master stopped the job, saying why (the master's own line)."""
    return StoreError("job %s %s%s" % (job, STOPPED_BY_MASTER, why))


class NoJobYet(StoreError):
    """No job is on the server (yet): a worker may wait for one to be published."""


def find_job(urls, job):
    """The job to join or resume: the one given, or the only one on the (first) server."""
    if job:
        return job
    found = job_ids(urls.split(",")[0])
    if len(found) != 1:
        raise (NoJobYet if not found else StoreError)("%s jobs on this Redis%s: give --job" % (
            "no" if not found else len(found), "" if not found else " (%s)" % ", ".join(found)))
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
    p = parse_text(solver_text, caffe_pb2.SolverParameter(), "the job", "solver")
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


def check_shapes(job, shapes, spec):
    """A worker's learnable blobs against the job's (its spec's): the shapes, or a StoreError saying both."""
    expected = [tuple(b["shape"]) for b in spec["blobs"]]
    if list(shapes) != expected:
        raise StoreError("job %s: this worker's net has learnable blobs %s but the job's are %s"
                         % (job, list(shapes), expected))
    return list(shapes)


def make_spec(param, mode, options, names, shapes, heartbeat_s, workers):
    return {"version": SPEC_VERSION, "solver": text_format.MessageToString(param), "mode": mode,
            "options": options, "blobs": [{"name": n, "shape": list(s)} for n, s in zip(names, shapes)],
            "heartbeat_s": heartbeat_s, "workers": workers, "cwd": os.getcwd()}


SPEC_KINDS = (None, "sandblaster", "pipeline", "allreduce")   # the kinds' names (SpecKind); their fields are their
                                                                # folders'
NET_KINDS = ("sandblaster", "pipeline")     # the kinds whose spec carries nets of their own (net, feed, state)
SPEC_FIELDS = {             # field: (check, required), of every kind's spec
    "solver": wire.required(wire.text(limit=1 << 62)), "mode": wire.required(wire.text()),
    "options": wire.required(lambda v: v if isinstance(v, dict) else _expected("a JSON object")),
    "blobs": wire.required(wire.list_of(lambda b: _blob(b), limit=1 << 20)),
    "heartbeat_s": wire.required(wire.number(0.01, 3600.0)), "workers": wire.required(wire.integer(1, 1 << 20)),
    "cwd": wire.optional(wire.text(limit=4096)), "depth": wire.optional(wire.integer(0, 1)),
    "updates": wire.optional(wire.flag),
}


@dataclasses.dataclass(frozen=True)
class SpecKind:
    """What a kind of job adds to the spec every kind has, declared in its folder (keys.py): its name in the spec's
    "kind" (one of SPEC_KINDS; None: data-parallel, whose specs came first), what it is called in a line, its own
    fields (field: (check, required), as SPEC_FIELDS) and a check of the whole spec (returns it checked; raises
    ValueError saying which of the spec's parts is wrong, and how)."""
    name: Optional[str]
    what: str
    fields: dict = dataclasses.field(default_factory=dict)
    check: Optional[Callable] = None


def _expected(what):
    raise ValueError(what)


def _blob(value):
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError("a list of {name, shape} objects")
    return {"name": value["name"][:1000], "shape": wire.list_of(wire.integer(0, 1 << 31), limit=8)(value.get("shape"))}


def check_spec(spec, where, python_layers=(), kind=None):
    """The spec read from key `where`, checked: its version, every common field of its type, a known kind, the
    fields of `kind` (a SpecKind: the kind the reader runs, which the spec must be; None: those every kind has, for
    a display), a solver text that parses, and no Python layer whose module is not in `python_layers` (the
    allow-list). DamagedData (one line naming the key and the field) otherwise; a spec of another kind than `kind`,
    a StoreError saying which it is."""
    if not isinstance(spec, dict) or spec.get("version") != SPEC_VERSION:
        raise DamagedData("%s: not a job spec of this version (version %s, where %d was expected)" % (
            where, wire.shown(spec.get("version") if isinstance(spec, dict) else spec), SPEC_VERSION))
    checked = dict(spec)
    if spec.get("kind") not in SPEC_KINDS:
        raise DamagedData("%s: the job spec's kind is %s, where one of %s was expected"
                          % (where, wire.shown(spec.get("kind")), ", ".join(map(str, SPEC_KINDS))))
    if kind is not None and spec.get("kind") != kind.name:
        raise WrongKind(where, kind.what, str(spec.get("mode"))[:100])
    for field, (check, required) in dict(SPEC_FIELDS, **(kind.fields if kind is not None else {})).items():
        if field not in spec:
            if required:
                raise DamagedData("%s: the job spec has no %r" % (where, field))
            continue
        try:
            checked[field] = check(spec[field])
        except ValueError as exc:
            raise DamagedData("%s: the job spec's %r is %s, where %s was expected"
                              % (where, field, wire.shown(spec[field]), exc)) from None
    nets = []
    if spec.get("kind") in NET_KINDS:       # protobuf texts, parsed here
        checked["state"] = parse_text(spec.get("state"), caffe_pb2.NetState(), where, "state")
        nets = [parse_text(spec.get(field), caffe_pb2.NetParameter(), where, field) for field in ("net", "feed")]
        checked["net"], checked["feed"] = nets
    if kind is not None and kind.check is not None:
        try:
            checked = kind.check(checked)
        except ValueError as exc:
            raise DamagedData("%s: the job spec's %s" % (where, exc)) from None
    solver = solver_of(checked, where)
    if python_layers is not None:           # (None: a display, which builds nothing)
        check_python_layers(solver_nets(solver) + nets, where, python_layers)
    return checked


class WrongKind(StoreError):
    """A job spec of another kind than the reader runs (a `stage` on a data-parallel job)."""

    def __init__(self, where, what, mode):
        super().__init__("%s: the job is not %s: it is of mode %s, whose workers this command does not run"
                         % (where, what, mode))
        self.what, self.mode = what, mode


def solver_of(spec, where):
    """The SolverParameter of a checked spec's solver text (DamagedData when it does not parse)."""
    return parse_text(spec["solver"], caffe_pb2.SolverParameter(), where, "solver")


def parse_text(text, message, where, what):
    """A protobuf text read from Redis, parsed into `message`; DamagedData naming the key when it does not."""
    if not isinstance(text, str):
        raise DamagedData("%s: the job spec's %s is %s, where a protobuf text was expected"
                          % (where, what, wire.shown(text)))
    try:
        return text_format.Parse(text, message)
    except (text_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise DamagedData("%s: the job spec's %s does not parse: %s" % (where, what, str(exc)[:200])) from None


def python_modules(nets):
    """(layer name, module) of every Python layer of the NetParameters `nets`."""
    return [(layer.name, layer.python_param.module) for net in nets for layer in net.layer
            if layer.type == "Python"]


def solver_nets(param):
    """Every NetParameter a solver holds inline."""
    return [param.net_param, param.train_net_param] + list(param.test_net_param)


def trusted_modules(solver_path):
    """The modules of the Python layers in the user's own solver file (and its nets): what a launcher allows the
    workers it starts to import (--python-layers)."""
    from ..io.load import read_solver
    return sorted({module for _, module in python_modules(solver_nets(inline_nets(read_solver(solver_path))))})


def modules_flag(text):
    """--python-layers MODULE[,MODULE]: the modules a worker may import for a spec's Python layers."""
    return [m.strip() for m in (text or "").split(",") if m.strip()]


def check_python_layers(param_or_nets, where, allowed):
    """Refuse a Python layer whose module is not in `allowed` (a worker given --python-layers), in the solver (or
    the nets) of a spec read from Redis."""
    nets = solver_nets(param_or_nets) if isinstance(param_or_nets, caffe_pb2.SolverParameter) else param_or_nets
    for layer, module in python_modules(nets):
        if module not in allowed:
            raise StoreError("%s: the job's net has a Python layer %r of module %r; a process imports no module "
                             "named by Redis unless it is given --python-layers %s (a module it trusts)" % (
                                 where, layer[:100], module[:100], module[:100] or "MODULE"))


def wait_for_spec(store, job, wait_s, kind, python_layers=()):
    """The job's spec once its master has published it (waiting up to wait_s), checked (check_spec, with the
    Python layers' allow-list). It must be of `kind` (a SpecKind): a worker of another kind is refused in one line."""
    deadline = time.monotonic() + wait_s
    while True:
        spec = store.job_spec()
        if spec is not None:
            try:
                return check_spec(spec, store.key("job"), python_layers, kind)
            except WrongKind as exc:
                raise StoreError("job %s is not %s: it is of mode %s, whose workers this command does not run"
                                 % (job, exc.what, exc.mode)) from None
        if time.monotonic() > deadline:
            raise StoreError("job %s has not been published on %s within %.0f s" % (job, describe(store.urls[0]),
                                                                                      wait_s))
        time.sleep(0.2)


def end_job(store, controls, names, wait_s, stats_path=None, summary=None, keep=False, why=None):
    """A master's last act: mark the job done, send stop (with `why`, a failure, if any) to each process's control
    queue, wait up to wait_s for their heartbeats (names) to lapse, write the stats (summary() as JSON) where asked,
    and remove the job's keys unless `keep`."""
    stop_processes(store, controls, names, wait_s, why)
    if stats_path:
        with open(stats_path, "w") as f:
            json.dump(summary(), f, indent=1)
    if not keep:
        store.remove_job()


def stop_processes(store, controls, names, wait_s, why=None):
    """Mark the job done, send stop to each process's control queue (with `why`: the failure that ends the job, which
    each process then says as it stops, exiting non-zero), and wait up to wait_s until none of the processes `names`
    beats its heart any more."""
    stop = {"status": "stop"} if why is None else {"status": "stop", "why": why[:wire.ERROR_LIMIT]}
    for queue in controls:                  # before the state: a process that sees "done" finds its stop queued
        store.reply_to(queue, stop)
    store.finish_job()
    deadline = time.monotonic() + wait_s
    names = list(names)
    while names and time.monotonic() < deadline:
        names = [n for n, alive in zip(names, store.workers_alive(names)) if alive]
        time.sleep(0.05)
