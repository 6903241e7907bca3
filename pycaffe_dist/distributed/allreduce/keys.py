"""What an all-reduce job keeps on the job's store: no gradient and no W of every iteration (those go round the ring,
ring.py), only the checkpoint the workers start from and go back to after a worker is lost (worker 0 writes it every
`checkpoint_every` iterations); and its fields of the job spec (SPEC)."""
from .. import wire
from ..job import SpecKind
from ..store import Store

# The spec's fields of an all-reduce job: how often worker 0 writes the checkpoint, and the buckets' size
# (buckets.py).
SPEC = SpecKind("allreduce", "an all-reduce job", {
    "checkpoint_every": wire.required(wire.integer(1, 1 << 40)),
    "bucket_bytes": wire.required(wire.integer(1024, 1 << 40)),
})


class AllreduceStore(Store):
    """The job's store, with the all-reduce protocol's keys:
      ckpt:{s}    the checkpoint: the weights, then each history set of the solver (momentum; Adam's two), laid
                  end to end as one blob set versioned by its iteration, written with the position (state: the
                  iteration and multistep's step) in one transaction, so that no reader finds weights and history
                  of different iterations
      ring:{n}    hash: where each worker of world n listens, rank -> host:port (a world on sockets: sockets.py)"""

    def put_checkpoint(self, weights, history_sets, count, current_step):
        """The weights and history after `count` iterations."""
        arrays = list(weights) + [a for arrays in history_sets for a in arrays]
        self._put_blobs("ckpt", arrays, count, state={"count": int(count), "current_step": int(current_step)})

    def put_ring_address(self, world, rank, address):
        self._put_field("ring:%d" % world, str(rank), address)

    def ring_addresses(self, world):
        """{rank: "host:port"} of world `world`'s workers that said where they listen (others' fields ignored)."""
        found = {}
        for rank, address in self._fields("ring:%d" % world, limit=300).items():
            host, _, port = address.rpartition(":")
            if rank.isdigit() and host and port.isdigit():
                found[int(rank)] = address
        return found

    def checkpoint(self, shapes, sets):
        """(weights, history sets, count, current_step) of the last checkpoint, or None where there is none."""
        arrays, count = self._get_blobs("ckpt", list(shapes) * (1 + sets), missing_ok=True)
        if arrays is None:
            return None
        n = len(shapes)
        histories = [arrays[n * (k + 1):n * (k + 2)] for k in range(sets)]
        return arrays[:n], histories, count, self.master_state().get("current_step", 0)
