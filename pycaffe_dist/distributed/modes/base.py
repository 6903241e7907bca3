"""What every mode shares: the worker side of the modes that push deltas, and the master side's bookkeeping.

A worker's round: start from weights x, run tau local solver steps (or, in gradient-only, one forward-backward),
push a result R, get a reply and pull W. With `depth` 1 the worker overlaps the exchange of round r with the
computation of round r+1, so the reply and W it knows when round r ends are those of round r-1 (worker.py).
Each mode says:

  worker side:  result(x_start, x_end, gradients, centre, options) -> R, where centre is the last W pulled;
                next_start(status, pulled, x_end, result, in_flight) -> the weights of the next round, from the
                last reply's status and W, this round's end and result, and whether that result is in flight
  master side:  a Rule with start(workers), on_join(w), on_result(w, message), on_lost(w)
"""


class DeltaWorker:
    """Workers that run local solver steps and push the change of their weights (sync, async, partial-sync,
    weed-out). After a merge the next round starts from the pulled W plus the delta still in flight, which W
    cannot hold yet; after a drop or a reset, from W alone."""
    gradients = False

    @staticmethod
    def result(x_start, x_end, gradients, centre, options):
        return [e - s for s, e in zip(x_start, x_end)]

    @staticmethod
    def next_start(status, pulled, x_end, result, in_flight):
        if status == "merged" and in_flight:
            return [w + d for w, d in zip(pulled, result)]
        return pulled


class Rule:
    """The master side of a mode. `master` provides: members (ids of live, ready workers), read_result(w),
    add_to_weights(arrays, scale), merged(messages) (counts one merge), reply(w, status), log."""
    depth = 1

    def __init__(self, master, options):
        self.master, self.options = master, options
        if options.get("overlap") is not None:      # --overlap / --no-overlap over the mode's default
            self.depth = 1 if options["overlap"] else 0

    def start(self, workers):
        for w in workers:
            self.master.reply(w, "welcome")

    def on_join(self, worker):
        self.master.reply(worker, "welcome")

    def on_lost(self, worker):
        pass

    def on_result(self, worker, message):
        raise NotImplementedError
