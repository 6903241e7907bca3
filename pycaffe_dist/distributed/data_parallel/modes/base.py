"""What every mode shares: how options are declared, the worker side of the modes that push deltas, and the master
side's interface.

A worker's round: start from weights x, run tau local solver steps (or, in gradient-only, one forward-backward),
push a result R, get a reply and pull W. With `depth` 1 the worker overlaps the exchange of round r with the
computation of round r+1, so the reply and W it knows when round r ends are those of round r-1 (worker.py).
Each mode module says:

  OPTIONS:      the options it takes (Option, below): the command line's flags and the job spec's values come
                from these declarations, and nowhere else
  DEFAULTS:     (optional) option name -> this mode's own default for a shared option (local-sgd's tau)
  RoundRule:    the worker side (worker.py's rounds ask it):
                result(x_start, x_end, gradients, centre, options, workers) -> R, where centre is the last W
                pulled and workers the live workers the master last counted;
                next_start(status, pulled, x_end, result, in_flight, answered) -> the weights of the next round,
                from the last reply's status and W, this round's end and result, whether that result is in
                flight, and the result that reply answered (this round's without overlap, the last round's with);
                base(version, status, in_flight) -> the merge count of the W the next round starts from (how
                stale its result will be); `gradients`: whether a round is one gradient (no local steps);
                choose_peer(peers), gossip's only: the worker whose weights to pull instead of W, from the
                reply's live others (worker.py then reports status 'peer', or 'alone' when there is none)
  MergeRule:    the master side: a Rule (below) whose events, start(workers), on_join(w), on_result(result),
                on_lost(w), return what the master is to do (Merge, Reply, Drop, Average, Forget), as DDP's
                communication hooks return a result and never call back into DDP; it reads the master only
                through a RuleView of four queries; merged_work(workers), what one of its merges is worth in
                one process's steps (the linear scaling rule's k: lr_scaling.py), where Rule's does not fit the
                mode
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from .. import compression
from ... import lr_scaling


@dataclass(frozen=True)
class Option:
    """A mode option, declared once. `name` is its key in the job spec; the flag is --name-with-dashes (a bool
    option has --name and --no-name). `check(value)` returns what is wrong with a value, or None."""
    name: str
    type: type
    default: Any
    help: str
    check: Optional[Callable[[Any], Optional[str]]] = None

    @property
    def flag(self):
        return "--" + self.name.replace("_", "-")


def at_least(low):
    return lambda value: None if value >= low else "must be at least %s, got %s" % (low, value)


# The options of more than one mode.
TAU = Option("tau", int, 1, "local solver steps per round", at_least(1))
FACTOR = Option("factor", float, None, "merge each result scaled by 1/FACTOR (default: by 1/its staleness, the "
                "merges W took since the weights the result started from, its own included)",
                lambda value: None if value > 0 else "must be positive, got %s" % value)
COMPRESS = Option("compress", str, "none", "send each result compressed, the rest kept for the next one (error "
                  "feedback): 1bit (sign bits and two means per block of 512 values: 1/28 of the bytes) or "
                  "topk:FRACTION (the largest |values| of each blob: 2 x FRACTION of the bytes)", compression.check)
# The learning rate of N workers (lr_scaling.py): every data-parallel mode takes these three.
LR_SCALING = Option("lr_scaling", str, "linear", "the learning rate of N workers: linear (the solver's rate times the "
                    "work a merge takes, N batches in sync: the linear scaling rule of Goyal et al. 2017), sqrt (times "
                    "its square root) or none (the solver's rate: N workers' merges add up to one process's step, as "
                    "in Caffe's multi-GPU training and SpeeDO)", lr_scaling.check_policy)
LR_WARMUP = Option("lr_warmup", float, lr_scaling.WARMUP_SHARE, "gradual warmup: the scaled rate starts at the "
                   "solver's own and climbs by one solver's rate every LR_WARMUP x max_iter merges (0: no warmup)",
                   lr_scaling.check_warmup)
LARS = Option("lars", float, None, "LARS's trust coefficient: the scaled rate of each blob is clipped to at most "
              "LARS x |w| / |g| (never below the solver's own): a layer-wise limit on what scaling adds (You et al. "
              "2017, as NVIDIA's LARC clips); off by default, as Caffe's solvers have no layer-wise rate",
              lambda value: None if value > 0 else "must be positive, got %s" % value)
SCALING = (LR_SCALING, LR_WARMUP, LARS)
OVERLAP = Option("overlap", bool, None, "workers compute their next round while the last result travels (--overlap, "
                 "the default but in gradient-only) or wait for each reply first (--no-overlap, SpeeDO's schedule)")


class RuleView(Protocol):
    """What a MergeRule may read of the master (master.py); it changes nothing there. What the rule wants done it
    returns as actions (below), which the master carries out in order once the rule has returned."""

    def slot(self, worker): ...                          # the worker's data slot (a fixed order of the workers)

    def typical_staleness(self): ...                     # the recent results' staleness, averaged (None: none yet)

    def momentum(self): ...                              # the solver's momentum as a heavy ball's (SGD, Nesterov;
    #                                                      0 for the adaptive rules): lr_scaling.heavy_ball_momentum

    def history(self): ...                               # the solver's first history set (momentum) as arrays,
    #                                                      in place: a .solverstate snapshot holds it (local-sgd's
    #                                                      outer momentum lives there)


@dataclass
class Result:
    """A worker's result as the master hands it to its rule: the message that announced it, its arrays shaped like
    W (None where the rule reads no results: gossip), and its staleness, the merges W took since the weights it
    started from, its own included (1: computed on the latest W). The arrays are the master's reader's: a rule
    that keeps them past its return copies them. `non_finite`: the index of the first array holding NaN or Inf, for
    the master, which refuses such a result when a Merge takes it."""
    worker: str
    message: dict
    arrays: Optional[list] = None
    staleness: int = 1
    non_finite: Optional[int] = None


# The actions a rule returns from each of its events (a list, carried out in its order).

@dataclass
class Merge:
    """One merge: W moves by `adds`, pairs (arrays, s) for W += s x arrays in order, or by the solver's update rule
    from `gradients` at its rate times the rate's scale for N workers times `scale`; then the merge count goes up by
    one. `results`: the Results merged (their mean loss is the merge's loss). A merge without adds or gradients
    counts a merge that moved no central W (gossip's global iteration)."""
    results: list
    adds: list = field(default_factory=list)
    gradients: Optional[list] = None
    scale: float = 1.0


@dataclass
class Reply:
    """Queue a reply to `worker`: welcome, merged or dropped, with `fields` (gossip's live peers)."""
    worker: str
    status: str
    fields: dict = field(default_factory=dict)


@dataclass
class Drop:
    """A result thrown away (counted in the summary); its worker's reply is a Reply of its own."""
    result: Result


@dataclass
class Average:
    """W = the mean of these workers' published weights (gossip, whose W is only that mean)."""
    workers: list


@dataclass
class Forget:
    """Remove this worker's published result from Redis (gossip: a peer must not pull weights no longer valid)."""
    worker: str


class DeltaRoundRule:
    """Workers that run local solver steps and push the change of their weights (sync, async, partial-sync,
    weed-out). After a merge the next round starts from the pulled W plus the delta still in flight, which W
    cannot hold yet; after a drop or a reset, from W alone."""
    gradients = False

    @staticmethod
    def result(x_start, x_end, gradients, centre, options, workers):
        return [e - s for s, e in zip(x_start, x_end)]

    @staticmethod
    def next_start(status, pulled, x_end, result, in_flight, answered=None):
        if status == "merged" and in_flight:
            return [w + d for w, d in zip(pulled, result)]
        return pulled

    @staticmethod
    def base(version, status, in_flight):
        # The delta in flight is in the start already: its own merge does not make the next result staler.
        return version + 1 if status == "merged" and in_flight else version


class Rule:
    """The master side of a mode. Its events (start, on_join, on_result, on_lost, restart, settle_weights) each
    return the actions the master is to carry out (Merge, Reply, Drop, Average, Forget), in order; a rule never
    calls the master, and reads only its RuleView. `options`: the mode's options, every one of them present
    (modes.resolve_options fills in the defaults). `keeps_history`: the rule keeps state in RuleView.history(),
    which the master then also saves to Redis with each snapshot (for --resume), as gradient-only's update rule."""
    depth = 1
    reads_results = True        # whether the master reads each result (its arrays) before on_result
    keeps_history = False
    staleness_aware = False     # results are merged at 1/their staleness (or 1/--factor): Rule.scale
    broadcasts_updates = False  # every worker starts a round from the same W: with --compress, its change is sent
    #                             compressed (broadcast.py), the master taking W before and after each Merge

    def __init__(self, view: RuleView, options):
        self.view, self.options = view, options
        if options.get("overlap") is not None:      # --overlap / --no-overlap over the mode's default
            self.depth = 1 if options["overlap"] else 0

    def start(self, workers):
        return [Reply(w, "welcome") for w in workers]

    def on_join(self, worker):
        return [Reply(worker, "welcome")]

    def restart(self, workers, from_weights=False):
        """Every worker starts again from W (a restarted master or Redis; `from_weights`: W as the master holds
        it is the one to start from, after a backoff of the rate): as start()."""
        return self.start(workers)

    def on_lost(self, worker):
        return []

    def on_result(self, result):
        raise NotImplementedError

    def settle_weights(self):
        """Make W what is tested and snapshotted now: it already is, but where there is no central W (gossip)."""
        return []

    def summary(self):
        """The mode's own figures for the master's --stats summary."""
        return {}

    def merged_work(self, workers):
        """How many of one process's steps a merge is worth with `workers` live workers, for the linear scaling
        rule (lr_scaling.py): N, in every mode whose merges of a round of N workers add up to one step at the
        solver's rate (sync's mean, gossip's and EASGD's averages). A staleness-aware mode merges each result at
        1/its staleness (or 1/--factor): there the work is the typical staleness (the factor), so that a result
        of typical staleness counts as one step of the solver's, and a staler one as less. The staleness is
        about N with N workers, more where they share cores or overlap their exchange (13.5 at 8 workers on 2
        cores): N alone left each result worth 0.6 of a step there."""
        if not self.staleness_aware:
            return workers
        return self.options.get("factor") or self.view.typical_staleness() or workers

    def scale(self, result):
        """What a result is merged with: 1/--factor where one is given, else 1/its staleness (Zhang, Gupta, Lian
        and Liu 2016, "Staleness-aware async-SGD"). N workers each adding a step computed on weights N merges old
        is N times the step one process takes (the async runs at 4 and 8 workers diverged on LeNet's own rate);
        divided by the staleness, the steps of a round of N results add up to one process's."""
        factor = self.options.get("factor")
        return 1.0 / (factor if factor else result.staleness)

    def scales_by_staleness(self):
        """Whether this rule's merges are scaled by their results' staleness (the master then averages it)."""
        return self.staleness_aware and not self.options.get("factor")

    # What to change when a merge brings NaN or Inf into W (the master's one line says it).
    advice = "lower the solver's base_lr"


class StalenessAwareRule(Rule):
    """A rule that merges each result at 1/its staleness, or 1/--factor (Rule.scale): async, partial-sync,
    weed-out, gradient-only."""
    staleness_aware = True
    advice = "lower the solver's base_lr, or give --factor (W += delta / FACTOR) at least the number of workers"
