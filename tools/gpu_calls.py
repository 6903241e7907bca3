"""What one training iteration asks of the GPU, counted without one: the kernel launches, BLAS calls, memsets and
copies of a forward+backward on the GPU code path, the reads that make the host wait for the GPU (downloads, dot,
asum; "in mid-pass": those before the iteration's last call to the GPU, after which the GPU idles until the host
has queued more), the host's own time to issue them all (Python, with the device doing nothing), and the calls of
one SGD update of the net's parameters (momentum, L2 decay: the solver's GPU path).

    python tools/gpu_calls.py [--nets lenet,alexnet,resnet50,googlenet] [--iterations 3]

The nets are bench/nets.py's, at its GPU batches. The device is the emulated one (backend/emulated.py) with every
call counted and none carried out: the counts are the GPU path's, except that convolutions, pooling, LRN, softmax and
the neurons run our kernels here where a real GPU runs cuDNN (one cuDNN call or a few per layer and pass instead).
The host time excludes the driver's and cuBLAS's own cost per call (a few microseconds each on a real GPU): it says
whether Python alone could keep a GPU busy, e.g. ResNet-50's host time against its GPU time per iteration.
"""
import argparse
import collections
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))
sys.path.insert(0, str(HERE.parent))

WAITS = ("download", "dot", "asum")     # calls whose result the host reads: each waits for the GPU


def counted(kind, result=None):
    """A device method that counts a call of `kind` and does nothing else."""
    def call(self, *args, **kwargs):
        self.calls[kind] += 1
        self.order.append(kind)
        return result
    return call


def counting_device():
    from pycaffe_dist.backend import emulated

    class CountingDevice(emulated.EmulatedDevice):
        """Counts every call by kind and carries none out (memory is allocated as usual)."""
        name = "counting device (nothing runs)"
        _check_launch = counted("argument checks")
        _launch = counted("kernel launches")
        _sgemm = _sgemm_batched = counted("GEMM")
        _sgemv = counted("GEMV")
        axpy = scal = counted("axpy, scal")
        dot, asum = counted("dot", 0.0), counted("asum", 0.0)
        upload = counted("uploads")
        copy = memset = counted("memsets, copies")

        def __init__(self):
            super().__init__()
            self.calls = collections.Counter()
            self.order = []     # the kinds of the calls, in order

        def download(self, src, host, stream=None):
            self.calls["download"] += 1
            self.order.append("download")
            host[...] = 0       # labels read back must be valid ones
    return CountingDevice()


def measure(net_name, iterations):
    import nets as bench_nets
    from pycaffe_dist import common
    from pycaffe_dist.backend import select
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    dev = select.use(counting_device())
    common.set_mode_gpu()
    net = Net(bench_nets._net_param(net_name), phase=caffe_pb2.TRAIN)
    bench_nets._random_inputs(net)

    def step():
        net.clear_param_diffs()
        net.forward_backward()
    for _ in range(2):      # the first uploads the inputs and makes the buffers
        step()
    dev.calls.clear()
    host_s, mid_pass = 0.0, 0
    for _ in range(iterations):
        del dev.order[:]
        started = time.perf_counter()
        step()
        host_s += time.perf_counter() - started
        last = max(i for i, kind in enumerate(dev.order) if kind not in WAITS + ("uploads", "argument checks"))
        mid_pass += sum(1 for kind in dev.order[:last] if kind in WAITS)
    host_ms = 1000.0 * host_s / iterations
    per = {kind: count / iterations for kind, count in dev.calls.items()}
    per["host waits"] = sum(per.pop(kind, 0) for kind in WAITS)
    per["in mid-pass"] = mid_pass / iterations
    fused = [f.forward_fused for f in net.fusions.values() if f.forward_fused]
    return per, host_ms, "%d (%d layers)" % (len(fused), sum(fused)), update_calls(dev, net)


def update_calls(dev, net):
    """The calls of one SGD update (momentum, L2 weight decay) of the net's learnable params, as the solver's."""
    from pycaffe_dist.proto import caffe_pb2
    from pycaffe_dist.solver import updates_gpu
    param = caffe_pb2.SolverParameter(base_lr=0.01, momentum=0.9, weight_decay=0.0005, lr_policy="fixed")
    history, tables = [dev.zeros(b.count) for b in net.learnable_params], {}
    for _ in range(2):      # the first makes the solver's parameter table (uploads)
        before = collections.Counter(dev.calls)
        updates_gpu.compute_steps(param, net.learnable_params, net.params_lr, net.params_weight_decay, history, 0,
                                  tables=tables)
        updates_gpu.apply_steps(net.learnable_params, tables)
    made = dev.calls - before
    return sum(v for k, v in made.items() if k not in ("uploads", "argument checks"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="lenet,alexnet,resnet50,googlenet")
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()
    columns = ("kernel launches", "GEMM", "GEMV", "axpy, scal", "memsets, copies", "host waits", "in mid-pass")
    print("| net | " + " | ".join(columns) + " | all calls | layer runs fused | host ms / iteration | "
          "SGD update calls |")
    print("|---|" + "---:|" * (len(columns) + 4))
    for name in args.nets.split(","):
        per, host_ms, fused, update = measure(name, args.iterations)
        total = sum(v for k, v in per.items() if k not in ("uploads", "argument checks", "in mid-pass"))
        print("| %s | %s | %d | %s | %.2f | %d |" % (name, " | ".join("%d" % per.get(c, 0) for c in columns), total,
                                                    fused, host_ms, update))


if __name__ == "__main__":
    main()
