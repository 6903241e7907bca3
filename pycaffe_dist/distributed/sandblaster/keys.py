"""Sandblaster's keys on the job's store (store.py lists them with every other key): the work units and the workers'
gradient sums. The point x is the job's W, versioned by the evaluation's number (the Store's put_weights)."""
from .. import wire
from ..store import Store

UNITS = "units"


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
