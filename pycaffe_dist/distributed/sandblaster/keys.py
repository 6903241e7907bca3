"""What Sandblaster's protocol keeps on the job's store: its keys (store.py lists them with every other key): the
work units and the workers' gradient sums; and its fields of the job spec (SPEC). The point x is the job's W,
versioned by the evaluation's number (the Store's put_weights)."""
from .. import wire
from ..job import SpecKind
from ..store import Store

UNITS = "units"
# The spec's fields of a Sandblaster job: the seed every worker draws with, the iteration it starts at ("net",
# "feed" and "state", the net computed on and its data layers, are parsed by job.check_spec).
SPEC = SpecKind("sandblaster", "a Sandblaster job", {"seed": wire.required(wire.integer(0, (1 << 63) - 1)),
                                                     "start": wire.required(wire.COUNT)})


class SandblasterStore(Store):
    """The job's store, with Sandblaster's keys:
      go:units        queue: the evaluations' units, {"eval", "unit", "first", "count", "sample"} (wire.UNIT)
      x:sum{w}:{s}    blobs: worker w's gradient sums over the units of its last push (not written again before the
                      master acks it)"""

    def hand_out(self, units):
        """Units on the queue every worker takes from, in one round trip."""
        self.reply_to_each([(UNITS, unit) for unit in units])

    def next_unit(self, timeout):
        """The next unit that passes wire.UNIT, or None after `timeout` seconds (0: don't wait) or when the one
        taken failed the check (it is dropped)."""
        return self.next_reply(UNITS, timeout, wire.UNIT)

    def put_sums(self, worker, arrays, evaluation):
        self._put_blobs("x", arrays, evaluation, owner="sum%s" % worker)

    def get_sums(self, worker, shapes, out=None):
        """Worker `worker`'s last sums, or None where there are none."""
        return self._get_blobs("x", shapes, owner="sum%s" % worker, out=out, missing_ok=True)[0]
