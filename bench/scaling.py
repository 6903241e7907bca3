"""Does distributed training scale? LeNet on Fashion-MNIST: 1..N workers in every mode against 1 process and DDP.

    python bench/scaling.py [--batches 2000] [--every 80] [--workers 1,2,4,8,16] [--modes sync,async,...]
                            [--compress 1bit,topk:0.01,...] [--lr-scaling linear,sqrt,none] [--images]
                            [--threads 1] [--link RATE:DELAY] [--target 0.85] [--servers 1,2,4]
                            [--timeout 1800]
                            [--out out/bench_scaling] [--plot <out>.png]

Every run trains prototxt/lenet_solver.prototxt's LeNet (prototxt/lenet_train_test.prototxt) from the same
weights (random_seed 1) on the same images: --batches batches of 64 in total (128,000 images by default, 2.1
epochs of the 60,000). Runs, one after the other (never two at once), each in child processes started in the repo
root (the net's Data layers read data/fashion-mnist/{train,test}.datumfile relative to it), T = --threads:
- "1 process, 1 thread": `dist_caffe train --threads 1`, --batches solver iterations; the baseline of the speed-ups.
- for each N of --workers, capped so that N x T <= the cores this process may use (os.sched_getaffinity; the
  bench prints the N it drops and why: workers sharing cores would time each other's slices, not scale):
  - "1 process, N*T threads": `dist_caffe train --threads N*T` (run once per thread count; also a 2-thread one,
    which the first target names).
  - "DDP": PyTorch DistributedDataParallel, backend gloo on the CPU, N processes (this script with --ddp-child,
    MASTER_ADDR 127.0.0.1 and a free MASTER_PORT), each torch.set_num_threads(T). The same net, the same initial
    weights (taken from our solver with random_seed 1) and Caffe's SGD rule (bench/train_lenet.py: lr_mult,
    decay_mult, the inv policy, Caffe's momentum form). Rank r reads the training datumfile and keeps the records
    p with p % N == r, in file order (the shard our workers' Data layers read), and takes batches of 64 from it in
    order with wrap-around, batches/N steps: the same images in total. DDP averages the N gradients of a step, so
    its effective batch is 64 N and the learning-rate schedule counts steps (batches/N of them), not images;
    its rate follows our default rule (distributed/lr_scaling.py): N x the solver's, reached by one more solver's
    rate every 2 % of the steps.
    Rank 0 writes the weights (.npz) at the same image counts as our snapshots.
  - each mode of --modes: `dist_caffe train --workers N --mode M --threads T --stats F` with no mode options (the
    modes' defaults; a mode that cannot run without options fails and is reported as failed), plus `--link
    RATE:DELAY` when given (the link applies to our distributed runs only; the references run locally). With
    `--compress C1,C2,...` a mode that takes --compress (sync, async, gradient-only, local-sgd) runs once per
    codec (`none` for the float32 results), a row each; the others run once, uncompressed.
    A distributed run counts merges: one merge takes one worker batch (64 images, tau 1) in the async-like modes,
    one round of all N workers (64 N images) in sync and gossip and one of N workers x tau 8 steps (64 x 8 N
    images) in local-sgd, so it runs batches (sync, gossip: batches / N; local-sgd: batches / 8 N) merges. Gossip
    has no global W: its snapshots are the mean of the workers' weights.
    Sandblaster counts L-BFGS iterations: one evaluates the objective twice on a sample of 32 batches (its default
    --sample-batches) when its line search takes the first step, the usual case, so it runs batches / 64
    iterations; its points' images are the images it computed per iteration on average (its stats' images /
    iterations), its line searches' further evaluations included.
    "pipeline" is `dist_caffe train --pipeline N` (N stages of one model, no data parallelism; its default
    micro-batches): solver iterations of one batch, as the 1-process run; its exchange % is the stages' share of
    time spent waiting for, sending or receiving activations and their gradients.
Each run gets its own solver (--out/<run>/solver.prototxt): lenet_solver with no tests during training, random
seed 1, a snapshot of the (global) weights every --every batches' images (every --every iterations, merges in the
async-like modes, --every / N merges in sync, gossip and DDP steps) and after the last one.
Units: wall seconds from just before the first child is started (Python start-up, torch's import, the private
redis-server and the workers' joining included) to the snapshot file's mtime. Only after all runs are done (so that
scoring does not compete with training for the cores) is every snapshot scored in this process, with our Net, on
all 10,000 test images (100 batches of 100). A snapshot whose test loss is not finite counts as diverged and is
not scored (NaN outputs make Caffe's Accuracy layer count every image as right); a run with one is "diverged".
- time to 0.85: wall seconds to the first snapshot scoring >= --target (0.85) test accuracy; "x 1-process (1
  thread)", "x 1-process (N*T threads)", "x DDP (same N)": that time over the reference's, all measured in this
  invocation.
- images/s: images between the run's first and last snapshots over the seconds between them (the same rule for
  every run, start-up left out); speed-up: that over the 1-thread process's. The master's own images_per_s
  (images the workers computed / seconds since they joined) is in the .json.
- exchange %: the master's `exchange_share` (--stats): the part of the workers' rounds spent blocked on the
  exchange (push, the master's merge and reply, pull of W) that the overlap with the next round did not hide; for
  Sandblaster, whose workers do not exchange in rounds, its `idle_share`: the part of the workers' time spent with
  no unit to compute (the master's L-BFGS step, a line search's wait for the slowest unit).
Targets (the issue), at N = 8 workers x 2 threads: the best mode reaches 0.85 in <= 0.25 x the time of one 2-thread
process and in <= 0.8 x the time of DDP with 8 processes; each mode spends <= 10 % of a round exchanging. Each is
printed as met, NOT MET, or not measured here (e.g. no N = 8 on a 2-core machine).
Writes --plot (default --out + .png, out/bench_scaling.png: test accuracy against wall seconds, every run; images/s
over the 1-thread process against N, per mode, with the linear N x T line) and its .json (the raw results) beside it.
Images to accuracy (the time-to-accuracy issue): `--images --workers 1,2,4,8,16,32 --lr-scaling linear,none
--every 64` runs every N whatever the cores (images to accuracy do not depend on them; its times and speed-ups then
say nothing) and adds, per mode and --lr-scaling policy, the images trained to --target and their ratio to one
process's ("x 1-process images") to the table, and a third plot: images to --target against N, where one process's
is the flat line to hold.
"allreduce" is `dist_caffe train --workers N --mode allreduce`: an MPI world of N workers averaging their gradients
over a ring every iteration (64 N images, as sync's round); its exchange % is the part of an iteration spent
waiting for the ring after the backward (what the buckets' overlap did not hide), and "hub bytes/merge" the most
bytes one process sent or received per merge (--stats hub_bytes_per_merge; the master-based modes: the master or a
Redis server, measured from the Store's blob bytes and INFO stats).
Projection (printed after the targets): images/s against N up to 256 workers over 10 and 25 Gbit/s links, from what
this run measured (one worker's compute per batch c: the 1-thread process's; the model's bytes M; the sync master's
CPU per result r, when sync ran) and a model of a round:
  all-reduce (ring):      t = c + 2 (N - 1) / N x M / B + 2 (N - 1) x L
  one master (sync):      t = c + N x M / B + N x r
  K master shards:        t = c + N x M / (K B) + N x r / K          (K = N / 8, at least 1)
with B the link's bytes per second and L = 50 us a message's latency; images/s = 64 N / t. No overlap of the
exchange with the backward is counted (a bound from below for all-reduce). The model is checked against the points
measured here: its t at the measured N with B = infinity (one machine's memory) beside the measured one.
Parameter server shards: `--servers 1,2,4` runs each mode with a central W (sync, async, partial-sync, weed-out,
easgd, gradient-only) once per K, `train --servers K` (K shards, each merging a K-th of W at a redis-server of its
own; K = 1: the master merges W, with one redis-server), a row each, and prints, per mode and N, each K's hub
bytes/merge over K = 1's against the issue's bound, 1.2 / K.
A smoke run (a minute or two): --batches 200 --every 20 --workers 1,2 --modes async,sync [--target 0.75].
"""
import argparse
import json
import math
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))             # the checkout's package, installed or not (the children get PYTHONPATH)
SOLVER = REPO / "prototxt" / "lenet_solver.prototxt"
NET = REPO / "prototxt" / "lenet_train_test.prototxt"
DATA = [REPO / "data" / "fashion-mnist" / f for f in ("train.datumfile", "test.datumfile")]
MODES = ("sync", "async", "partial-sync", "weed-out", "easgd", "gradient-only", "gossip", "sandblaster", "local-sgd",
         "pipeline", "allreduce")
PER_ROUND = ("sync", "gossip", "local-sgd", "allreduce")    # the modes whose merge is a round of all N workers
SANDBLASTER_BATCHES_PER_ITER = 2 * 32     # two evaluations of a sample of --sample-batches 32: see the docstring
BATCH, TEST_BATCHES, SCALE = 64, 100, 0.00390625        # lenet_train_test: batch 64, transform scale 1/256
TARGET_N, TARGET_THREADS = 8, 2
TARGET_VS_2_THREADS, TARGET_VS_DDP, TARGET_EXCHANGE = 0.25, 0.8, 0.10
SNAPSHOT = re.compile(r"_iter_(\d+)\.(caffemodel|npz)$")
POLL_S = 10


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


def worker_counts(args, cores):
    """The N of --workers that fit the cores (N x T threads); prints the ones dropped and why."""
    wanted = sorted({int(n) for n in args.workers.split(",") if n.strip()})
    if not wanted or wanted[0] < 1:
        raise SystemExit("bench: --workers takes counts >= 1, got %r" % args.workers)
    kept = [n for n in wanted if n * args.threads <= cores]
    dropped = [n for n in wanted if n not in kept]
    if dropped:
        print("bench: stopping at N = %s: N = %s would need %s threads (N x %d) and this process may use %d cores "
              "(os.sched_getaffinity); workers sharing cores time each other's slices instead of scaling"
              % (kept[-1] if kept else "-", ",".join(map(str, dropped)),
                 ",".join(str(n * args.threads) for n in dropped), args.threads, cores), flush=True)
    if not kept:
        raise SystemExit("bench: no N of --workers fits %d cores with --threads %d" % (cores, args.threads))
    return kept


def new_run(args, kind, n, threads, mode=None, compress=None, scaling=None, servers=None):
    """A run: kind 'single' (one process), 'ddp' or 'ours' (a distributed mode, its results sent as --compress
    says when given, its rate scaled by --lr-scaling `scaling` where the mode takes it, its W merged by `servers`
    shards where given), on n processes or workers."""
    name = {"single": "1 process, %d thread%s" % (threads, "" if threads == 1 else "s"),
            "ddp": "DDP N=%d" % n, "ours": "%s N=%d" % (mode, n)}[kind] + (" %s" % compress if compress else "") \
        + (" lr-scaling %s" % scaling if scaling else "") + (" servers=%d" % servers if servers else "")
    # Batches of 64 per solver iteration / merge / DDP step: N of them where all N move together, tau each.
    if kind != "ours":
        per_iter = n if kind == "ddp" else 1
    else:
        per_iter = SANDBLASTER_BATCHES_PER_ITER if mode == "sandblaster" else 1 if mode == "pipeline" else \
            (n if mode in PER_ROUND else 1) * tau_of(mode)
    if args.batches % per_iter or args.every % per_iter:
        print("bench: %s: --batches %d and --every %d are not multiples of %d: rounded, so its images differ a little"
              % (name, args.batches, args.every, per_iter), flush=True)
    return {"name": name, "kind": kind, "n": n, "mode": mode, "compress": compress, "scaling": scaling,
            "servers": servers, "threads": threads,
            "images_per_iter": BATCH * per_iter,
            "max_iter": max(1, round(args.batches / per_iter)), "every": max(1, round(args.every / per_iter)),
            "dir": args.out / re.sub(r"[^\w.=-]+", "_", name)}


def tau_of(mode):
    """The local steps of a round in `mode` with no options (its default)."""
    from pycaffe_dist.distributed.data_parallel.modes import MODES as DECLARED, resolve_options
    return resolve_options(mode, {}).get("tau", 1) if mode in DECLARED else 1


def takes_compress(mode):
    from pycaffe_dist.distributed.data_parallel.modes import MODES as DECLARED
    return mode in DECLARED and any(option.name == "compress" for option in DECLARED[mode].OPTIONS)


def takes_servers(mode):
    from pycaffe_dist.distributed.data_parallel.shard import SHARDED_MODES
    return mode in SHARDED_MODES


def takes_scaling(mode):
    from pycaffe_dist.distributed.data_parallel.modes import MODES as DECLARED
    return mode in DECLARED or mode == "allreduce"      # not sandblaster or the pipeline


def series(run):
    """What a run is a point of in the plots: its mode (codec, lr scaling, shards), or its kind."""
    if not run["mode"]:
        return run["kind"]
    return run["mode"] + (" " + run["compress"] if run["compress"] else "") + \
        (" lr-scaling " + run["scaling"] if run.get("scaling") else "") + \
        (" servers=%d" % run["servers"] if run.get("servers") else "")


def plan(args, counts):
    """The runs in order: the 1-thread process, then per N its N*T-thread process (once per thread count), DDP
    and the modes; a 2-thread process too if no N gives one (the first target's reference)."""
    runs = [new_run(args, "single", 1, 1)]
    thread_counts = {1}
    for n in counts:
        if n * args.threads not in thread_counts and n * args.threads <= args.cores:
            thread_counts.add(n * args.threads)
            runs.append(new_run(args, "single", 1, n * args.threads))
        runs.append(new_run(args, "ddp", n, args.threads, scaling="linear"))
        runs += [new_run(args, "ours", n, args.threads, mode, compress, scaling, servers) for mode in args.modes
                 for compress in (args.compress if takes_compress(mode) else [None])
                 for scaling in (args.lr_scaling if takes_scaling(mode) and args.lr_scaling != ["linear"]
                                 else [None])
                 for servers in (args.servers or [None] if takes_servers(mode) and not compress else [None])]
    if TARGET_THREADS not in thread_counts and args.cores >= TARGET_THREADS:
        runs.insert(1, new_run(args, "single", 1, TARGET_THREADS))
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


def write_initial_weights(solver_path, path):
    """The weights every run starts from (our solver's fill with random_seed 1), as .npz for the DDP children."""
    import numpy as np
    from pycaffe_dist.pycaffe import Solver
    solver = Solver(str(solver_path))
    blobs = [np.array(b.data) for layer in solver.net.params.values() for b in layer]
    with open(path, "wb") as f:
        np.savez(f, *blobs)


# --- training ----------------------------------------------------------------------------------------------

def child_env(threads, **extra):
    return dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                MKL_NUM_THREADS=str(threads), **extra,
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(run, solver_path, args):
    """Start the run's processes (output to <dir>/output*.log); [Popen], each in a session of its own so that a
    timeout can stop it with whatever it started (workers, redis-server)."""
    def popen(cmd, env, log_name):
        with open(run["dir"] / log_name, "w") as log:
            return subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    if run["kind"] == "ddp":
        port = str(free_port())
        return [popen([sys.executable, str(pathlib.Path(__file__).resolve()), "--ddp-child", str(solver_path),
                       "--threads", str(run["threads"]), "--init", str(args.out / "initial_weights.npz"),
                       "--lr-scaling", run["scaling"] or "linear"],
                      child_env(run["threads"], MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                                WORLD_SIZE=str(run["n"])), "output.rank%d.log" % rank)
                for rank in range(run["n"])]
    cmd = [sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver_path), "--iterations",
           str(run["max_iter"]), "--threads", str(run["threads"]), "--log", str(run["dir"] / "train.log")]
    if run["kind"] == "ours":
        cmd += (["--pipeline", str(run["n"])] if run["mode"] == "pipeline" else
                ["--workers", str(run["n"]), "--mode", run["mode"]]) + ["--stats", str(run["dir"] / "stats.json")]
        if args.link:
            cmd += ["--link", args.link]
        if run["compress"]:
            cmd += ["--compress", run["compress"]]
        if run.get("scaling"):
            cmd += ["--lr-scaling", run["scaling"]]
        if run.get("servers"):
            cmd += ["--servers", str(run["servers"])]
    return [popen(cmd, child_env(run["threads"]), "output.log")]


def stop(procs):
    """End the run's process groups (ours: started by start(), by their ids): TERM, then KILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 10
        while any(p.poll() is None for p in procs) and time.time() < deadline:
            time.sleep(0.2)


def last_line(path):
    lines = [l for l in path.read_text(errors="replace").splitlines() if l.strip()] if path.exists() else []
    return lines[-1].strip() if lines else "(no output)"


def train(run, args):
    """Run it, printing progress; fills in t0, wall_s, rc, error and stats. A failure is recorded, not raised."""
    solver_path = write_solver(run)
    stats_path = run["dir"] / "stats.json"
    stats_path.unlink(missing_ok=True)
    unit = {"single": "iterations", "ddp": "steps", "ours": "merges"}[run["kind"]]
    unit = {"sandblaster": "L-BFGS iterations (about)", "pipeline": "iterations"}.get(run["mode"], unit)
    print("bench: %s: %d %s of %d images, snapshot every %d ..." % (run["name"], run["max_iter"], unit,
          run["images_per_iter"], run["every"]), flush=True)
    run["t0"] = time.time()
    procs = start(run, solver_path, args)
    run["error"], report_at = None, run["t0"] + POLL_S
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            stop(procs)                   # a DDP rank that died leaves the others waiting in an allreduce
            break
        if time.time() - run["t0"] > args.timeout:
            run["error"] = "timed out after %.0f s" % (time.time() - run["t0"])
            stop(procs)
            break
        time.sleep(0.5)
        if time.time() >= report_at:
            report_at += POLL_S
            print("bench:   %s: %.0f s, %d snapshots" % (run["name"], time.time() - run["t0"], len(snapshots(run))),
                  flush=True)
    run["wall_s"] = time.time() - run["t0"]
    codes = [p.wait() for p in procs]
    run["rc"] = next((c for c in codes if c != 0), 0)
    run["stats"] = json.loads(stats_path.read_text()) if stats_path.exists() else None
    if run["rc"] != 0:
        log = run["dir"] / ("output.rank%d.log" % codes.index(run["rc"]) if run["kind"] == "ddp" else "output.log")
        run["error"] = run["error"] or "exit %d: %s" % (run["rc"], last_line(log))
        print("bench: %s FAILED (%s), see %s" % (run["name"], run["error"], log), flush=True)
    else:
        print("bench: %s done in %.1f s" % (run["name"], run["wall_s"]), flush=True)


def load_shard(path, rank, world):
    """The records p % world == rank of a datumfile, in file order: (uint8 images (n, 1, 28, 28), int64 labels)."""
    import numpy as np
    from pycaffe_dist.data.sources import open_records, parse_datum
    images, labels = [], []
    with open_records(str(path), "datumfile") as source:
        for p, (key, value) in enumerate(source):
            if p % world == rank:
                datum = parse_datum(value, "%s: record %r" % (path, key))
                images.append(np.frombuffer(datum.data, np.uint8).reshape(datum.channels, datum.height, datum.width))
                labels.append(datum.label)
    return np.stack(images), np.asarray(labels, np.int64)


def ddp_child(solver_path, init_path, threads, scaling="linear"):
    """One DDP rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment): Caffe's SGD on its shard, the
    gradients averaged by DDP; rank 0 writes the weights every `snapshot` steps and after the last one."""
    import datetime
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from train_lenet import caffe_sgd_step, param_mults, torch_lenet   # bench/, this script's directory
    from pycaffe_dist.distributed import lr_scaling
    from pycaffe_dist.io.load import read_net, read_solver
    from pycaffe_dist.proto import caffe_pb2
    torch.set_num_threads(threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    s = read_solver(solver_path)
    net = read_net(s.net)
    train_data = next(l.data_param for l in net.layer if l.type == "Data" and l.include[0].phase == caffe_pb2.TRAIN)
    images, labels = load_shard(REPO / train_data.source, rank, world)
    model = torch_lenet(torch, 0)
    with torch.no_grad(), np.load(init_path) as init:
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.from_numpy(init["arr_%d" % i]))
    ddp = DistributedDataParallel(model)
    params = [(p, lr_mult, decay_mult) for p, (lr_mult, decay_mult) in zip(model.parameters(), param_mults(net))]
    history = [torch.zeros_like(p) for p, _, _ in params]
    loss_fn = torch.nn.CrossEntropyLoss()             # SoftmaxWithLoss, normalization VALID: mean over the batch
    batch = train_data.batch_size

    def snapshot(step):
        path = "%s_iter_%d.npz" % (s.snapshot_prefix, step)
        with open(path + ".tmp", "wb") as f:          # renamed when complete (keeps the write's mtime)
            np.savez(f, *[p.detach().numpy() for p in model.parameters()])
        os.replace(path + ".tmp", path)

    for step in range(s.max_iter):
        idx = np.arange(step * batch, (step + 1) * batch) % len(images)
        x = torch.from_numpy(images[idx].astype(np.float32) * np.float32(SCALE))
        model.zero_grad(set_to_none=False)
        loss = loss_fn(ddp(x), torch.from_numpy(labels[idx]))
        loss.backward()                               # DDP: the gradients averaged over the ranks
        # The rule our data-parallel runs follow by default (distributed/lr_scaling.py): DDP's mean of `world`
        # gradients is a step of a batch `world` times larger, its rate scaled by `world` after the same warmup.
        caffe_sgd_step(torch, params, history, s, step,
                       lr_scaling.scale(scaling, world, step, lr_scaling.warmup_step({}, s.max_iter)))
        if rank == 0 and s.display and step % s.display == 0:
            print("Iteration %d, loss = %g" % (step, loss.item()), flush=True)
        if rank == 0 and ((step + 1) % s.snapshot == 0 or step + 1 == s.max_iter):
            snapshot(step + 1)
    # all ranks leave together: a rank that left while the other was still in gloo's last collective once aborted
    # it ("terminate called without an active exception") at its exit
    dist.barrier()
    dist.destroy_process_group()


# --- scoring -----------------------------------------------------------------------------------------------

def snapshots(run):
    """[(iteration, wall seconds, path)] of the run's snapshots (.caffemodel, DDP's .npz), by iteration."""
    found = []
    for path in run["dir"].glob("lenet_iter_*"):
        m = SNAPSHOT.search(path.name)
        if m:
            found.append((int(m.group(1)), path.stat().st_mtime - run["t0"], path))
    return sorted(found)


def test_net(threads):
    from pycaffe_dist import common
    from pycaffe_dist.pycaffe import TEST, Net
    common.set_num_threads(threads)
    return Net(str(NET), TEST)


def load(net, path):
    """Our .caffemodel, or DDP's .npz (the blobs in the net's order: torch's shapes are Caffe's)."""
    import numpy as np
    from pycaffe_dist.io.caffemodel import load_weights
    if path.suffix == ".caffemodel":
        return load_weights(net, str(path))
    blobs = [b for layer in net.params.values() for b in layer]
    with np.load(path) as arrays:
        for i, blob in enumerate(blobs):
            blob.data[...] = arrays["arr_%d" % i]


def score(net, path):
    """(accuracy, loss) of the weights in `path` over the 100 test batches of 100 (the whole test set); (None,
    None) where the loss is not finite (diverged weights: NaN scores make the Accuracy layer count all as right)."""
    load(net, path)
    return scores(net)


def scores(net):
    """score() of the weights the test net holds now."""
    import numpy as np
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
        stats = run.get("stats") or {}
        if run["mode"] == "sandblaster" and stats.get("count"):
            run["images_per_iter"] = stats["images"] / stats["count"]       # what its iterations computed
        print("bench: scoring %d snapshots of %s ..." % (len(found), run["name"]), flush=True)
        run["points"] = [{"iter": it, "images": it * run["images_per_iter"], "time_s": t, "accuracy": a, "loss": l}
                         for it, t, path in found for a, l in [score(net, path)]]


# --- summary -----------------------------------------------------------------------------------------------

def summarize(run, target):
    points = run["points"]
    run["time_to_target_s"] = next((p["time_s"] for p in points if (p["accuracy"] or 0) >= target), None)
    run["images_to_target"] = next((p["images"] for p in points if (p["accuracy"] or 0) >= target), None)
    run["final_accuracy"] = points[-1]["accuracy"] if points else None
    run["diverged"] = any(p["accuracy"] is None for p in points)
    if len(points) >= 2 and points[-1]["time_s"] > points[0]["time_s"]:
        first, last = points[0], points[-1]
        run["images_per_s"] = (last["images"] - first["images"]) / (last["time_s"] - first["time_s"])
    else:
        run["images_per_s"] = points[0]["images"] / points[0]["time_s"] if points else None
    stats = run.get("stats") or {}
    run["exchange_share"] = stats.get("exchange_share", stats.get("idle_share"))     # (Sandblaster: idle)
    run["master_images_per_s"] = stats.get("images_per_s")


def references(runs):
    """Lookups of the reference runs: the 1-process run by thread count, DDP by N."""
    single = {r["threads"]: r for r in runs if r["kind"] == "single"}
    ddp = {r["n"]: r for r in runs if r["kind"] == "ddp"}
    return single, ddp


def round_bytes(run):
    stats = run.get("stats") or {}
    if "bytes_per_iteration" in stats:          # a pipeline: what crosses its cuts per batch, both ways
        return "%d (cuts)" % stats["bytes_per_iteration"]
    sent, dense = stats.get("bytes_per_result"), stats.get("float32_bytes_per_result")
    if sent is None:
        return "-"
    text = "%d" % sent + (" (1/%.1f)" % (dense / sent) if sent != dense else "")
    pulled = stats.get("bytes_per_pull")
    if pulled is not None and pulled != dense:          # W comes down compressed too (sync, local-sgd)
        text += ", down %d" % pulled
    return text


def hub_bytes(run):
    stats = run.get("stats") or {}
    hub, model = stats.get("hub_bytes_per_merge"), stats.get("model_bytes")
    if hub is None:
        return "-"
    return "%d" % hub + (" (%.2fx model)" % (hub / model) if model else "")


LINK_LATENCY_S = 50e-6
PROJECTED_N = (2, 4, 8, 16, 32, 64, 128, 256)
LINKS_GBIT = (10, 25)


def round_time(kind, n, compute_s, model_bytes, per_result_s, link_bytes_s, shards=1):
    """A round's seconds in the projection's model (the module's docstring): `kind` "allreduce" or "hub"."""
    if kind == "allreduce":
        return compute_s + 2 * (n - 1) / n * model_bytes / link_bytes_s + 2 * (n - 1) * LINK_LATENCY_S
    return compute_s + n * model_bytes / (shards * link_bytes_s) + n * per_result_s / shards


def projection(runs, args):
    """Images/s against N over 10 and 25 Gbit/s links, from this run's measured costs; and the model's check
    against the points measured here."""
    single, _ = references(runs)
    base = single.get(1)
    model = next((r["stats"]["model_bytes"] for r in runs if (r.get("stats") or {}).get("model_bytes")), None)
    if not base or not base.get("images_per_s") or not model:
        return "Projection: needs the 1-thread process and a run that reports model_bytes (allreduce)."
    compute = BATCH / base["images_per_s"]
    syncs = [r for r in runs if r["mode"] == "sync" and (r.get("servers") or 1) == 1
             and (r.get("stats") or {}).get("master_cpu_ms_per_merge")]
    per_result = syncs[0]["stats"]["master_cpu_ms_per_merge"] / 1e3 / syncs[0]["n"] if syncs else 0.0
    lines = ["Projection (images/s; c = %.2f ms a batch, M = %.2f MB, r = %.2f ms of the master per result%s):"
             % (1e3 * compute, model / 1e6, 1e3 * per_result, "" if syncs else " (no sync run: 0)"),
             "| N | " + " | ".join("%s %d Gbit/s" % (kind, g) for g in LINKS_GBIT
                                   for kind in ("allreduce", "one master", "N/8 shards")) + " |",
             "|" + "---|" * (1 + 3 * len(LINKS_GBIT))]
    for n in PROJECTED_N:
        cells = []
        for gbit in LINKS_GBIT:
            link = gbit * 1e9 / 8
            for kind, shards in (("allreduce", 1), ("hub", 1), ("hub", max(1, n // 8))):
                cells.append("%.0f" % (BATCH * n / round_time(kind, n, compute, model, per_result, link, shards)))
        lines.append("| %d | %s |" % (n, " | ".join(cells)))
    lines.append("")
    lines.append("The model against this run's points (B = infinity: one machine; measured / model):")
    for run in runs:
        if run["kind"] != "ours" or run["mode"] not in ("allreduce", "sync") or not run.get("images_per_s"):
            continue
        kind = "allreduce" if run["mode"] == "allreduce" else "hub"
        modelled = BATCH * run["n"] / round_time(kind, run["n"], compute, model, per_result, float("inf"),
                                                 run.get("servers") or 1)
        lines.append("- %s: %.0f images/s measured, %.0f modelled (%.2f)" % (run["name"], run["images_per_s"],
                                                                           modelled, run["images_per_s"] / modelled))
    return "\n".join(lines)


SHARDS_BOUND = 1.2         # the issue's: K shards' hub bytes per merge <= 1.2 / K of one server's


def shards_report(runs):
    """Per mode and N: each --servers K's hub bytes per merge over --servers 1's, against SHARDS_BOUND / K."""
    lines = []
    for run in runs:
        k = run.get("servers")
        if not k or k == 1:
            continue
        one = next((r for r in runs if r["mode"] == run["mode"] and r["n"] == run["n"] and r.get("servers") == 1
                    and r.get("scaling") == run.get("scaling")), None)
        hub = (run.get("stats") or {}).get("hub_bytes_per_merge")
        base = one and (one.get("stats") or {}).get("hub_bytes_per_merge")
        if not hub or not base:
            lines.append("- %s: not measured (it or its servers=1 run has no hub_bytes_per_merge)" % run["name"])
            continue
        r = hub / base
        lines.append("- %s: hub bytes/merge %.0f = %.3f x servers=1's %.0f, bound %.3f: %s"
                     % (run["name"], hub, r, base, SHARDS_BOUND / k, "met" if r <= SHARDS_BOUND / k else "NOT MET"))
    return "\n".join(["Shards (hub bytes per merge against --servers 1, bound %.1f / K):" % SHARDS_BOUND] + lines) \
        if lines else ""


def ratio(run, ref):
    t, base = run["time_to_target_s"], ref and ref["time_to_target_s"]
    return t / base if t is not None and base else None


def fmt(value, form):
    return "-" if value is None else form % value


def percent(share):
    return None if share is None else 100 * share


def table(runs, args):
    single, ddp = references(runs)
    base = single[1]
    header = ["run", "N", "mode", "images to %.2f" % args.target, "x 1-process images",
              "time to %.2f (s)" % args.target, "x 1-process (1 thread)",
              "x 1-process (N*T threads)", "x DDP (same N)", "final accuracy", "images/s", "speed-up vs 1 thread",
              "exchange %", "bytes/round", "hub bytes/merge"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        t = run["time_to_target_s"]
        own = run["kind"] != "single" and single.get(run["n"] * args.threads)
        if run["rc"] != 0:
            final = "FAILED (see below)"
        else:
            final = "diverged (NaN loss)" if run["diverged"] else fmt(run["final_accuracy"], "%.4f")
        speed = run["images_per_s"] / base["images_per_s"] if run["images_per_s"] and base["images_per_s"] else None
        images = run["images_to_target"]
        images_ratio = images / base["images_to_target"] if images and base["images_to_target"] else None
        cells = [run["name"], str(run["n"]), run["mode"] or ("DDP, gloo" if run["kind"] == "ddp" else "-"),
                 "not reached" if images is None else "%d" % images, fmt(images_ratio, "%.2f"),
                 "not reached" if t is None else "%.1f" % t,
                 fmt(ratio(run, base), "%.2f"), fmt(ratio(run, own) if own else None, "%.2f"),
                 fmt(ratio(run, ddp.get(run["n"])) if run["kind"] == "ours" else None, "%.2f"), final,
                 fmt(run["images_per_s"], "%.0f"), fmt(speed, "%.2f"), fmt(percent(run["exchange_share"]), "%.1f"),
                 round_bytes(run), hub_bytes(run)]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["N: processes (the workers of ours, DDP's ranks); T = --threads %d per worker or rank." % args.threads,
             "bytes/round: what a worker sends the master per round, its result (--stats bytes_per_result; the "
             "fraction of float32's where compressed; \"down\": what it pulls, where W comes down compressed too; "
             "Sandblaster: a worker's sums per evaluation); a pipeline: the activations and their gradients crossing "
             "its cuts per batch.",
             "hub bytes/merge: the most bytes one process of the job moved one way per merge (--stats "
             "hub_bytes_per_merge, and its ratio to the model's bytes): all-reduce's ring sends 2 (N - 1) / N of "
             "the model from every worker, whatever N is; in the master-based modes the master or a Redis server, "
             "which every result and every W pulled passes; \"-\" where a job does not count it (Sandblaster, the "
             "pipeline)."]
    notes += ["FAILED: %s: %s" % (run["name"], run["error"]) for run in runs if run["rc"] != 0]
    if args.link:
        notes.append("--link %s applies to our distributed runs only; the 1-process and DDP references run locally."
                     % args.link)
    return "\n".join(lines + [""] + notes)


def verdict(runs, args):
    """The issue's three targets at N = 8 x 2 threads: met, NOT MET, or not measured here (and why)."""
    single, ddp = references(runs)
    at_n = [r for r in runs if r["kind"] == "ours" and r["n"] == TARGET_N]
    if not at_n:
        why = ("not measured here: no N = %d run (%d workers x %d thread(s) need %d cores; this process may use %d)"
               % (TARGET_N, TARGET_N, args.threads, TARGET_N * args.threads, args.cores)
               if TARGET_N * args.threads > args.cores else "not measured here: --workers has no %d" % TARGET_N)
        return "\n".join("- %s: %s" % (t, why) for t in (
            "best mode at N = %d <= %.2f x one 2-thread process's time to %.2f" % (TARGET_N, TARGET_VS_2_THREADS,
                                                                                   args.target),
            "best mode at N = %d <= %.1f x DDP with %d processes" % (TARGET_N, TARGET_VS_DDP, TARGET_N),
            "exchange <= %.0f %% of a round at N = %d" % (100 * TARGET_EXCHANGE, TARGET_N)))
    note = "" if args.threads == TARGET_THREADS else " (measured with --threads %d; the target names %d)" % (
        args.threads, TARGET_THREADS)
    reached = [r for r in at_n if r["time_to_target_s"] is not None]
    best = min(reached, key=lambda r: r["time_to_target_s"]) if reached else None
    out = []
    for label, ref, limit in (("one 2-thread process", single.get(TARGET_THREADS), TARGET_VS_2_THREADS),
                              ("DDP with %d processes" % TARGET_N, ddp.get(TARGET_N), TARGET_VS_DDP)):
        head = "best mode at N = %d <= %.2f x %s's time to %.2f%s" % (TARGET_N, limit, label, args.target, note)
        if best is None:
            out.append("- %s: NOT MET (no mode reached %.2f at N = %d)" % (head, args.target, TARGET_N))
        elif ref is None or ref["time_to_target_s"] is None:
            out.append("- %s: not measured here (%s %s)" % (head, label, "did not run" if ref is None
                                                            else "did not reach %.2f" % args.target))
        else:
            r = ratio(best, ref)
            out.append("- %s: %s (%s: %.1f s = %.2f x %.1f s)" % (head, "met" if r <= limit else "NOT MET",
                                                                  best["name"], best["time_to_target_s"], r,
                                                                  ref["time_to_target_s"]))
    shares = [(r["name"], r["exchange_share"]) for r in at_n if r["exchange_share"] is not None]
    bad = [(n, s) for n, s in shares if s > TARGET_EXCHANGE]
    head = "exchange <= %.0f %% of a round at N = %d%s" % (100 * TARGET_EXCHANGE, TARGET_N, note)
    listed = ", ".join("%s %.1f %%" % (n, 100 * s) for n, s in shares)
    out.append("- %s: %s" % (head, "not measured here (no mode at N = %d wrote its stats)" % TARGET_N if not shares
                             else "%s (%s)" % ("met" if not bad else "NOT MET", listed)))
    return "\n".join(out)


def plot(runs, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    fig, (ax_acc, ax_speed, ax_images) = plt.subplots(1, 3, figsize=(21, 6))
    kinds = list(dict.fromkeys(["single", "ddp"] + [series(r) for r in runs]))
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    counts = sorted({r["n"] for r in runs})
    styles = ["-", "--", ":", "-.", (0, (3, 1, 1, 1, 1, 1))]
    for run in runs:
        key = series(run)
        style = styles[counts.index(run["n"]) % len(styles)] if run["kind"] != "single" else "-"
        accuracy = [float("nan") if p["accuracy"] is None else p["accuracy"] for p in run["points"]]   # gaps
        ax_acc.plot([p["time_s"] for p in run["points"]], accuracy, ls=style, marker=".", ms=3, color=colours[key],
                    lw=1 + (run["threads"] - 1) * 0.4 if run["kind"] == "single" else 1.2, label=run["name"])
    ax_acc.axhline(args.target, color="grey", ls="--", lw=0.8)
    lowest = min([p["accuracy"] for r in runs for p in r["points"] if p["accuracy"] is not None] + [0.7])
    ax_acc.set(xlabel="wall seconds since launch", ylabel="test accuracy (10,000 images)", ylim=(max(0, lowest - 0.02),
               None), title="LeNet, Fashion-MNIST, %d batches of 64 (line style: N)" % args.batches)
    ax_acc.grid(alpha=0.3)
    ax_acc.legend(fontsize=7, ncol=2)
    single, _ = references(runs)
    base = single[1]["images_per_s"]
    for key in kinds:
        pts = [(r["n"] if r["kind"] != "single" else r["threads"] // args.threads, r["images_per_s"] / base)
               for r in runs if series(r) == key and r["images_per_s"] and base and r["rc"] == 0]
        if key == "single":
            pts = [(n, s) for n, s in pts if n >= 1]
        if pts:
            pts.sort()
            label = {"single": "1 process, N*T threads", "ddp": "DDP"}.get(key, key)
            ax_speed.plot([n for n, _ in pts], [s for _, s in pts], "o-", color=colours[key], label=label)
    ax_speed.plot(counts, [n * args.threads for n in counts], color="black", ls="--", lw=0.8,
                  label="linear (N x T)")
    ax_speed.set(xlabel="N (workers, ranks; 1 process: threads / T)", ylabel="images/s over the 1-thread process",
                 xscale="log", yscale="log", title="speed-up, T = %d thread(s) each" % args.threads)
    ax_speed.set_xticks(counts, [str(n) for n in counts])
    ax_speed.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax_speed.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax_speed.grid(alpha=0.3, which="both")
    ax_speed.legend(fontsize=8)
    plot_images(ax_images, runs, args, single, counts)
    fig.tight_layout()
    fig.savefig(path)
    print("bench: wrote", path)
    # The images panel alone, larger: the figure the time-to-accuracy question is about.
    fig, ax = plt.subplots(figsize=(9, 6))
    plot_images(ax, runs, args, single, counts)
    fig.tight_layout()
    fig.savefig(path.with_name(path.stem + "_images.png"))
    print("bench: wrote", path.with_name(path.stem + "_images.png"))


def plot_images(ax, runs, args, single, counts):
    """Images to the target against N, per mode: --lr-scaling linear solid, none dashed; a run that did not reach
    the target is drawn at the images it trained, hollow (or a cross where it failed). Images do not depend on
    the cores; the flat line at one process's images is the goal."""
    import matplotlib.pyplot as plt
    modes = list(dict.fromkeys(r["mode"] or "DDP" for r in runs if r["kind"] != "single"))
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(modes)}
    total = args.batches * BATCH
    for key in dict.fromkeys(series(r) for r in runs if r["kind"] != "single"):
        chosen = sorted((r for r in runs if series(r) == key and r["kind"] != "single"), key=lambda r: r["n"])
        mode = chosen[0]["mode"] or "DDP"
        style = "--" if chosen[0].get("scaling") == "none" else "-"
        xs = [r["n"] for r in chosen]
        ys = [r["images_to_target"] or total for r in chosen]
        ax.plot(xs, ys, ls=style, color=colours[mode], lw=1.3, label=key)
        for r, y in zip(chosen, ys):
            failed = r["rc"] != 0 or r["diverged"]
            ax.plot(r["n"], y, "x" if failed else "o", color=colours[mode], ms=6,
                    mfc=colours[mode] if r["images_to_target"] else "none")
    if single[1].get("images_to_target"):
        ax.axhline(single[1]["images_to_target"], color="black", ls=":", lw=1, label="1 process")
    ax.axhline(total, color="grey", lw=0.6)
    ax.set(xlabel="N (workers, ranks)", ylabel="images trained to %.2f test accuracy" % args.target, xscale="log",
           title="images to %.2f (solid: --lr-scaling linear, dashed: none; hollow at the top: not reached in %d, "
                 "x: failed or diverged)" % (args.target, total))
    ax.title.set_fontsize(8)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=2000, help="batches of 64 every run trains on (default 2000)")
    ap.add_argument("--every", type=int, default=80, help="snapshot (test point) every N batches' images "
                    "(default 80: a multiple of every N of the default --workers)")
    ap.add_argument("--workers", default="1,2,4,8,16", help="comma list of N (capped: N x --threads <= cores)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of modes (default: all of them)")
    ap.add_argument("--compress", help="comma list of --compress codecs (none, 1bit, topk:FRACTION): a run of "
                    "each mode that takes --compress per codec")
    ap.add_argument("--lr-scaling", default="linear", help="comma list of --lr-scaling policies (linear, sqrt, none): "
                    "each data-parallel mode and all-reduce runs once per policy, a row each (default: linear, the "
                    "default)")
    ap.add_argument("--images", action="store_true", help="measure images to --target only: every N of --workers "
                    "runs, beyond the cores too (images to accuracy do not depend on them; times then do not scale)")
    ap.add_argument("--threads", type=int, default=1, help="threads of each worker and DDP rank (default 1)")
    ap.add_argument("--link", metavar="RATE:DELAY", help="passed to our distributed runs as `train --link`")
    ap.add_argument("--target", type=float, default=0.85, help="the test accuracy to time (default 0.85)")
    ap.add_argument("--servers", help="comma list of K: each mode with a central W runs once per K with `train "
                    "--servers K` (default: train's own choice, one row)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds after which a run is stopped (failed)")
    ap.add_argument("--out", default="out/bench_scaling", help="run directories (relative: to the repo root)")
    ap.add_argument("--plot", help="PNG to write (relative: to the repo root; default <out>.png, "
                    "out/bench_scaling.png); the raw results go to the same name with .json")
    ap.add_argument("--replot", metavar="JSON", help="draw the plots again from a run's .json (--plot: where), "
                    "training nothing")
    ap.add_argument("--ddp-child", metavar="SOLVER", help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ddp_child:
        return ddp_child(args.ddp_child, args.init, args.threads, args.lr_scaling)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        raise SystemExit("bench: unknown mode(s) %s (use %s)" % (", ".join(unknown), ", ".join(MODES)))
    args.compress = [c.strip() for c in (args.compress or "none").split(",") if c.strip()]
    from pycaffe_dist.distributed.data_parallel.compression import check
    bad = [problem for problem in map(check, args.compress) if problem]
    if bad:
        raise SystemExit("bench: --compress %s" % bad[0])
    args.compress = [None if c == "none" else c for c in args.compress]
    args.lr_scaling = [p.strip() for p in args.lr_scaling.split(",") if p.strip()]
    from pycaffe_dist.distributed.lr_scaling import check_policy
    bad = [problem for problem in map(check_policy, args.lr_scaling) if problem]
    if bad:
        raise SystemExit("bench: --lr-scaling %s" % bad[0])
    args.servers = [int(k) for k in args.servers.split(",") if k.strip()] if args.servers else []
    if any(k < 1 for k in args.servers):
        raise SystemExit("bench: --servers takes counts of at least 1")
    args.out = pathlib.Path(args.out) if os.path.isabs(args.out) else REPO / args.out
    plot_path = pathlib.Path(args.plot) if args.plot else args.out.with_suffix(".png")
    plot_path = plot_path if plot_path.is_absolute() else REPO / plot_path
    if args.replot:
        raw = json.loads(pathlib.Path(args.replot).read_text())
        args.batches, args.threads, args.target = raw["batches"], raw["threads"], raw["target_accuracy"]
        return plot(raw["runs"], args, plot_path)
    args.cores = len(os.sched_getaffinity(0))
    check_data()
    os.chdir(REPO)                        # the TEST net's data source is relative to the repo root
    counts = worker_counts(args, 10 ** 6 if args.images else args.cores)
    runs = plan(args, counts)
    print("bench: %d runs of %d images each on %d cores: %s" % (len(runs), args.batches * BATCH, args.cores,
          ", ".join(r["name"] for r in runs)), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_initial_weights(write_solver(runs[0]), args.out / "initial_weights.npz")
    start_s = time.time()
    for run in runs:
        train(run, args)
    training_s = time.time() - start_s
    print("bench: training done in %.0f s" % training_s, flush=True)
    scoring_s = time.time()
    evaluate(runs, args.cores)
    print("bench: scoring done in %.0f s" % (time.time() - scoring_s), flush=True)
    for run in runs:
        summarize(run, args.target)
    print()
    print(table(runs, args))
    print()
    print("Targets (the issue; N = %d workers x %d threads):" % (TARGET_N, TARGET_THREADS))
    print(verdict(runs, args))
    print()
    print(projection(runs, args))
    shards = shards_report(runs)
    if shards:
        print()
        print(shards)
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, args, plot_path)
    keep = ("name", "kind", "n", "mode", "compress", "threads", "images_per_iter", "max_iter", "every", "rc", "error",
            "wall_s", "points", "time_to_target_s", "images_to_target", "scaling", "final_accuracy", "diverged",
            "images_per_s", "master_images_per_s", "exchange_share", "stats", "servers")
    raw = {"batches": args.batches, "every": args.every, "threads": args.threads, "link": args.link,
           "cores": args.cores, "target_accuracy": args.target, "training_s": training_s,
           "runs": [dict({k: run.get(k) for k in keep}, dir=str(run["dir"])) for run in runs]}
    plot_path.with_suffix(".json").write_text(json.dumps(raw, indent=1))
    print("bench: wrote", plot_path.with_suffix(".json"))


if __name__ == "__main__":
    main()
