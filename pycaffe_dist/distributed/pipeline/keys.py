"""What the pipeline's protocol keeps on the job's store: its keys (store.py lists them with every other key): what
crosses each cut, each stage's state, and the queues between the stages; and its fields of the job spec (SPEC).
Stage s is a process named stage{s}: its heartbeat is hb:stage{s} and its notices come on go:stage{s}, the Store's
per-process words."""
from .. import wire
from ..job import SpecKind
from ..store import Store


def flow_queue(stage):
    """The name of stage `stage`'s process: its heartbeat's and its notices' queue."""
    return "stage%d" % stage


def control_queue(stage):
    """The queue of the master's messages to stage `stage`."""
    return "stage%d-ctl" % stage


def _names(value):
    if not isinstance(value, list) or len(value) > 1 << 16 or not all(isinstance(v, str) for v in value):
        raise ValueError("a list of names")
    return value


def _stage(value):
    if not isinstance(value, dict):
        raise ValueError("a list of {range, params} objects")
    rng = wire.list_of(wire.integer(0, 1 << 20), limit=2)(value.get("range"))
    if len(rng) != 2 or rng[0] > rng[1]:
        raise ValueError("a list of {range: [first, last], params} objects")
    return {"range": rng, "params": wire.list_of(wire.integer(0, 1 << 20))(value.get("params"))}


def _cut(value):
    if not isinstance(value, dict):
        raise ValueError("a list of {blobs, shapes, needs_diff} objects")
    blobs = _names(value.get("blobs"))
    shapes = wire.list_of(wire.list_of(wire.integer(0, 1 << 31), limit=8))(value.get("shapes"))
    needs = wire.list_of(wire.flag)(value.get("needs_diff"))
    if not len(blobs) == len(shapes) == len(needs):
        raise ValueError("a list of {blobs, shapes, needs_diff} objects of one length each")
    return {"blobs": blobs, "shapes": shapes, "needs_diff": needs}


# The spec's fields of a pipeline: the stages' layer ranges and parameters, what crosses each cut, the micro-batches
# and where training starts ("net", "feed" and "state", the stage net's texts, are parsed by job.check_spec).
SPEC = SpecKind("pipeline", "a pipeline", {
    "stages": wire.required(wire.list_of(_stage, limit=1 << 10)),
    "cuts": wire.required(wire.list_of(_cut, limit=1 << 10)),
    "micro_batches": wire.required(wire.integer(1, 1 << 20)), "start": wire.required(wire.COUNT),
    "current_step": wire.required(wire.COUNT), "max_iter": wire.required(wire.COUNT)})


class PipelineStore(Store):
    """The job's store, with the pipeline's keys:
      x:stage{s}-act{m}:{n}   blobs: what crosses the cut after stage s, for micro-batch m
      x:stage{s}-grad{m}:{n}  blobs: the gradients of what stage s received, for micro-batch m
      x:stage{s}-state:{n}    blobs: stage s's parameters, then its solver history: from the master at the start, to
                              the master when a snapshot or a test is due
      go:stage{s}             queue: notices to stage s: forward (from s - 1), backward (from s + 1), halt (from s - 1)
      go:stage{s}-ctl         queue: the master's messages to stage s: ack (of a state), halt (to stage 0), stop"""

    def put_activations(self, stage, micro, arrays, count):
        self._put_blobs("x", arrays, count, owner="stage%d-act%d" % (stage, micro))

    def get_activations(self, stage, micro, shapes, out=None):
        return self._get_blobs("x", shapes, owner="stage%d-act%d" % (stage, micro), out=out)[0]

    def put_gradients(self, stage, micro, arrays, count):
        self._put_blobs("x", arrays, count, owner="stage%d-grad%d" % (stage, micro))

    def get_gradients(self, stage, micro, shapes, out=None):
        return self._get_blobs("x", shapes, owner="stage%d-grad%d" % (stage, micro), out=out)[0]

    def put_state(self, stage, arrays, count):
        self._put_blobs("x", arrays, count, owner="stage%d-state" % stage)

    def get_state(self, stage, shapes, out=None):
        return self._get_blobs("x", shapes, owner="stage%d-state" % stage, out=out)[0]

    def notify(self, stage, message):
        """A notice on stage `stage`'s queue (forward, backward, halt)."""
        self.reply_to(flow_queue(stage), message)

    def to_stage(self, stage, message):
        """The master's message to stage `stage` (ack, halt, stop)."""
        self.reply_to(control_queue(stage), message)
