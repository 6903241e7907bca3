"""What may come over Redis, checked in one place: the messages of every queue, field by field.

Anyone who can write to the job's Redis can put anything in its queues: a message that is not JSON, a number that
is text, a list where an object belongs. Each queue has a Schema here; the store (store.py) checks every message it
pops against the schema its caller names and hands on only checked, normalised copies (the known fields, of the
right types, in range). A message that fails is dropped with one warning line naming the key and what was
expected, and counted (Store.refused); it never ends the job. Checks of what a message means (a round from the
future, a worker that never joined) are the master's, which refuses such messages the same way (Store.refuse).

The job spec and the blobs have their own checks (job.check_spec, store._get_blobs); what they find damaged is a
DamagedData: the job's data on Redis is not what this project wrote there.
"""
import math
import re

from ..errors import StoreError

ID = re.compile(r"[0-9]{1,9}")
TEXT_LIMIT = 200                # a host name, an address
ERROR_LIMIT = 2000              # an error text a process sends as it stops
LIST_LIMIT = 1 << 16            # units in a push, peers in a reply


class BadMessage(StoreError):
    """A message from Redis that fails its queue's check: dropped, with a warning."""


class DamagedData(StoreError):
    """The job's data on Redis (W, a result, the spec) is not what this project wrote: of another size or type,
    values its master never published, text that does not parse."""


# --- fields: each takes the value read and returns it normalised, or raises ValueError saying what was expected

def worker_id(value):
    """A worker id: a non-negative integer below 10^9, as a string (the form keys and dicts use)."""
    if isinstance(value, bool) or not (isinstance(value, int) and 0 <= value < 10 ** 9 or
                                       isinstance(value, str) and ID.fullmatch(value)):
        raise ValueError("a worker id (an integer from 0 to 999999999)")
    return str(int(value))


def integer(lo=0, hi=(1 << 62)):
    expected = "a non-negative integer" if (lo, hi) == (0, 1 << 62) else "an integer from %d to %d" % (lo, hi)

    def check(value):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(expected)
        return value
    return check


def number(lo=-math.inf, hi=math.inf, finite=True):
    """A JSON number (non-finite allowed where not `finite`: a loss that went NaN is news, not a forgery)."""
    def check(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("a number")
        value = float(value)
        if math.isnan(value) or math.isinf(value):
            if finite:
                raise ValueError("a finite number")
            return value
        if not lo <= value <= hi:
            raise ValueError("a number from %g to %g" % (lo, hi))
        return value
    return check


def text(limit=TEXT_LIMIT, optional=False):
    """A string, cut at `limit` characters (None allowed where `optional`)."""
    def check(value):
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise ValueError("a string")
        return value[:limit]
    return check


def flag(value):
    if not isinstance(value, bool):
        raise ValueError("true or false")
    return value


def list_of(item, limit=LIST_LIMIT):
    def check(value):
        if not isinstance(value, list) or len(value) > limit:
            raise ValueError("a list of at most %d items" % limit)
        return [item(v) for v in value]
    return check


COUNT = integer()
SECONDS = number(0.0)
LOSS = number(finite=False)


class Schema:
    """The messages of one queue: their `tag` field (type, status, kind) names the message's kind; `kinds` maps
    each kind to {field: (check, required)}. Fields not named are dropped; a missing optional field stays
    absent (the reader's default applies)."""

    def __init__(self, name, tag, kinds):
        self.name, self.tag, self.kinds = name, tag, kinds

    def check(self, message, where):
        """The message, checked and normalised; BadMessage (naming `where`, the key) otherwise."""
        if not isinstance(message, dict):
            raise BadMessage("%s: %s is not a JSON object" % (where, shown(message)))
        kind = message.get(self.tag)
        fields = self.kinds.get(kind) if isinstance(kind, str) else None
        if fields is None:
            raise BadMessage("%s: a message whose %s is %s, where %s expects one of %s" % (
                where, self.tag, shown(kind), self.name, ", ".join(sorted(self.kinds))))
        checked = {self.tag: kind}
        for field, (check, required) in fields.items():
            if field not in message:
                if required:
                    raise BadMessage("%s: a %s message without its field %r" % (where, kind, field))
                continue
            try:
                checked[field] = check(message[field])
            except ValueError as exc:
                raise BadMessage("%s: a %s message whose %r is %s, where %s was expected" % (
                    where, kind, field, shown(message[field]), exc)) from None
        return checked


def shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def required(check):
    return check, True


def optional(check):
    return check, False


# --- the queues --------------------------------------------------------------------------------------------------

WHO = {"host": optional(text()), "address": optional(text(optional=True)), "pid": optional(COUNT)}
LEAVING = {"error": optional(text(ERROR_LIMIT)), "damaged": optional(flag)}

# pcd:{job}:inbox of a data-parallel job (data_parallel/master.py): what its workers (data_parallel/worker.py) send
INBOX = Schema("a data-parallel master's inbox", "type", {
    "join": dict(WHO, worker=required(worker_id)),
    "ready": {"worker": required(worker_id)},
    "result": {"worker": required(worker_id), "round": required(COUNT), "epoch": required(COUNT),
               "images": optional(integer(0, 1 << 40)), "compute_s": optional(SECONDS), "wait_s": optional(SECONDS),
               "base": optional(COUNT), "loss": optional(LOSS), "averagings": optional(COUNT)},
    "leave": dict(LEAVING, worker=required(worker_id)),
})

# pcd:{job}:workers: what a master recorded of each worker (the status display, a restarted master)
MEMBER = Schema("the job's members", "type", {"member": dict(WHO, slot=optional(COUNT))})

# pcd:{job}:go:{w}: the data-parallel master's replies to worker w
REPLY_FIELDS = {"iter": optional(COUNT), "epoch": optional(COUNT), "workers": optional(integer(0, 1 << 30)),
                "lr_scale": optional(number(1e-9, 1e9)), "round": optional(COUNT),
                "peers": optional(list_of(worker_id)), "clear_history": optional(flag)}
REPLY = Schema("a data-parallel worker's replies", "status", {
    "slot": {"slot": required(COUNT), "shards": required(integer(1, 1 << 30)), "epoch": optional(COUNT)},
    "welcome": REPLY_FIELDS, "merged": REPLY_FIELDS, "dropped": REPLY_FIELDS, "reset": REPLY_FIELDS,
    "rejoin": {"reason": optional(text())}, "stop": {"why": optional(text(ERROR_LIMIT))},
})

# the control queue of a Sandblaster worker or a pipeline stage (job_process.py)
CONTROL = Schema("a control queue", "status", {"stop": {"why": optional(text(ERROR_LIMIT))}, "ack": {},
                                                 "halt": {}})

# pcd:{job}:inbox of a Sandblaster job (sandblaster_master.py)
SANDBLASTER_INBOX = Schema("a Sandblaster master's inbox", "type", {
    "ready": dict(WHO, worker=required(worker_id)),
    "leave": dict(LEAVING, worker=required(worker_id)),
    "error": {"worker": required(worker_id), "error": optional(text(ERROR_LIMIT))},
    "taken": {"worker": required(worker_id), "eval": required(COUNT), "unit": required(COUNT)},
    "sums": {"worker": required(worker_id), "eval": required(COUNT), "units": required(list_of(COUNT)),
             "loss": required(LOSS), "batches": required(integer(0, 1 << 40)), "compute_s": optional(SECONDS)},
})

# pcd:{job}:units: the units of an evaluation, handed out to the Sandblaster workers; a unit has no tag of its own
UNIT = Schema("the Sandblaster units queue", "type", {
    "unit": {"eval": required(COUNT), "unit": required(COUNT), "first": required(COUNT),
             "sample": required(COUNT), "count": required(integer(1, 1 << 30))},
})

# pcd:{job}:inbox of a pipeline (pipeline_master.py)
STAGE = integer(0, 1 << 16)
PIPELINE_INBOX = Schema("a pipeline master's inbox", "type", {
    "ready": dict(WHO, stage=required(STAGE)),
    "error": {"stage": required(STAGE), "error": optional(text(ERROR_LIMIT))},
    "iteration": {"stage": required(STAGE), "iter": required(COUNT), "loss": optional(LOSS),
                  "rate": optional(LOSS), "compute_s": optional(SECONDS), "wait_s": optional(SECONDS)},
    "state": {"stage": required(STAGE), "count": required(COUNT), "final": optional(flag), "again": optional(flag)},
})

# pcd:{job}:inbox of an all-reduce job (allreduce/master.py): what its workers (allreduce/worker.py) send; a worker
# is named by its rank in the MPI world
ALLREDUCE_INBOX = Schema("an all-reduce coordinator's inbox", "type", {
    "ready": dict(WHO, worker=required(worker_id), world=required(integer(1, 1 << 20)), start=optional(COUNT)),
    "leave": dict(LEAVING, worker=required(worker_id)),
    "error": {"worker": required(worker_id), "error": optional(text(ERROR_LIMIT))},
    "done": {"worker": required(worker_id), "count": required(COUNT), "stopped": optional(flag),
             "identical": optional(flag)},
    "diverged": {"worker": required(worker_id), "count": required(COUNT), "why": optional(text(ERROR_LIMIT)),
                 "snapshot": optional(text(4096))},
})

# pcd:{job}:stage{s}: the notices one stage sends the next (pipeline/stage.py)
NOTICE = {"count": required(COUNT), "batch": required(COUNT), "micro": required(COUNT)}
FLOW = Schema("a pipeline stage's queue", "kind", {
    "forward": NOTICE, "backward": NOTICE, "halt": {"count": required(COUNT)},
})

# pcd:{job}:go:shard{s}: a data-parallel master's events to its parameter server shard s (data_parallel/shard.py):
# the rule's events in the master's order, each with the merges the master carried out after it ("m": [merge
# count, the rate's scale] each), and, with "count", a flush (publish the slice of W at that merge count)
SHARD = integer(0, 1 << 10)


def _merge_done(value):
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("a [merge count, rate scale] pair")
    return [COUNT(value[0]), number(1e-9, 1e9)(value[1])]


MERGES = list_of(_merge_done)
SHARD_EVENT = Schema("a shard's events", "e", {
    "start": {"workers": required(list_of(worker_id)), "slots": required(list_of(COUNT)), "m": required(MERGES)},
    "join": {"worker": required(worker_id), "slot": required(COUNT), "m": required(MERGES)},
    "result": {"worker": required(worker_id), "staleness": required(integer(1)), "m": required(MERGES)},
    "lost": {"worker": required(worker_id), "m": required(MERGES)},
    "restart": {"workers": required(list_of(worker_id)), "slots": required(list_of(COUNT)),
                "from_weights": required(flag), "m": required(MERGES)},
    "more": {"m": required(MERGES)},
    "keep": {"count": required(COUNT), "kept": required(list_of(COUNT))},
    "restore": {"count": required(COUNT)},
    "history": {"count": required(COUNT)},
    "revert": {},
})


def shard_event(value):
    try:
        return SHARD_EVENT.check(value, "an event")
    except BadMessage as exc:
        raise ValueError(str(exc)) from None


SHARD_QUEUE = Schema("a parameter server shard's queue", "status", {
    "events": {"seq": required(COUNT), "events": required(list_of(shard_event)), "count": optional(COUNT),
               "force": optional(flag)},
    "stop": {"why": optional(text(ERROR_LIMIT))},
})

# pcd:{job}:go:shards: what the shards tell their master
SHARD_NEWS = Schema("the shards' news to their master", "status", {
    "hello": dict(WHO, shard=required(SHARD), sent=required(COUNT), received=required(COUNT),
                  cpu_s=required(SECONDS)),
    "flushed": {"shard": required(SHARD), "seq": required(COUNT), "bad": optional(text(ERROR_LIMIT)),
                "published": optional(COUNT), "sent": required(COUNT), "received": required(COUNT),
                "cpu_s": required(SECONDS)},
    "error": {"shard": required(SHARD), "error": optional(text(ERROR_LIMIT))},
})
