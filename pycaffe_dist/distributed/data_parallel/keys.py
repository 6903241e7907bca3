"""What the data-parallel protocol keeps on the job's store: its keys (store.py lists them with every other key): the
workers' results, the master's history and the compressed change of W; and its part of the job spec (SPEC): the
mode and its options, checked against the modes' declarations. The words every kind of job shares (the job, W, the
inbox, the replies, the heartbeats) are the Store's own."""
from ..job import SpecKind
from ..store import Store
from .modes import resolve_options


def _options_resolved(spec):
    """The spec with its mode's options checked and completed (modes.resolve_options)."""
    try:
        return dict(spec, options=resolve_options(spec["mode"], spec["options"]))
    except Exception as exc:                # a type() of a value of the wrong type, an unknown option or mode
        raise ValueError("mode and options are not this project's: %s" % exc) from None


SPEC = SpecKind(None, "a data-parallel job", check=_options_resolved)


class DataParallelStore(Store):
    """The job's store, with the data-parallel protocol's keys:
      x:{w}:{s}     worker w's result (delta, gradient or local weights), as W, or (--compress) its payload
      hist:{k}:{s}  the master's history set k (gradient-only; local-sgd's outer momentum), as W
      U:{s}         the last round's compressed change of W (sync, local-sgd with --compress; broadcast.py)"""

    def put_result(self, worker, arrays, round_id):
        self._put_blobs("x", arrays, round_id, owner=worker)

    def get_result(self, worker, shapes, out=None, missing_ok=False):
        """The worker's last result (None if it is not there and missing_ok)."""
        return self._get_blobs("x", shapes, owner=worker, out=out, missing_ok=missing_ok)[0]

    def remove_result(self, worker):
        """The worker's last result, removed from every server (gossip: a worker counted out is nobody's peer)."""
        self._remove_blobs("x", worker)

    def put_history(self, index, arrays, count):
        self._put_blobs("hist:%d" % index, arrays, count)

    def get_history(self, index, shapes):
        """History set `index` as arrays, or None when the job has none saved."""
        return self._get_blobs("hist:%d" % index, shapes, missing_ok=True)[0]

    def put_update(self, payload, count):
        """The compressed change of W that merge `count` made (broadcast.py): one payload blob."""
        self._put_blobs("U", [payload], count)

    def get_update(self, out):
        """(the last update's payload, read into `out`, its merge count), or (None, None) if there is none."""
        arrays, version = self._get_blobs("U", [out.shape], out=[out], missing_ok=True)
        return (None, None) if arrays is None else (arrays[0], version)
