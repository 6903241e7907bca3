"""The GPU kernels of one training iteration of a bench net, ours and PyTorch's copy side by side, each timed by
the GPU (CUPTI, through torch.profiler): which kinds of work ours spends more GPU time on, and whether the GPU waits
for the host.

    python bench/gpu_kernels.py --net googlenet [--iterations 5] [--top 20] [--frameworks ours,torch]
    python bench/gpu_kernels.py --net googlenet --model variant.prototxt    # ours on a variant of the net

The step is bench/nets.py --gpu's: ours clears the parameter diffs and runs forward_backward; PyTorch's copy
(bench/torch_net.py) runs zero_grad, forward and backward, IEEE float32 both, cuDNN's defaults both. Each framework
runs in a process of its own; CUPTI sees every kernel launched in it, so ours (pycuda, cuBLAS and cuDNN through
ctypes) is recorded like PyTorch's. Per step:

- wall: the median step, the GPU idle at the start and finished at the end (as bench/nets.py times it);
- host: the median time until the step returns, the GPU still working: near the wall time, the host's launches
  are what limits the step, and the GPU idles between them;
- GPU busy: the union of the kernels', memsets' and copies' intervals, in the profiled steps;
- each kernel name's count and time, and the times summed by kind (convolution, GEMM, pooling, ...: patterns of
  the names, KINDS below), with ours / PyTorch per kind.

On a machine without a GPU, `--device cpu` (PyTorch) and PCD_DEVICE=emulated (ours) run the code path with no
kernels to record (the tables say so).
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
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import nets as bench_nets  # noqa: E402  (bench/ is not a package)

WARMUP = 3
# Kinds of GPU work by kernel name (the first pattern that matches; searched case-insensitively). cuDNN's and
# cuBLAS's kernel names say what they compute; ours are csrc/cuda's function names.
KINDS = (
    ("concat, split", r"concat|catarray|copy_rows|split"),
    ("memset, copy", r"^memset|^memcpy|copy_kernel"),
    ("pooling", r"pool"),
    ("ReLU, activation", r"relu|activation|threshold|clamp"),
    ("LRN", r"lrn"),
    ("softmax, loss", r"softmax|loss|nll|accuracy"),
    ("dropout, random", r"dropout|philox|bernoulli"),
    ("bias add, sums over axes", r"op_generic_tensor|bias|reduce|channel_sums|sum_functor"),
    ("convolution", r"conv|fprop|dgrad|wgrad|implicit|winograd|fft|im2col|col2im|cudnn|transpose|flip"),
    ("GEMM, GEMV", r"gemm|gemv|cutlass|cublas|dot_kernel"),
    ("elementwise", r"elementwise|vectorized|axpy|scal|add|mul|fill|set|sgd|update"),
)


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def _union_us(intervals):
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def _profiled(step, sync, iterations):
    """{kernel name: [count, microseconds]} per step and the GPU's busy microseconds per step, of `iterations`
    profiled steps."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    on_gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(iterations):
            step()
        sync()
    kernels, intervals = {}, []
    for event in prof.events():
        if event.device_type != DeviceType.CUDA:
            continue
        start, end = event.time_range.start, event.time_range.end
        entry = kernels.setdefault(event.name, [0, 0.0])
        entry[0] += 1
        entry[1] += end - start
        intervals.append((start, end))
    per_step = {name: [count / iterations, us / iterations] for name, (count, us) in kernels.items()}
    return per_step, _union_us(intervals) / iterations


def _timed(step, sync, iterations):
    """Median wall and host milliseconds of a step (bench/nets.py's clock: synchronized at both ends)."""
    walls, hosts = [], []
    for _ in range(iterations):
        sync()
        start = time.perf_counter()
        step()
        returned = time.perf_counter()
        sync()
        walls.append(1000.0 * (time.perf_counter() - start))
        hosts.append(1000.0 * (returned - start))
    return bench_nets._median(walls), bench_nets._median(hosts)


def ours_step(net_name, model=None):
    """Ours on the net, or on `model` (a variant of its prototxt: other engines, say) at the net's batch."""
    from pycaffe_dist.io.load import read_net
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    dev, error = bench_nets._open_gpu()
    if error:
        raise SystemExit("gpu_kernels: ours: %s" % error["error"])
    param = bench_nets._net_param(net_name)
    if model:
        batch = next(l for l in param.layer if l.type == "Input").input_param.shape[0].dim[0]
        param = read_net(model)
        for layer in param.layer:
            if layer.type == "Input":
                for shape in layer.input_param.shape:
                    shape.dim[0] = batch
    net = Net(param, phase=caffe_pb2.TRAIN)
    bench_nets._random_inputs(net)

    def step():
        net.clear_param_diffs()
        net.forward_backward()
    return step, dev.synchronize, dev.name


def torch_step(net_name, device_name):
    torch, sync, error = bench_nets._torch_on(device_name, tf32=False)
    if error:
        raise SystemExit("gpu_kernels: PyTorch: %s" % error["error"])
    model, _ = bench_nets.torch_model(net_name)
    model.to(device_name)
    inputs = {k: v.to(device_name) for k, v in bench_nets._torch_inputs(bench_nets._net_param(net_name),
                                                                        torch).items()}

    def step():
        model.zero_grad(set_to_none=False)
        model(inputs).backward()
    name = torch.cuda.get_device_name() if sync else "cpu"
    return step, sync or (lambda: None), name


def child(args):
    if args.child == "ours":
        step, sync, device = ours_step(args.net, args.model)
    else:
        step, sync, device = torch_step(args.net, args.device)
    for _ in range(WARMUP):
        step()
    sync()
    wall, host = _timed(step, sync, args.iterations)
    result = {"device": device, "wall_ms": wall, "host_ms": host, "busy_ms": 0.0, "kernels": {}}
    try:
        result["kernels"], busy_us = _profiled(step, sync, args.iterations)
        result["busy_ms"] = busy_us / 1000.0
    except Exception as exc:    # the times above still say something; the table says why there are no kernels
        result["device"] += " (no kernel profile: %s)" % str(exc).splitlines()[0][:200]
    print(json.dumps(result), flush=True)
    # pycuda aborts the process at exit while our device's context is still pushed (bench/nets.py does the same)
    os._exit(0)


def run_child(which, args):
    command = [sys.executable, __file__, "--child", which, "--net", args.net, "--iterations", str(args.iterations),
               "--device", args.device] + (["--model", args.model] if args.model else [])
    out = subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(HERE.parent)), capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]}
    return json.loads(lines[-1])


def by_kind(kernels):
    kinds = {}
    for name, (count, us) in kernels.items():
        entry = kinds.setdefault(kind_of(name), [0.0, 0.0])
        entry[0] += count
        entry[1] += us / 1000.0
    return kinds


def report(net, results, top, model=None):
    names = {"ours": "ours", "torch": "PyTorch"}
    lines = ["GPU kernels of one %s training step (forward + backward), per step%s" % (
        net, "; ours on %s" % model if model else ""), ""]
    lines += ["| framework | device | wall ms | host ms | GPU busy ms | kernels |", "|---|---|---:|---:|---:|---:|"]
    for which, res in results.items():
        if "error" in res:
            lines.append("| %s | failed: %s | | | | |" % (names[which], res["error"]))
            continue
        lines.append("| %s | %s | %.2f | %.2f | %.2f | %.0f |" % (
            names[which], res["device"], res["wall_ms"], res["host_ms"], res["busy_ms"],
            sum(c for c, _ in res["kernels"].values())))
    ok = {w: r for w, r in results.items() if "error" not in r}
    kinds = {w: by_kind(r["kernels"]) for w, r in ok.items()}
    all_kinds = sorted({k for ks in kinds.values() for k in ks},
                       key=lambda k: -max(ks.get(k, (0, 0))[1] for ks in kinds.values()))
    if all_kinds:
        lines += ["", "By kind (ms a step, kernels a step):", "",
                  "| kind | " + " | ".join("%s ms | %s kernels" % (names[w], names[w]) for w in ok) +
                  (" | ours / PyTorch |" if len(ok) == 2 else " |"),
                  "|---|" + "---:|---:|" * len(ok) + ("---:|" if len(ok) == 2 else "")]
        for kind in all_kinds:
            cells = []
            for w in ok:
                count, ms = kinds[w].get(kind, (0, 0.0))
                cells += ["%.3f" % ms, "%.0f" % count]
            ratio = ""
            if len(ok) == 2:
                mine, theirs = kinds["ours"].get(kind, (0, 0.0))[1], kinds["torch"].get(kind, (0, 0.0))[1]
                ratio = " | %s" % ("%.2f" % (mine / theirs) if theirs else "-")
            lines.append("| %s | %s%s |" % (kind, " | ".join(cells), ratio))
    elif ok:
        lines += ["", "No GPU kernels were recorded (no GPU here)."]
    for w, res in ok.items():
        rows = sorted(res["kernels"].items(), key=lambda kv: -kv[1][1])
        if not rows:
            continue
        total = sum(us for _, us in res["kernels"].values())
        lines += ["", "%s: the %d longest kernels of %d names (%.2f ms of kernels a step)" % (
            names[w], min(top, len(rows)), len(rows), total / 1000.0), "",
            "| kernel | kind | a step | ms a step | share |", "|---|---|---:|---:|---:|"]
        for name, (count, us) in rows[:top]:
            lines.append("| %s | %s | %.0f | %.3f | %.1f %% |" % (name[:110], kind_of(name), count, us / 1000.0,
                                                                 100.0 * us / total))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", default="googlenet", help="one of bench/nets.py's nets")
    ap.add_argument("--frameworks", default="ours,torch")
    ap.add_argument("--device", default="cuda", help="PyTorch's device: cuda (default) or cpu")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--top", type=int, default=20, help="kernel names to list for each framework")
    ap.add_argument("--model", help="ours on this variant of the net's prototxt (at the net's batch)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    results = {w: run_child(w, args) for w in args.frameworks.split(",")}
    print(report(args.net, results, args.top, args.model))


if __name__ == "__main__":
    main()
