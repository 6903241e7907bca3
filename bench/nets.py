"""Forward+backward time per iteration of LeNet and CIFAR-10 quick: pycaffe-dist against PyTorch CPU.

    python bench/nets.py [--iterations 30] [--threads 1,2] [--nets lenet,cifar10_quick] [--plot out.png]

Each measurement runs in its own process (thread settings are fixed at start-up, and peak RSS is per process):
the same net (bench/nets/*_input.prototxt, TRAIN phase, Input layers with random data and labels), timed as
the median of `--iterations` forward+backward passes after warm-up passes. PyTorch runs the same layers
(built from the prototxt) with torch.set_num_threads. The real Caffe's figures on these machines (1 thread,
from `caffe time`) are quoted for reference: 17.4 ms (LeNet), 162 ms (CIFAR-10 quick).
Peak RSS is the process's maximum resident set; "+RSS" subtracts what the process held before building the net
(Python, numpy or torch themselves).
"""
import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
NETS = {"lenet": (HERE / "nets" / "lenet_input.prototxt", 64),
        "cifar10_quick": (HERE / "nets" / "cifar10_quick_input.prototxt", 100)}
CAFFE_MS = {"lenet": 17.4, "cifar10_quick": 162.0}   # caffe time, 1 thread, same machines (issue 3)
WARMUP = 3


def _peak_rss_mb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _net_param(net_name):
    from pycaffe_dist.io.load import read_net
    path, batch = NETS[net_name]
    param = read_net(str(path))
    for layer in param.layer:
        if layer.type == "Input":
            for shape in layer.input_param.shape:
                shape.dim[0] = batch
    return param


def _median_ms(step, iterations):
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    times.sort()
    return 1000.0 * times[len(times) // 2]


def run_ours(net_name, threads, iterations):
    import numpy as np
    from pycaffe_dist import common
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    common.set_num_threads(threads)
    base = _peak_rss_mb()
    net = Net(_net_param(net_name), phase=caffe_pb2.TRAIN)
    rng = np.random.default_rng(0)
    data, label = net.blob_by_name("data"), net.blob_by_name("label")
    data.data[...] = rng.standard_normal(data.shape)
    label.data[...] = rng.integers(0, 10, label.shape)
    return _median_ms(net.forward_backward, iterations), base


def torch_model(param):
    """The net's layers as torch modules, in order (the subset these nets use)."""
    import torch
    from torch import nn
    from pycaffe_dist.proto import caffe_pb2
    P = caffe_pb2.PoolingParameter
    layers, channels, features = [], None, None
    for lp in param.layer:
        if lp.type == "Input":
            channels = lp.input_param.shape[0].dim[1]
        elif lp.type == "Convolution":
            cp = lp.convolution_param
            layers.append(nn.Conv2d(channels, cp.num_output, cp.kernel_size[0],
                                    stride=cp.stride[0] if cp.stride else 1, padding=cp.pad[0] if cp.pad else 0))
            channels = cp.num_output
        elif lp.type == "Pooling":
            pp = lp.pooling_param
            pool = nn.MaxPool2d if pp.pool == P.MAX else nn.AvgPool2d
            layers.append(pool(pp.kernel_size, stride=pp.stride, ceil_mode=True))   # Caffe rounds up
        elif lp.type == "ReLU":
            layers.append(nn.ReLU(inplace=True))
        elif lp.type == "InnerProduct":
            if features is None:
                layers.append(nn.Flatten())
                features = -1
            layers.append(nn.LazyLinear(lp.inner_product_param.num_output))
        elif lp.type in ("SoftmaxWithLoss", "Accuracy"):
            continue
        else:
            raise ValueError("bench: no torch equivalent for layer type %s" % lp.type)
    return nn.Sequential(*layers), torch


def run_torch(net_name, threads, iterations):
    from pycaffe_dist.proto import caffe_pb2
    param = _net_param(net_name)
    model, torch = torch_model(param)
    torch.set_num_threads(threads)
    base = _peak_rss_mb()
    shape = tuple(next(l for l in param.layer if l.type == "Input" and
                       all(r.phase != caffe_pb2.TEST for r in l.include)).input_param.shape[0].dim)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    y = torch.randint(0, 10, (shape[0],), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()
    model(x)   # materialise the lazy layers

    def step():
        model.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
    return _median_ms(step, iterations), base


def child(args):
    runner = run_ours if args.child == "ours" else run_torch
    ms, base = runner(args.nets, args.threads_one, args.iterations)
    peak = _peak_rss_mb()
    print(json.dumps({"ms": ms, "peak_mb": peak, "extra_mb": peak - base}))


def measure(which, net_name, threads, iterations):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), PYTHONPATH=str(HERE.parent))
    out = subprocess.run([sys.executable, __file__, "--child", which, "--nets", net_name,
                          "--threads-one", str(threads), "--iterations", str(iterations)],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("bench: %s %s with %d threads failed:\n%s" % (which, net_name, threads, out.stderr))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--nets", default="lenet,cifar10_quick")
    ap.add_argument("--plot", help="also write a bar chart (PNG) of the times")
    ap.add_argument("--child", choices=["ours", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--threads-one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    # Not imported here: Linux carries a parent's peak RSS into the children it starts (fork + exec).
    have_torch = importlib.util.find_spec("torch") is not None
    if not have_torch:
        print("bench: PyTorch is not installed (pip install torch==2.13.0): its columns stay empty")
    rows = []
    header = ("net", "threads", "pycaffe-dist ms", "PyTorch ms", "ours/PyTorch", "Caffe ms (1 thr)",
              "ours/Caffe", "peak RSS ours MB", "peak RSS torch MB", "+RSS ours", "+RSS torch")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for net_name in args.nets.split(","):
        for threads in [int(t) for t in args.threads.split(",")]:
            ours = measure("ours", net_name, threads, args.iterations)
            ref = measure("torch", net_name, threads, args.iterations) if have_torch else None
            caffe = CAFFE_MS[net_name] if threads == 1 else None
            row = (net_name, threads, "%.1f" % ours["ms"], "%.1f" % ref["ms"] if ref else "-",
                   "%.2f" % (ours["ms"] / ref["ms"]) if ref else "-", "%.1f" % caffe if caffe else "-",
                   "%.2f" % (ours["ms"] / caffe) if caffe else "-", "%.0f" % ours["peak_mb"],
                   "%.0f" % ref["peak_mb"] if ref else "-", "%.0f" % ours["extra_mb"],
                   "%.0f" % ref["extra_mb"] if ref else "-")
            rows.append((net_name, threads, ours["ms"], ref["ms"] if ref else None))
            print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
    if args.plot:
        plot(rows, args.plot)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = ["%s\n%d thread%s" % (n, t, "s" if t > 1 else "") for n, t, _, _ in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(1.8 * len(rows) + 2, 4))
    ax.bar([x - 0.2 for x in xs], [r[2] for r in rows], 0.4, label="pycaffe-dist")
    ax.bar([x + 0.2 for x in xs], [r[3] or 0 for r in rows], 0.4, label="PyTorch CPU")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("forward+backward ms / iteration")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print("bench: wrote", path)


if __name__ == "__main__":
    main()
