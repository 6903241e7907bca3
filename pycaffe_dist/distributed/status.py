"""`dist_caffe status`: what an operator checks after a deployment, read from Redis: the job's mode and state, the
global iteration (merges), each worker (host, pid, data shard, alive or not, images/s), the last test scores and
the snapshots the master wrote. Without --job, every job on the server, one line each."""
import json

from ..errors import StoreError
from .job import check_spec
from .redis_client import describe
from .store import Store, job_ids


def job_status(store):
    """A dict describing one job (None if the job is not on the server)."""
    spec = store.job_spec()
    if spec is None:
        return None
    spec = check_spec(spec, store.key("job"), python_layers=None)     # (nothing is built from it here)
    state = store.job_state()
    progress = _checked_progress(store.progress())
    members = store.members()
    ids = sorted(members, key=int)
    alive = dict(zip(ids, store.workers_alive(ids)))
    rates = progress.get("workers", {})
    workers = [dict(members[w], id=w, alive=alive[w], images_per_s=rates.get(w)) for w in ids]
    return {"job": store.job, "mode": spec["mode"], "options": spec["options"], "workers_wanted": spec["workers"],
            "state": state, "master_alive": store.master_alive(),
            "count": progress.get("count", 0), "max_iter": progress.get("max_iter"),
            "loss": progress.get("loss"), "exchange_share": progress.get("exchange_share"),
            "idle_share": progress.get("idle_share"),
            "test": progress.get("test"), "snapshots": progress.get("snapshots", []), "workers": workers}


def _checked_progress(progress):
    """The master's progress as the display needs it: a field of another type (damaged, or forged) is left out."""
    progress = dict(progress) if isinstance(progress, dict) else {}
    kinds = {"count": int, "max_iter": int, "loss": float, "exchange_share": float, "idle_share": float, "test": dict,
             "snapshots": list, "workers": dict}
    for field, kind in kinds.items():
        value = progress.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float) if kind is float
                                                                              else kind)):
            progress.pop(field)
    if progress.get("test") is not None and not (isinstance(progress["test"].get("iter"), int) and
                                                 isinstance(progress["test"].get("scores"), dict)):
        progress.pop("test")
    progress["workers"] = {w: r for w, r in progress.get("workers", {}).items() if isinstance(r, (int, float))}
    progress["snapshots"] = [str(s)[:1000] for s in progress.get("snapshots", [])]
    return progress


def format_status(status):
    lines = ["job %s: mode %s, %s, master %s" % (status["job"], status["mode"], status["state"],
                                                 "alive" if status["master_alive"] else "not seen"),
             "  iteration (merges): %s / %s, loss %s, %s" % (
                 status["count"], status["max_iter"], _number(status["loss"]),
                 _share(status))]
    test = status["test"]
    if test:
        scores = ", ".join("%s = %.4g" % kv for kv in sorted(test["scores"].items()))
        lines.append("  last test (merge %d): %s" % (test["iter"], scores))
    lines.append("  workers (%d of %d wanted):" % (sum(w["alive"] for w in status["workers"]),
                                                   status["workers_wanted"]))
    for w in status["workers"]:
        rate = "-" if w["images_per_s"] is None else "%.0f img/s" % w["images_per_s"]
        lines.append("    %s  %s pid %s  shard %s  %s  %s" % (w["id"], w.get("host", "?"), w.get("pid", "?"),
                                                            w.get("slot", "?"), "alive" if w["alive"] else "gone",
                                                            rate))
    lines.append("  snapshots: %s" % (", ".join(status["snapshots"]) or "none yet"))
    return "\n".join(lines)


def _share(status):
    """Exchange (the data-parallel workers and the stages: of a round) or idle (Sandblaster: of the workers' time)."""
    if status.get("idle_share") is not None:
        return "idle %.1f%% of the workers' time" % (100 * status["idle_share"])
    return "exchange " + ("-" if status["exchange_share"] is None else "%.1f%% of a round"
                          % (100 * status["exchange_share"]))


def _number(x):
    return "-" if x is None else "%.4g" % x


def show(urls, job=None, as_json=False, remove=False):
    """The text (or JSON) of `dist_caffe status`; with remove, delete the job's keys afterwards."""
    first = urls.split(",")[0]
    jobs = [job] if job else job_ids(first)
    if not jobs:
        return "no jobs on %s" % describe(first)
    statuses = []
    for j in jobs:
        store = Store(urls, j)
        status = job_status(store)
        if status is None:
            raise StoreError("job %s is not on this Redis (jobs there: %s)"
                             % (j, ", ".join(job_ids(first)) or "none"))
        statuses.append(status)
        if remove:
            store.remove_job()
    if as_json:
        return json.dumps(statuses if not job else statuses[0], indent=1)
    return "\n".join(format_status(s) for s in statuses) + ("\n(keys removed)" if remove else "")
