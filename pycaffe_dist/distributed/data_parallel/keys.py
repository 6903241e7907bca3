"""What the data-parallel protocol keeps on the job's store: its keys (store.py lists them with every other key): the
workers' results, the master's history and the compressed change of W; and its part of the job spec (SPEC): the
mode and its options, checked against the modes' declarations. The words every kind of job shares (the job, W, the
inbox, the replies, the heartbeats) are the Store's own."""
from .. import wire
from ..job import SpecKind
from ..store import Store
from .modes import resolve_options


def _options_resolved(spec):
    """The spec with its mode's options checked and completed (modes.resolve_options)."""
    try:
        return dict(spec, options=resolve_options(spec["mode"], spec["options"]))
    except Exception as exc:                # a type() of a value of the wrong type, an unknown option or mode
        raise ValueError("mode and options are not this project's: %s" % exc) from None


def _blob_rates(value):
    """Each learnable blob's [lr_mult, decay_mult] (what a shard's update rule needs in gradient-only)."""
    pairs = wire.list_of(wire.list_of(wire.number(), limit=2), limit=1 << 20)(value)
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError("a list of [lr_mult, decay_mult] pairs")
    return pairs


# servers: the parameter server shards merging W (--servers K; 1: the master merges it alone)
SPEC = SpecKind(None, "a data-parallel job", fields={"servers": wire.optional(wire.integer(1, 1 << 10)),
                                                    "blob_rates": wire.optional(_blob_rates)},
                check=_options_resolved)


class DataParallelStore(Store):
    """The job's store, with the data-parallel protocol's keys:
      x:{w}:{s}     worker w's result (delta, gradient or local weights), as W, or (--compress) its payload
      hist:{k}:{s}  the master's history set k (gradient-only; local-sgd's outer momentum), as W
      U:{s}         the last round's compressed change of W (sync, local-sgd with --compress; broadcast.py)
    and, with --servers K (shards.py, shard.py), each shard's queues:
      go:shard{s}   the master's events and control messages to shard s (wire.SHARD_QUEUE)
      go:shards     what the shards tell the master (wire.SHARD_NEWS)
    A shard reads and writes only server s's slice of each blob set (the *_slice methods): its part of W, of
    every result and of the master's history."""

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

    # --- one shard's slices (--servers K: data_parallel/shard.py) ------------------------------------------------

    def put_weights_slice(self, server, flat, count, current_step):
        """Shard `server`'s slice of W at merge `count`; the first shard writes the master's state with it."""
        state = {"count": int(count), "current_step": int(current_step)} if server == 0 else None
        self._put_slice("W", server, flat, count, state=state)

    def get_weights_slice(self, server, out, missing_ok=False):
        return self._get_slice("W", server, out, missing_ok=missing_ok)

    def get_result_slice(self, worker, server, out):
        """Server `server`'s slice of the worker's last result, into `out`; its round, or None if it is not there."""
        return self._get_slice("x", server, out, owner=worker, missing_ok=True)

    def put_history_slice(self, index, server, flat, count):
        self._put_slice("hist:%d" % index, server, flat, count)

    def get_history_slice(self, index, server, out):
        return self._get_slice("hist:%d" % index, server, out, missing_ok=True)
