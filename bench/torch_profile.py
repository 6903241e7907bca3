"""Where PyTorch's copy of a bench net spends its time, op by op (torch.profiler): the reference beside `dist_caffe
time --gpu`'s per-layer-type times of ours, for a net whose ratio misses its target.

    python bench/torch_profile.py --net alexnet [--device cuda|cpu] [--iterations 5] [--top 15]

The step is bench/nets.py's (zero_grad, forward, backward) on its inputs, IEEE float32 as `nets.py --gpu` sets it,
after warm-up steps. Each op's self time is the time of the kernels it launched itself (on a GPU; its own CPU time on
the CPU), not its children's, so the rows add up to the step's; ops are grouped by name, so a forward op and its
backward (autograd's *Backward0 nodes and the aten ops they call) are rows of their own.
"""
import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import nets as bench_nets  # noqa: E402  (bench/ is not a package)

WARMUP = 3


def self_time_us(event, on_gpu):
    """An averaged event's self time in microseconds, on the device or the CPU (the attribute's name changed in
    torch 2.4)."""
    if not on_gpu:
        return event.self_cpu_time_total
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)


def profile(net_name, device_name, iterations):
    """[(op name, ms per step)] sorted by time, and the device's name."""
    torch, sync, error = bench_nets._torch_on(device_name, tf32=False)
    if error:
        raise SystemExit("torch_profile: %s" % error["error"])
    from torch.profiler import ProfilerActivity, profile as torch_profile
    model, _ = bench_nets.torch_model(net_name)
    model.to(device_name)
    inputs = {k: v.to(device_name) for k, v in bench_nets._torch_inputs(bench_nets._net_param(net_name),
                                                                        torch).items()}

    def step():
        model.zero_grad(set_to_none=False)
        model(inputs).backward()
    on_gpu = sync is not None
    for _ in range(WARMUP):
        step()
    if on_gpu:
        sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(iterations):
            step()
        if on_gpu:
            sync()
    rows = [(e.key, self_time_us(e, on_gpu) / 1000.0 / iterations) for e in prof.key_averages()]
    rows = sorted((r for r in rows if r[1] > 0), key=lambda r: -r[1])
    name = torch.cuda.get_device_name() if on_gpu else "cpu"
    return rows, name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", default="alexnet", help="one of bench/nets.py's nets")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--top", type=int, default=15, help="rows to print (the rest are summed in one)")
    args = ap.parse_args()
    rows, device = profile(args.net, args.device, args.iterations)
    total = sum(ms for _, ms in rows)
    print("PyTorch %s, %s: %.2f ms a step (self times of every op, %d steps)" % (args.net, device, total,
                                                                                  args.iterations))
    print("| op | ms a step | share |")
    print("|---|---:|---:|")
    for op, ms in rows[:args.top]:
        print("| %s | %.3f | %.1f %% |" % (op, ms, 100.0 * ms / total))
    rest = sum(ms for _, ms in rows[args.top:])
    if rest:
        print("| (%d other ops) | %.3f | %.1f %% |" % (len(rows) - args.top, rest, 100.0 * rest / total))


if __name__ == "__main__":
    main()
