"""Per-layer forward and backward timings of a net, as `caffe time` measures them (tools/caffe.cpp: time())."""
import collections
import time

import numpy as np

from ..backend import select


class LayerClock:
    """Caffe's Timer (util/benchmark.cpp). In GPU mode a layer's time is the GPU's: events recorded on the compute
    stream before and after the layer, and the host waits for the second; the host's wall clock would say only
    how long the layer took to queue its work, and put the queued work of the whole pass on the first layer that
    waits for the GPU (a loss layer reading its sum). On the CPU, the wall clock."""

    def __init__(self, gpu):
        self.dev = select.current() if gpu else None
        self._start = None

    def start(self):
        self._start = self.dev.record(self.dev.stream) if self.dev else time.perf_counter()

    def stop_ms(self):
        """Milliseconds since start()."""
        if self.dev:
            return self.dev.elapsed_ms(self._start, self.dev.record(self.dev.stream))
        return 1000.0 * (time.perf_counter() - self._start)


def steps(net, gpu):
    """The (first, last) layer ranges timed one at a time: each layer alone, except on the GPU the layers that the
    net's last whole forward ran as one (net/gpu_fusion.py: BatchNorm + Scale (+ ReLU), Eltwise + ReLU,
    Convolution + ReLU), timed together as a training iteration runs them."""
    runs = {}
    if gpu:
        for first, fusion in net.fusions.items():
            if fusion.forward_fused:
                runs[first] = first + fusion.forward_fused - 1
    ranges, i = [], 0
    while i < len(net.layers):
        ranges.append((i, runs.get(i, i)))
        i = ranges[-1][1] + 1
    return ranges


def time_net(net, iterations=50, progress=None):
    """Run one warm-up forward+backward, then `iterations` timed ones, layer by layer (on the GPU, layers that run
    as one there are timed as one: the time is the first's, the others' is 0; "fused" counts those layers).

    Returns a dict: initial_loss, per-iteration totals (ms), and per layer the mean forward and backward ms.
    Layers that need no backward are not run backward (Caffe runs them and they do nothing)."""
    n = len(net.layers)
    forward_ms, backward_ms = np.zeros(n), np.zeros(n)
    gpu = select.active()
    clock = LayerClock(gpu)
    initial_loss = net.forward_backward()
    ranges = steps(net, gpu)
    prefetchers = [layer.prefetcher for layer in net.layers if hasattr(layer, "prefetcher")]
    waited_before = sum(p.wait_s for p in prefetchers)
    totals = []
    for it in range(iterations):
        start = time.perf_counter()
        for first, last in ranges:
            clock.start()
            net.forward_from_to(first, last)
            forward_ms[first] += clock.stop_ms()
        for first, last in reversed(ranges):
            clock.start()
            net.backward_from_to(last, first)
            backward_ms[first] += clock.stop_ms()
        totals.append(1000.0 * (time.perf_counter() - start))
        if progress is not None:
            progress(it + 1, totals[-1])
    scale = 1.0 / max(1, iterations)
    data_wait_ms = (sum(p.wait_s for p in prefetchers) - waited_before) * 1000.0 * scale if prefetchers else None
    return {"initial_loss": initial_loss, "iteration_ms": totals, "data_wait_ms": data_wait_ms,
            "fused": sum(last - first for first, last in ranges),
            "layers": [(name, layer.param.type, f * scale, b * scale)
                       for name, layer, f, b in zip(net.layer_names, net.layers, forward_ms, backward_ms)]}


def format_timings(result):
    """Caffe's summary: average time per layer, then forward, backward and forward-backward averages."""
    lines = ["Average time per layer:"]
    width = max([len(name) for name, _, _, _ in result["layers"]] + [10])
    for name, _, f, b in result["layers"]:
        lines.append("%*s\tforward: %.4f ms." % (width, name, f))
        lines.append("%*s\tbackward: %.4f ms." % (width, name, b))
    forward = sum(f for _, _, f, _ in result["layers"])
    backward = sum(b for _, _, _, b in result["layers"])
    totals = result["iteration_ms"]
    lines += ["Average Forward pass: %.4f ms." % forward,
              "Average Backward pass: %.4f ms." % backward,
              "Average Forward-Backward: %.4f ms." % (sum(totals) / max(1, len(totals))),
              "Total Time: %.4f ms." % sum(totals)]
    if result.get("data_wait_ms") is not None:
        share = 100.0 * result["data_wait_ms"] / max(1e-9, sum(totals) / max(1, len(totals)))
        lines.append("Average wait for prefetched data: %.4f ms (%.1f%% of forward-backward)."
                     % (result["data_wait_ms"], share))
    if result.get("fused"):
        lines.append("%d layers ran fused into the layer before them (a BatchNorm, an Eltwise or a Convolution), as "
                     "in training on the GPU: their time is on its line." % result["fused"])
    lines.append(format_by_type(result))
    return "\n".join(lines)


def by_type(result):
    """[(layer type, layers, forward ms, backward ms)], the most time first: where a net's time goes."""
    totals = collections.OrderedDict()
    for _, kind, f, b in result["layers"]:
        layers, forward, backward = totals.get(kind, (0, 0.0, 0.0))
        totals[kind] = (layers + 1, forward + f, backward + b)
    return sorted(((kind,) + v for kind, v in totals.items()), key=lambda row: -(row[2] + row[3]))


def format_by_type(result):
    """After Caffe's summary (which has no such lines): the time per layer type, with its share."""
    rows = by_type(result)
    whole = max(1e-9, sum(f + b for _, _, f, b in rows))
    lines = ["Average time per layer type (forward + backward):"]
    width = max([len(kind) for kind, _, _, _ in rows] + [10])
    for kind, layers, f, b in rows:
        lines.append("%*s\t%3d layers  forward: %.4f ms  backward: %.4f ms  (%.1f%%)"
                     % (width, kind, layers, f, b, 100.0 * (f + b) / whole))
    return "\n".join(lines)


def plot_timings(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [name for name, _, _, _ in result["layers"]]
    ys = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(names) + 1.5))
    ax.barh(ys - 0.2, [f for _, _, f, _ in result["layers"]], 0.4, label="forward")
    ax.barh(ys + 0.2, [b for _, _, _, b in result["layers"]], 0.4, label="backward")
    ax.set_yticks(ys, names)
    ax.invert_yaxis()
    ax.set_xlabel("ms per iteration")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
