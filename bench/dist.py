"""LeNet on Fashion-MNIST: 1 process (2 BLAS threads) against 2 workers on a Redis parameter server, every mode.

    python bench/dist.py [--iterations 3000] [--every 100] [--modes sync,async,...] [--tau 1]
                         [--extra easgd:tau=4,async:tau=2:factor=2] [--threads 2] [--out out/bench_dist]
                         [--plot out/bench_dist.png]

Runs, one after the other (never two at once), each a `dist_caffe train` child process started in the repo root
(the net's Data layers read data/fashion-mnist/{train,test}.datumfile relative to it):
- "1 process": `train --threads 2`, --iterations solver iterations of one batch of 64 images.
- each mode of --modes: `train --workers 2 --mode M --tau T` (weed-out with --weedout 2, easgd with the default
  moving rate); --extra adds runs `mode:key=value:...`, each key=value becoming `--key value`.
Each run gets its own solver (--out/<run>/solver.prototxt): prototxt/lenet_solver.prototxt with no tests during
training (test_interval 0, no test_iter), random_seed 1 (every run starts from the same weights), display 100 and
a snapshot of the (global) weights every --every iterations and after the last one. Every run trains on the same
number of images, iterations x 64: a distributed run counts merges, and one merge takes 64 x tau images (one
worker's round), 2 x 64 x tau in sync (one round of both workers), so it runs iterations x 64 / (images per merge)
merges and snapshots every --every x 64 / (images per merge) merges (the same images between points).
Units: wall seconds from just before the child is started (Python start-up, the private redis-server and the
workers' joining included) to the snapshot file's mtime. Only after all runs are done (so that scoring does not
compete with training for the 2 cores) is every snapshot scored in this process on all 10,000 test images
(100 batches of 100). "time to 0.85" is the wall time of the first snapshot scoring >= 0.85; "x 1-process" is that
time over the 1-process run's. A snapshot whose test loss is not finite counts as diverged, not scored (NaN outputs
make Caffe's Accuracy layer count every image as right). images/s: for distributed runs the master's
`images_per_s` (--stats: images the workers computed / seconds since they joined); for the 1-process run, images
between its first and last snapshots over the seconds between them. "exchange %" is the master's `exchange_share`:
the part of the workers' rounds spent blocked on the exchange (push, the master's merge and reply, pull of W) that
the overlap with the next round did not hide.
Targets (the issue): the best distributed run reaches 0.85 in <= 0.7 x the 1-process time, and every mode's
tau = 1 run spends < 10 % of a round exchanging. Writes --plot (test accuracy against wall seconds, every run) and
its .json (the raw results) next to it.
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))             # the checkout's package, installed or not (the children get PYTHONPATH)
SOLVER = REPO / "prototxt" / "lenet_solver.prototxt"
NET = REPO / "prototxt" / "lenet_train_test.prototxt"
DATA = [REPO / "data" / "fashion-mnist" / f for f in ("train.datumfile", "test.datumfile")]
MODES = ("sync", "async", "partial-sync", "weed-out", "easgd", "gradient-only")
MODE_OPTIONS = {"weed-out": {"weedout": "2"}}        # options a mode needs to run at all
BATCH, WORKERS, TEST_BATCHES = 64, 2, 100
TARGET_ACCURACY, TARGET_RATIO, TARGET_EXCHANGE = 0.85, 0.7, 0.10
SNAPSHOT = re.compile(r"_iter_(\d+)\.caffemodel$")


# --- plan --------------------------------------------------------------------------------------------------

def check_data():
    missing = [p for p in DATA if not p.exists()]
    if missing:
        idx = "/usr/share/datasets/fashion-mnist/" + "%s"
        steps = ["dist_caffe convert-idx %s-images-idx3-ubyte.gz %s-labels-idx1-ubyte.gz %s --backend datumfile"
                 % (idx % split, idx % split, p.relative_to(REPO))
                 for p, split in ((p, {"train": "train", "test": "t10k"}[p.stem]) for p in missing)]
        raise SystemExit("bench: missing %s\nrun `bash tools/run_main.sh` once, or in %s:\n  %s"
                         % (", ".join(map(str, missing)), REPO, "\n  ".join(steps)))


def parse_run(text, tau):
    """'mode' or 'mode:key=value:...' -> a run: name, mode, tau, the CLI options of the mode."""
    mode, *pairs = text.strip().split(":")
    if mode not in MODES:
        raise SystemExit("bench: unknown mode %r (use %s)" % (mode, ", ".join(MODES)))
    options = dict(MODE_OPTIONS.get(mode, {}), tau=str(tau))
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit("bench: %r: options are key=value, as in easgd:tau=4" % text)
        options[key.replace("_", "-")] = value
    name = mode + "".join(" %s=%s" % (k, v) for k, v in (p.split("=", 1) for p in pairs))
    return {"name": name, "mode": mode, "tau": int(options["tau"]), "options": options, "workers": WORKERS}


def plan(args):
    runs = [{"name": "1 process", "mode": None, "tau": 1, "options": {}, "workers": 1}]
    runs += [parse_run(m, args.tau) for m in args.modes.split(",") if m.strip()]
    runs += [parse_run(e, 1) for e in (args.extra or "").split(",") if e.strip()]
    for run in runs:
        per_merge = BATCH * run["tau"] * (run["workers"] if run["mode"] == "sync" else 1)
        run["max_iter"] = max(1, round(args.iterations * BATCH / per_merge))
        run["every"] = max(1, round(args.every * BATCH / per_merge))
        run["dir"] = args.out / re.sub(r"[^\w.=-]+", "_", run["name"])
    return runs


def write_solver(run):
    """The run's solver: lenet_solver without tests, seeded, snapshotting into the run's directory."""
    from pycaffe_dist.io.load import read_solver
    from google.protobuf import text_format
    solver = read_solver(SOLVER)
    solver.net = str(NET)
    solver.test_interval = 0
    solver.ClearField("test_iter")
    solver.display = 100
    solver.max_iter = run["max_iter"]
    solver.snapshot = run["every"]
    solver.snapshot_after_train = True
    solver.snapshot_prefix = str(run["dir"] / "lenet")
    solver.random_seed = 1
    run["dir"].mkdir(parents=True, exist_ok=True)
    for old in run["dir"].glob("lenet_iter_*"):
        old.unlink()
    path = run["dir"] / "solver.prototxt"
    path.write_text(text_format.MessageToString(solver))
    return path


# --- training ----------------------------------------------------------------------------------------------

def command(run, solver_path, threads):
    cmd = [sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver_path),
           "--iterations", str(run["max_iter"]), "--log", str(run["dir"] / "train.log")]
    if run["mode"] is None:
        return cmd + ["--threads", str(threads)]
    cmd += ["--workers", str(run["workers"]), "--mode", run["mode"], "--stats", str(run["dir"] / "stats.json")]
    for key, value in run["options"].items():
        cmd += ["--" + key, value]
    return cmd


def train(run, threads):
    """Run the child (output to <dir>/output.log), printing progress; fills in t0, wall_s, rc and stats."""
    solver_path = write_solver(run)
    stats_path = run["dir"] / "stats.json"
    stats_path.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    print("bench: %s: %d %s, snapshot every %d ..." % (run["name"], run["max_iter"],
          "iterations" if run["mode"] is None else "merges", run["every"]), flush=True)
    with open(run["dir"] / "output.log", "w") as log:
        run["t0"] = time.time()
        proc = subprocess.Popen(command(run, solver_path, threads), cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                run["rc"] = proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                print("bench:   %s: %.0f s, %d snapshots" % (run["name"], time.time() - run["t0"],
                      len(list(run["dir"].glob("lenet_iter_*.caffemodel")))), flush=True)
    run["wall_s"] = time.time() - run["t0"]
    run["stats"] = json.loads(stats_path.read_text()) if stats_path.exists() else None
    if run["rc"] != 0:
        tail = (run["dir"] / "output.log").read_text().splitlines()[-5:]
        print("bench: %s FAILED (exit %d), see %s:\n  %s" % (run["name"], run["rc"], run["dir"] / "output.log",
              "\n  ".join(tail)), flush=True)
    else:
        print("bench: %s done in %.1f s" % (run["name"], run["wall_s"]), flush=True)


# --- scoring -----------------------------------------------------------------------------------------------

def snapshots(run):
    """[(iteration, wall seconds, path)] of the run's .caffemodel files, by iteration."""
    found = []
    for path in run["dir"].glob("lenet_iter_*.caffemodel"):
        m = SNAPSHOT.search(path.name)
        if m:
            found.append((int(m.group(1)), path.stat().st_mtime - run["t0"], path))
    return sorted(found)


def test_net(threads):
    from pycaffe_dist import common
    from pycaffe_dist.pycaffe import TEST, Net
    common.set_num_threads(threads)
    return Net(str(NET), TEST)


def score(net, path):
    """(accuracy, loss) of the weights in `path` over the 100 test batches of 100 (the whole test set); accuracy
    None where the loss is not finite (diverged weights: NaN scores make Caffe's Accuracy layer count every image
    as right)."""
    import math
    import numpy as np
    from pycaffe_dist.io.caffemodel import load_weights
    load_weights(net, str(path))
    accuracy = loss = 0.0
    for _ in range(TEST_BATCHES):
        net.forward_from_to()
        accuracy += float(np.asarray(net.blobs["accuracy"].data).ravel()[0])
        loss += float(np.asarray(net.blobs["loss"].data).ravel()[0])
    if not math.isfinite(loss):
        return None, None
    return accuracy / TEST_BATCHES, loss / TEST_BATCHES


def evaluate(runs, threads):
    net = test_net(threads)
    for run in runs:
        found = snapshots(run)
        print("bench: scoring %d snapshots of %s ..." % (len(found), run["name"]), flush=True)
        run["points"] = [{"iter": it, "time_s": t, "accuracy": a, "loss": l}
                         for it, t, path in found for a, l in [score(net, path)]]


# --- summary -----------------------------------------------------------------------------------------------

def summarize(run):
    points = run["points"]
    run["time_to_target_s"] = next((p["time_s"] for p in points if (p["accuracy"] or 0) >= TARGET_ACCURACY), None)
    run["final_accuracy"] = points[-1]["accuracy"] if points else None
    run["diverged"] = any(p["accuracy"] is None for p in points)
    if run["mode"] is not None:
        stats = run["stats"] or {}
        run["images_per_s"], run["exchange_share"] = stats.get("images_per_s"), stats.get("exchange_share")
    elif len(points) >= 2:
        first, last = points[0], points[-1]
        run["images_per_s"] = (last["iter"] - first["iter"]) * BATCH / (last["time_s"] - first["time_s"])
        run["exchange_share"] = None
    else:
        run["images_per_s"] = points[0]["iter"] * BATCH / points[0]["time_s"] if points else None
        run["exchange_share"] = None


def pct(share):
    return None if share is None else 100 * share


def table(runs, base):
    fmt = lambda v, f: "-" if v is None else f % v
    header = ["run", "workers", "tau", "time to %.2f (s)" % TARGET_ACCURACY, "x 1-process", "images/s",
              "final accuracy", "exchange % of a round"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        t = run["time_to_target_s"]
        ratio = t / base["time_to_target_s"] if t is not None and base["time_to_target_s"] else None
        final = "diverged (NaN loss)" if run["diverged"] else fmt(run["final_accuracy"], "%.4f")
        cells = [run["name"] + ("" if run["rc"] == 0 else " (FAILED)"), str(run["workers"]), str(run["tau"]),
                 "not reached" if t is None else "%.1f" % t, fmt(ratio, "%.2f"), fmt(run["images_per_s"], "%.0f"),
                 final, fmt(pct(run["exchange_share"]), "%.1f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(runs, base):
    dist = [r for r in runs if r["mode"] is not None]
    reached = [r for r in dist if r["time_to_target_s"] is not None]
    if not reached or base["time_to_target_s"] is None:
        speed = "MISSED (%s did not reach %.2f)" % ("the 1-process run" if base["time_to_target_s"] is None
                                                     else "no distributed run", TARGET_ACCURACY)
    else:
        best = min(reached, key=lambda r: r["time_to_target_s"])
        ratio = best["time_to_target_s"] / base["time_to_target_s"]
        speed = "%s: best %s reaches %.2f in %.1f s = %.2f x the 1-process %.1f s (target <= %.1f)" % (
            "met" if ratio <= TARGET_RATIO else "MISSED", best["name"], TARGET_ACCURACY, best["time_to_target_s"],
            ratio, base["time_to_target_s"], TARGET_RATIO)
    tau1 = [r for r in dist if r["tau"] == 1]
    ok = [r for r in tau1 if r["exchange_share"] is not None and r["exchange_share"] < TARGET_EXCHANGE]
    bad = [r for r in tau1 if r not in ok]
    share = lambda r: "%s %s" % (r["name"], "-" if r["exchange_share"] is None
                                 else "%.1f%%" % pct(r["exchange_share"]))
    if not tau1:
        exchange = "no tau = 1 run"
    else:
        exchange = "%s: exchange < %.0f%% of a round at tau = 1%s%s" % (
            "met" if not bad else "MISSED", 100 * TARGET_EXCHANGE,
            "; met by " + ", ".join(map(share, ok)) if ok else "",
            "; MISSED by " + ", ".join(map(share, bad)) if bad else "")
    return "speed-up target %s\nexchange target %s" % (speed, exchange)


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5))
    for run in runs:
        pts, single = run["points"], run["mode"] is None
        label = ("1 process, %d threads" % run["threads"] if single
                 else "%s (%d workers, tau %d)" % (run["name"], run["workers"], run["tau"]))
        accuracy = [float("nan") if p["accuracy"] is None else p["accuracy"] for p in pts]   # gaps where diverged
        ax.plot([p["time_s"] for p in pts], accuracy, "o-" if single else ".-", lw=2.5 if single else 1.2, ms=4,
                label=label)
    ax.axhline(TARGET_ACCURACY, color="grey", ls="--", lw=0.8, label="%.2f" % TARGET_ACCURACY)
    ax.set(xlabel="wall seconds since launch", ylabel="test accuracy (10,000 images)",
           title="LeNet, Fashion-MNIST: 1 process against 2 workers on Redis")
    lowest = min([p["accuracy"] for r in runs for p in r["points"] if p["accuracy"] is not None] + [0.8])
    ax.set_ylim(max(0.0, lowest - 0.02), None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    print("bench: wrote", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=3000, help="1-process iterations (all runs: as many images)")
    ap.add_argument("--every", type=int, default=100, help="snapshot (test point) every N iterations' images")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of modes (default: all six)")
    ap.add_argument("--tau", type=int, default=1, help="local steps per round of the --modes runs (default 1)")
    ap.add_argument("--extra", help="more runs, comma list of mode:key=value:..., e.g. easgd:tau=4")
    ap.add_argument("--threads", type=int, default=2, help="threads of the 1-process run and of scoring")
    ap.add_argument("--out", default="out/bench_dist", help="run directories (relative: to the repo root)")
    ap.add_argument("--plot", default="out/bench_dist.png", help="PNG to write (relative: to the repo root); the "
                    "raw results go to the same name with .json")
    args = ap.parse_args()
    args.out = pathlib.Path(args.out) if os.path.isabs(args.out) else REPO / args.out
    plot_path = pathlib.Path(args.plot) if os.path.isabs(args.plot) else REPO / args.plot
    check_data()
    os.chdir(REPO)                        # the TEST net's data source is relative to the repo root
    runs = plan(args)
    start = time.time()
    for run in runs:
        run["threads"] = args.threads if run["mode"] is None else 1
        train(run, args.threads)
    print("bench: training done in %.0f s" % (time.time() - start), flush=True)
    evaluate(runs, args.threads)
    for run in runs:
        summarize(run)
    base = runs[0]
    print()
    print(table(runs, base))
    print()
    print(verdict(runs, base))
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, plot_path)
    keep = ("name", "mode", "tau", "workers", "options", "threads", "max_iter", "every", "rc", "wall_s", "points",
            "time_to_target_s", "final_accuracy", "diverged", "images_per_s", "exchange_share", "stats")
    raw = {"iterations": args.iterations, "every": args.every, "target_accuracy": TARGET_ACCURACY,
           "runs": [dict({k: run.get(k) for k in keep}, dir=str(run["dir"])) for run in runs]}
    plot_path.with_suffix(".json").write_text(json.dumps(raw, indent=1))
    print("bench: wrote", plot_path.with_suffix(".json"))


if __name__ == "__main__":
    main()
