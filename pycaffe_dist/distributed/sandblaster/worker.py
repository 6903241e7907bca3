"""A Sandblaster worker (DistBelief's Sandblaster L-BFGS, Dean et al. 2012): it computes the loss and gradient of the
TRAIN net at the point x the master's L-BFGS asks about, over the work units it takes, and pushes their sums. The
master (master.py beside it) adds the sums up and runs L-BFGS (solver/lbfgs.py).

An evaluation is f and its gradient at one x over a sample of B batches of the training data, cut into work units
of a few batches each. The master writes x, then puts the evaluation's units on one queue; a worker takes one unit
at a time, so a fast worker takes more, and a slow one holds up nobody beyond the unit it is computing. A worker
says which unit it took as soon as it takes it, so that the units of a worker whose heartbeat lapses are handed out
again. It adds the gradients of its units up in its net's diffs (backward accumulates them, as Caffe's iter_size
does) and pushes the sums when the queue has nothing more for it: one push per worker and evaluation, mostly.

Data. Any worker may be given any unit, so a unit names batches of the whole TRAIN data, not of a worker's shard:
batch j of the endless stream the net's data layers read from the first record on (shard 0 of 1). A worker builds
the net's data layers as a net of their own (the feed) and the net with those layers turned into Input layers (the
net computed on), reads the stream forward and keeps the batches of the current sample it passed, for the units it
is given later (the line search evaluates one sample several times). Each worker thus reads every batch of the
samples, and computes only its units: for LeNet reading a batch is a few per cent of its forward and backward.
Every worker seeds its random numbers with the job's one seed (the solver's random_seed, or one the master drew), so
that a data layer's rand_skip and shuffles make the same stream on every worker, and the layers that draw at every
forward (Dropout) draw batch j's numbers for batch j, whatever the point and the worker (their streams are put at a
counter of j's own): one sample's objective is one function of x, for the line search.

The job's keys it uses (store.py lists them all):
  W                 the point x of the current evaluation, versioned by the evaluation's number: pulled once per
                    evaluation, straight into the net's parameters
  go:units          queue: the evaluations' units (SandblasterStore, keys.py): a unit is batches first to
                    first + count - 1 of the stream, in the sample that starts at batch `sample`
  x:sum{w}          blobs: worker w's gradient sums over the units of its last push (SandblasterStore)
  go:{w}            queue: the master's messages to worker w: ack (of a push), stop
  inbox             to the master: ready, taken (a unit), sums (a push: its evaluation, units, loss sum and batches),
                    leave, error
  hb:{w}            worker w's heartbeat
"""
import logging
import time


from ... import common
from ...errors import StoreError
from ...net.net import Net
from .. import wire
from ..blob_exchange import BlobExchange
from ..job_process import POLL_S, JobProcess
from .keys import SPEC, SandblasterStore

log = logging.getLogger("pycaffe_dist.distributed")
# Batch j's random draws start at counter j << 32: 2^32 Philox blocks a batch, more than any layer draws.
DRAWS_PER_BATCH_SHIFT = 32


class Held:
    """The units a worker computed since its last push: their gradients are in its net's diffs."""

    def __init__(self):
        self.evaluation, self.units, self.loss, self.batches, self.compute_s = None, [], 0.0, 0, 0.0

    def add(self, unit, loss, seconds):
        self.evaluation = int(unit["eval"])
        self.units.append(int(unit["unit"]))
        self.loss += loss
        self.batches += int(unit["count"])
        self.compute_s += seconds


class SandblasterWorker(JobProcess):
    store_class, spec_kind = SandblasterStore, SPEC
    def __init__(self, urls, job=None, threads=1, wait_for_job_s=60.0, master_timeout_s=None, retry_s=30.0,
                 worker_id=None, delay_s=0.0, python_layers=()):
        super().__init__(urls, job, wait_for_job_s, master_timeout_s, retry_s, python_layers)
        self.threads, self.delay_s = threads, delay_s      # delay: seconds after every unit, a straggler on purpose
        self.id = self.name = self.store.claim_worker_id(worker_id)
        self.stats = {"units": 0, "batches": 0, "pushes": 0, "compute_s": 0.0}

    # --- setup -------------------------------------------------------------------------------------------------

    def _build(self):
        spec = self.spec
        common.set_num_threads(self.threads)
        # One seed for every worker: see the docstring
        common.set_random_seed(spec["seed"])
        state = spec["state"]                       # (parsed by job.check_spec, as "net" and "feed")
        self.net = Net(spec["net"], state=state, fill_params=False)
        self.feed = Net(spec["feed"], state=state)
        self.feed_tops = [self.feed.blob_by_name(name) for name in
                          [self.feed.blob_names[i] for ids in self.feed.top_ids for i in ids]]
        self.inputs = [self.net.blob_by_name(name) for name in
                       [self.feed.blob_names[i] for ids in self.feed.top_ids for i in ids]]
        self.params = self.net.learnable_params
        shapes = [tuple(b.shape) for b in self.params]
        expected = [tuple(b["shape"]) for b in spec["blobs"]]
        if shapes != expected:
            raise StoreError("job %s: this worker's net has learnable blobs %s but the job's are %s"
                             % (self.job, shapes, expected))
        self.point, self.sums = BlobExchange(self.params), BlobExchange(self.params, diff=True)
        self.random_layers = [layer for layer in self.net.layers if getattr(layer, "random_stream", None) is not None]
        for layer in self.random_layers:
            layer.random_stream.take(0)     # keyed now: a first draw after the seeding would put its counter at 0
        self.cache, self.next_batch = {}, 0     # the current sample's batches read so far; the stream's position

    # --- the data ------------------------------------------------------------------------------------------------

    def _batch(self, index, sample):
        """Batch `index` of the stream, in the sample that starts at batch `sample`: read on to it (keeping the
        sample's batches passed on the way) or taken from those kept."""
        for old in [j for j in self.cache if j < sample]:
            del self.cache[old]
        while self.next_batch <= index:
            self.feed.forward_from_to()
            if self.next_batch >= sample:
                self.cache[self.next_batch] = [top.data.copy() for top in self.feed_tops]
            self.next_batch += 1
        if index not in self.cache:
            raise StoreError("job %s: worker %s was asked for batch %d of the data, which it read past (the samples "
                             "must move forward)" % (self.job, self.id, index))
        return self.cache[index]

    # --- messages ------------------------------------------------------------------------------------------------

    def identity(self):
        return {"worker": self.id}

    def _wait_for_ack(self):
        while self.unacked:
            message = self.store.next_reply(self.id, POLL_S, wire.CONTROL)
            if message is None:
                self._check_master()
            else:
                self._control(message)

    # --- the units -----------------------------------------------------------------------------------------------

    def _pull(self):
        """W (the point of the newest evaluation) into the net's parameters; returns its evaluation number."""
        _, version = self.store.get_weights([tuple(b.shape) for b in self.params], out=self.point.incoming())
        self.point.land()
        return version

    def _compute(self, unit):
        """The unit's batches forward and backward at the point the net holds; their gradients add up in its
        diffs. Returns the sum of their losses."""
        loss = 0.0
        first, sample = int(unit["first"]), int(unit["sample"])
        for index in range(first, first + int(unit["count"])):
            for blob, array in zip(self.inputs, self._batch(index, sample)):
                blob.data[...] = array
            for layer in self.random_layers:
                layer.random_stream.counter = index << DRAWS_PER_BATCH_SHIFT
            loss += float(self.net.forward_from_to())
            self.net.backward_from_to()
        return loss

    def _push(self, held):
        self._wait_for_ack()
        self.store.put_sums(self.id, self.sums.outgoing(), held.evaluation)
        self.store.send_to_master({"type": "sums", "worker": self.id, "eval": held.evaluation, "units": held.units,
                                   "loss": held.loss, "batches": held.batches, "compute_s": held.compute_s})
        self.unacked = True
        self.stats["pushes"] += 1
        self.net.clear_param_diffs()
        return Held()

    def _work(self):
        newest = point = -1         # the newest evaluation seen; the one whose x the net holds
        held = Held()
        self.net.clear_param_diffs()
        while True:
            self._poll_control()
            unit = self.store.next_unit(0 if held.units else POLL_S)
            if unit is None:
                if held.units:
                    held = self._push(held)         # the queue has nothing more: the master waits for these
                else:
                    self._check_master()
                continue
            evaluation = unit["eval"]
            if evaluation < newest:
                continue                            # a copy of a unit whose evaluation is over
            if held.units and held.evaluation != evaluation:
                held = self._push(held)
            self.store.send_to_master({"type": "taken", "worker": self.id, "eval": evaluation,
                                       "unit": unit["unit"]})
            if point != evaluation:
                point = self._pull()
                newest = max(newest, point)
                if point != evaluation:
                    continue                        # x has moved on: that evaluation is over
            started = time.perf_counter()
            loss = self._compute(unit)
            if self.delay_s:
                time.sleep(self.delay_s)
            seconds = time.perf_counter() - started
            held.add(unit, loss, seconds)
            self.stats["units"] += 1
            self.stats["batches"] += unit["count"]
            self.stats["compute_s"] += seconds

    def _main(self):
        self._work()

    def _ready_line(self):
        log.info("worker %s of Sandblaster job %s: ready", self.id, self.job)

    def _leave(self):
        self.store.send_to_master({"type": "leave", "worker": self.id})
        super()._leave()
