"""Where the host's time of a GPU training step goes: each cuDNN function, each kernel launch, each cuBLAS function
and copy, timed on the host around the call (the driver's and the library's own cost, which tools/gpu_calls.py
cannot see without a GPU), and what is left: our Python between them.

    python tools/gpu_host_costs.py [--nets cifar10_quick,googlenet] [--iterations 20] [--top 15]

The nets are bench/nets.py's at its GPU batches, stepped as bench/nets.py --gpu steps them (forward + backward).
For each net: the step's wall time, the host's share of it (the step less its waits for the GPU: the downloads of
the loss, which wait for all the work queued before them), and a table of the calls by name: how many a step,
microseconds each, milliseconds a step.
A step whose host time is most of its wall time is paced by the host: fewer or cheaper calls make it faster, a
faster kernel does not. Unless a call waits for the GPU without saying so (a library that synchronizes inside, a
free of device memory): then its host time is the GPU's. So each net is stepped again with a GEMM of a few ms
queued ahead of every step, and a call whose time grows by about that much is named as one that waits.
On the emulated device (PCD_DEVICE=emulated) the table is the emulation's, which runs the kernels on the CPU: it
shows the tool works, not what a GPU costs.
"""
import argparse
import collections
import functools
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))
sys.path.insert(0, str(HERE.parent))


WAIT = "wait"      # the kind of the calls that wait for the GPU (a download returns when the queue before it is done)
# The GEMM queued ahead of a step to find the calls that wait for the GPU: 2 x 4096^3 flops, about 2.7 ms of an H200
# (51 TFLOP/s in float32), far above a call's own microseconds.
AHEAD_GEMM = 4096


class Clock:
    """Host seconds and calls by (kind, name), of the methods it wraps."""

    def __init__(self):
        self.seconds = collections.Counter()
        self.calls = collections.Counter()
        self.on = False

    def wrap(self, owner, method, kind, name_of):
        """Time owner.method (a class attribute) under (kind, name_of(args)); returns the undo."""
        original = getattr(owner, method)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if not self.on:
                return original(*args, **kwargs)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                key = (kind, name_of(args))
                self.seconds[key] += time.perf_counter() - started
                self.calls[key] += 1
        setattr(owner, method, timed)
        return lambda: setattr(owner, method, original)


def instrument(clock, dev):
    """Wrap the device's calls that reach the driver or a library; returns the undos."""
    from pycaffe_dist.backend import cudnn
    device_class = type(dev)
    undos = [clock.wrap(cudnn.Cudnn, "call", "cuDNN", lambda args: args[1]),
             clock.wrap(device_class, "_launch", "kernel", lambda args: args[1])]
    cublas = getattr(dev, "cublas", None)
    if cublas is not None:      # a CudaDevice: cuBLAS through ctypes, by function
        undos.append(clock.wrap(type(cublas), "call", "cuBLAS", lambda args: args[1]))
    else:                       # the emulated device: its BLAS entry points
        for method in ("_sgemm", "_sgemm_batched", "_sgemv", "axpy", "scal", "dot", "asum"):
            undos.append(clock.wrap(device_class, method, "BLAS", lambda args, m=method: m.lstrip("_")))
    for method in ("upload", "copy", "memset"):
        undos.append(clock.wrap(device_class, method, "memory", lambda args, m=method: m))
    undos.append(clock.wrap(device_class, "download", WAIT, lambda args: "download"))
    return undos


def gpu_work(dev, n=AHEAD_GEMM):
    """(queue, ms): a function that queues an n x n x n GEMM on the device, and how long the GPU takes for it."""
    a, b, c = (dev.empty(n * n) for _ in range(3))
    for array in (a, b, c):
        dev.memset(array, 0)

    def queue():
        dev.gemm(False, False, n, n, n, 1.0, a, b, 0.0, c)
    queue()
    dev.synchronize()
    started = time.perf_counter()
    queue()
    dev.synchronize()
    return queue, 1000.0 * (time.perf_counter() - started)


def timed_steps(dev, step, iterations, ahead=None):
    """Host seconds by (kind, name) over `iterations` steps, each started on an idle GPU (or with `ahead()`'s work
    queued first), and the steps' wall and host seconds."""
    clock = Clock()
    undos = instrument(clock, dev)
    try:
        wall = host = 0.0
        for _ in range(iterations):
            dev.synchronize()
            if ahead is not None:
                ahead()
            clock.on = True
            started = time.perf_counter()
            step()
            returned = time.perf_counter()
            clock.on = False
            dev.synchronize()
            wall += time.perf_counter() - started
            host += returned - started
    finally:
        for undo in undos:
            undo()
    return clock, wall, host


def measure(net_name, iterations):
    """(step wall ms, the step's host ms (waits included), {(kind, name): (calls a step, seconds a step)}, device
    name, and (ms of GPU work queued ahead, {(kind, name): seconds a step more with it queued}) or None on the
    emulated device, which runs every call to its end at once: none can wait for earlier work)."""
    import nets as bench_nets
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    dev, error = bench_nets._open_gpu()
    if error:
        raise SystemExit("gpu_host_costs: no GPU: %s" % error["error"])
    net = Net(bench_nets._net_param(net_name), phase=caffe_pb2.TRAIN)
    bench_nets._random_inputs(net)

    def step():
        net.clear_param_diffs()
        net.forward_backward()
    for _ in range(bench_nets.WARMUP):     # uploads, cuDNN's Find, buffers
        step()
    dev.synchronize()
    clock, wall, host = timed_steps(dev, step, iterations)
    per_step = {key: (clock.calls[key] / iterations, clock.seconds[key] / iterations) for key in clock.calls}
    waits = None
    if not dev.name.startswith("emulated"):
        queue, ahead_ms = gpu_work(dev)
        busy, _, _ = timed_steps(dev, step, iterations, ahead=queue)
        waits = ahead_ms, {key: (busy.seconds[key] - clock.seconds[key]) / iterations for key in busy.calls
                           if key[0] != WAIT}
    return 1000.0 * wall / iterations, 1000.0 * host / iterations, per_step, dev.name, waits


def waiting_calls(ahead_ms, grown):
    """The calls (kind, name) whose time a step grew by more than half the GPU work queued ahead of it: the first
    call of a step that waits for the GPU waits for all of that work."""
    return sorted((key for key, seconds in grown.items() if 1000.0 * seconds > 0.5 * ahead_ms),
                  key=lambda key: -grown[key])


def report(net_name, wall_ms, step_ms, per_step, top, waits):
    """Print the net's section; the host's busy time is the step's less its waits for the GPU."""
    wait_ms = 1000.0 * sum(seconds for (kind, _), (_, seconds) in per_step.items() if kind == WAIT)
    timed_ms = 1000.0 * sum(seconds for (kind, _), (_, seconds) in per_step.items() if kind != WAIT)
    host_ms = step_ms - wait_ms
    print("\n%s: step %.3f ms wall; the host is busy %.3f ms of it (%.0f%%): %.3f ms in the calls below, %.3f ms of "
          "Python between them; %.3f ms waiting for the GPU" % (
              net_name, wall_ms, host_ms, 100.0 * host_ms / wall_ms if wall_ms else 0.0, timed_ms,
              host_ms - timed_ms, wait_ms))
    kinds = collections.defaultdict(lambda: [0.0, 0.0])
    for (kind, _), (calls, seconds) in per_step.items():
        kinds[kind][0] += calls
        kinds[kind][1] += seconds
    print("| kind | calls / step | us / call | ms / step |")
    print("|---|---:|---:|---:|")
    for kind, (calls, seconds) in sorted(kinds.items(), key=lambda item: -item[1][1]):
        print("| %s | %.0f | %.1f | %.3f |" % (kind, calls, 1e6 * seconds / calls, 1000.0 * seconds))
    print("| call | calls / step | us / call | ms / step |")
    print("|---|---:|---:|---:|")
    ranked = sorted(((key, value) for key, value in per_step.items() if key[0] != WAIT), key=lambda item: -item[1][1])
    for (kind, name), (calls, seconds) in ranked[:top]:
        print("| %s %s | %.0f | %.1f | %.3f |" % (kind, name, calls, 1e6 * seconds / calls, 1000.0 * seconds))
    if waits is None:
        print("calls that wait for the GPU: not asked (the emulated device runs every call to its end at once)")
    else:
        ahead_ms, grown = waits
        waiting = waiting_calls(ahead_ms, grown)
        print("with %.2f ms of GPU work queued ahead of each step: %s" % (ahead_ms, "; ".join(
            "%s %s waits for the GPU (%.2f ms a step more)" % (kind, name, 1000.0 * grown[(kind, name)])
            for kind, name in waiting) if waiting else "no call waits for the GPU: the times above are their own"))
    # one line for tools/gpu_check.sh's table
    print("summary %s: host %.2f of %.2f ms, Python %.2f ms | %s" % (
        net_name, host_ms, wall_ms, host_ms - timed_ms, "; ".join(
            "%s %.0f us x %.0f" % (name, 1e6 * seconds / calls, calls) for (_, name), (calls, seconds) in ranked[:3])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="cifar10_quick,googlenet")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--top", type=int, default=15, help="how many calls by name to list (the costliest)")
    args = ap.parse_args()
    import nets as bench_nets
    unknown = [n for n in args.nets.split(",") if n not in bench_nets.NETS]
    if unknown:
        raise SystemExit("gpu_host_costs: unknown net(s) %s (known: %s)" % (", ".join(unknown),
                                                                         ", ".join(bench_nets.NETS)))
    for name in args.nets.split(","):
        wall_ms, host_ms, per_step, device, waits = measure(name, args.iterations)
        if name == args.nets.split(",")[0]:
            print("gpu_host_costs: on %s, %d steps a net" % (device, args.iterations))
        report(name, wall_ms, host_ms, per_step, args.top, waits)


if __name__ == "__main__":
    main()
