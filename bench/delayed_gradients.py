"""Why gradient-only (Downpour) cannot make N workers' images count: one process whose gradients arrive D late.

    python bench/delayed_gradients.py [--runs D:M:R,...] [--batches 2000] [--every 128] [--target 0.85]

Gradient-only's master applies each worker's gradient to a W that has moved on: at N workers it was computed on
the W of about N - 1 updates before (`--stats` mean_staleness 7.3 at 8 workers, staleness counting the update
itself). This bench takes the distribution out of the question: one process, one thread, Caffe's LeNet solver on
Fashion-MNIST, the same images in the same order, where the gradient of batch t is computed on the weights of
update t - D and applied (the solver's own update rule: momentum M, rate R x the lr policy's) to the weights of
update t. D + 1 workers taking turns, each pulling W right after its own last update, are exactly this.
D = 0, M = the solver's 0.9, R = 1 is Caffe's own loop: the reference, measured in the same invocation.

For each run (D:M:R) it prints the images trained when a test (all 10,000 test images, every --every batches)
first reached --target, their ratio to the reference's, the final accuracy, or the update at which the weights
stopped being finite. Beside it, the quadratic model's bound: on f = lambda x^2 / 2 the delayed heavy ball
x' = x + M (x - x_prev) - a x_(t-D), a = rate x lambda, is stable only while every root of
z^(D+1) - (1 + M) z^D + M z^(D-1) + a lies inside the unit circle; "model's bound" is the largest stable
a / (1 - M), the step a steady gradient builds up to, times 1 / lambda: 2 (1 + M) / (1 - M) with no delay (38 at
M = 0.9), 1 at D = 1 whatever M, then about 1.5 / D. A delay that N workers cannot avoid caps the step each
gradient may take, and with it what an image is worth; a lower momentum does not lift the cap. The default runs
are the ones docs/distributed-lr.md and modes/gradient_only.py quote (11 with the reference, 5 minutes on 1 core).
"""
import argparse
import os
import pathlib
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scaling  # noqa: E402  (the bench's solver, data and test net)
from pycaffe_dist.distributed.lr_scaling import delayed_step_bound  # noqa: E402

DEFAULT_RUNS = "0:0:2,1:0.9:1,3:0:4,7:0.9:0.1,7:0.9:0.25,7:0.5:1,7:0:3,7:0:5,15:0:0.75,15:0:1.5"


def parse_runs(text):
    """[(delay, momentum, rate)] from "D:M:R,..."; a bad entry stops the bench with one line."""
    runs = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        parts = entry.split(":")
        try:
            delay, momentum, rate = int(parts[0]), float(parts[1]), float(parts[2])
            if len(parts) != 3 or delay < 0 or not 0 <= momentum < 1 or rate <= 0:
                raise ValueError
        except (ValueError, IndexError):
            raise SystemExit("bench: --runs entry %r: expected DELAY:MOMENTUM:RATE, DELAY >= 0, 0 <= MOMENTUM < 1, "
                             "RATE > 0" % entry)
        runs.append((delay, momentum, rate))
    return runs


class Delayed:
    """Caffe's loop, but the gradient of each batch computed on the weights of `delay` updates before."""

    def __init__(self, args, delay, momentum, rate):
        from pycaffe_dist.io.load import read_solver
        from pycaffe_dist.pycaffe import Solver
        self.delay, self.rate = delay, rate
        name = "d%d_m%s_r%s" % (delay, momentum, rate)
        run = {"max_iter": args.batches, "every": args.every, "dir": scaling.REPO / args.out / name}
        param = read_solver(str(scaling.write_solver(run)))
        param.momentum = momentum
        self.solver = Solver(param)
        self.params = self.solver.net.learnable_params

    def weights(self):
        """A copy of the weights (the Solver's are read and written in place)."""
        return [np.array(w) for w in self.solver.weights]

    def set_weights(self, arrays):
        self.solver.set_weights(arrays)

    def train(self, batches, every, test):
        """[(images, accuracy)] at every test, and the update at which W stopped being finite (None)."""
        versions = [self.weights()] * (self.delay + 1)        # W of updates t - delay .. t
        points = []
        for t in range(batches):
            self.set_weights(versions[0])
            self.solver.net.clear_param_diffs()           # Caffe's Step: backward adds to the diffs
            self.solver.net.forward_backward()
            gradients = [np.array(blob.diff) for blob in self.params]
            self.set_weights(versions[-1])
            self.solver.apply_gradients(gradients, t, self.rate)
            current = self.weights()
            if not all(np.isfinite(w).all() for w in current):
                return points, t + 1
            versions = versions[1:] + [current]
            if (t + 1) % every == 0 or t + 1 == batches:
                points.append(((t + 1) * scaling.BATCH, test(current)))
        return points, None


def tester():
    """accuracy(weights): our TEST net over all 10,000 test images."""
    net = scaling.test_net(1)
    params = net.learnable_params

    def accuracy(arrays):
        for blob, array in zip(params, arrays):
            blob.data[...] = array
        value, _ = scaling.scores(net)
        return 0.0 if value is None else value      # (a test loss that is not finite: the weights are no good)
    return accuracy


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="comma list of DELAY:MOMENTUM:RATE (RATE multiplies the "
                    "solver's lr policy); the reference 0:<the solver's momentum>:1 always runs first")
    ap.add_argument("--batches", type=int, default=2000, help="batches of 64 each run trains on (default 2000)")
    ap.add_argument("--every", type=int, default=128, help="a test every N batches (default 128)")
    ap.add_argument("--target", type=float, default=0.85, help="the test accuracy to reach (default 0.85)")
    ap.add_argument("--out", default="out/bench_delayed", help="the runs' solvers (relative: to the repo root)")
    args = ap.parse_args()
    runs = parse_runs(args.runs)
    scaling.check_data()
    from pycaffe_dist import common
    from pycaffe_dist.io.load import read_solver
    common.set_num_threads(1)
    solver_momentum = round(read_solver(str(scaling.SOLVER)).momentum, 6)     # (a float32 in the message)
    reference = (0, solver_momentum, 1.0)
    runs = [reference] + [r for r in runs if r != reference]
    os.chdir(scaling.REPO)                 # the nets' data sources are relative to the repo root
    test = tester()
    results = []
    for i, (delay, momentum, rate) in enumerate(runs):
        start = time.time()
        points, diverged = Delayed(args, delay, momentum, rate).train(args.batches, args.every, test)
        reached = next((images for images, accuracy in points if accuracy >= args.target), None)
        results.append((delay, momentum, rate, reached, points[-1][1] if points and not diverged else None, diverged))
        outcome = "diverged at update %d" % diverged if diverged else \
            "%s at the end" % ("%.3f" % points[-1][1] if points else "-")
        print("bench: run %d/%d, delay %d, momentum %.3g, rate x %.3g: %s, %.0f s" % (
            i + 1, len(runs), delay, momentum, rate, outcome, time.time() - start), flush=True)
    ref_images = results[0][3]
    print()
    print("| delay | momentum | rate x | steady step x | model's bound | images to %.2f | x reference | final |"
          % args.target)
    print("|---|---|---|---|---|---|---|---|")
    for delay, momentum, rate, reached, final, diverged in results:
        step = rate * (1 - solver_momentum) / (1 - momentum)
        bound = delayed_step_bound(momentum, delay)
        ratio = "-" if reached is None or not ref_images else "%.2f" % (reached / ref_images)
        end = "diverged (update %d)" % diverged if diverged else ("%.3f" % final if final is not None else "-")
        print("| %d | %.3g | %.3g | %.2f | %.3g | %s | %s | %s |" % (delay, momentum, rate, step, bound,
                                                              reached if reached else "no", ratio, end))
    print()
    print("steady step x: the step a steady gradient builds up to, rate / (1 - momentum), over the reference's; "
          "model's bound: the largest stable one on a quadratic, x curvature (the docstring).")
    if not ref_images:
        print("bench: the reference did not reach %.2f: the ratios are undefined" % args.target)


if __name__ == "__main__":
    main()
