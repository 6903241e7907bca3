"""Gradient-only SGD (Downpour): workers push the raw gradient of one forward-backward pass (summed over
iter_size) at the weights they pulled; the master applies the solver's own update rule to W (the same
functions as the local Solver: learning rate at the merge count, clipping, normalization, weight decay,
momentum or Adam's moments, held on the master). Workers wait for each reply (depth 0): computing the next
gradient meanwhile would make every gradient one more update stale, which with momentum diverges (LeNet's
lr 0.01, momentum 0.9 does within 100 merges); `--overlap` allows it anyway. No --tau: a round is one gradient."""
from .base import OVERLAP, Rule

OPTIONS = (OVERLAP,)


class Worker:
    gradients = True

    @staticmethod
    def result(x_start, x_end, gradients, centre, options):
        return gradients

    @staticmethod
    def next_start(status, pulled, x_end, result, in_flight):
        return pulled


class Master(Rule):
    depth = 0

    def on_result(self, worker, message):
        self.master.apply_gradients(self.master.read_result(worker))
        self.master.merged([message])
        self.master.reply(worker, "merged")
