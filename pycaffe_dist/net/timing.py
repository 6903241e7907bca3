"""Per-layer forward and backward timings of a net, as `caffe time` measures them (tools/caffe.cpp: time())."""
import time

import numpy as np


def time_net(net, iterations=50, progress=None):
    """Run one warm-up forward+backward, then `iterations` timed ones, layer by layer.

    Returns a dict: initial_loss, per-iteration totals (ms), and per layer the mean forward and backward ms.
    Layers that need no backward are not run backward (Caffe runs them and they do nothing)."""
    n = len(net.layers)
    forward_ms, backward_ms = np.zeros(n), np.zeros(n)
    initial_loss = net.forward_backward()
    prefetchers = [layer.prefetcher for layer in net.layers if hasattr(layer, "prefetcher")]
    waited_before = sum(p.wait_s for p in prefetchers)
    totals = []
    for it in range(iterations):
        start = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            net.forward_from_to(i, i)
            forward_ms[i] += time.perf_counter() - t
        for i in range(n - 1, -1, -1):
            t = time.perf_counter()
            net.backward_from_to(i, i)
            backward_ms[i] += time.perf_counter() - t
        totals.append(1000.0 * (time.perf_counter() - start))
        if progress is not None:
            progress(it + 1, totals[-1])
    scale = 1000.0 / max(1, iterations)
    data_wait_ms = (sum(p.wait_s for p in prefetchers) - waited_before) * scale if prefetchers else None
    return {"initial_loss": initial_loss, "iteration_ms": totals, "data_wait_ms": data_wait_ms,
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
