"""What one training iteration asks of the GPU, counted without one: the kernel launches, BLAS calls, memsets and
copies of a forward+backward on the GPU code path, the reads that make the host wait for the GPU (downloads, dot,
asum; "in mid-pass": those before the iteration's last call to the GPU, after which the GPU idles until the host
has queued more), the host's own time to issue them all (Python, with the device doing nothing), and the calls of
one SGD update of the net's parameters (momentum, L2 decay: the solver's GPU path).

    python tools/gpu_calls.py [--nets lenet,alexnet,resnet50,googlenet] [--iterations 3] [--no-cudnn]

The nets are bench/nets.py's, at its GPU batches. The device is the emulated one (backend/emulated.py) with every
call counted and none carried out. The layers take the path they take on a real GPU with cuDNN: a counting cuDNN
handle stands in for the library (its calls are counted, none runs; Find offers nothing, so each convolution keeps
algorithm 0 without a workspace). --no-cudnn counts the path of a GPU without cuDNN (engine CAFFE: our kernels).
The host time excludes the driver's, cuBLAS's and cuDNN's own cost per call (from a few microseconds for a kernel
launch to tens for some cuDNN calls on a real GPU): it is Python's share, and says whether Python alone could keep
a GPU busy, e.g. ResNet-50's host time against its GPU time per iteration.
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
            self.cudnn_calls = collections.Counter()    # the "cuDNN" calls by function
            self.order = []     # the kinds of the calls, in order

        def download(self, src, host, stream=None):
            self.calls["download"] += 1
            self.order.append("download")
            host[...] = 0       # labels read back must be valid ones
    return CountingDevice()


def counting_cudnn(dev):
    """A cudnn.Cudnn whose calls are counted on `dev` as "cuDNN" and not made; descriptors are their parameters,
    from which the two output-size queries are answered (Caffe's formulas: cuDNN's own floor sizes)."""
    import ctypes
    from pycaffe_dist.backend import cudnn

    class Described(ctypes.c_void_p):
        """A stand-in descriptor: passes as a pointer, keeps the parameters it was set with."""
        def __init__(self, key):
            super().__init__(1)
            self.key = key

    class CountingCudnn(cudnn.Cudnn):
        def __init__(self):     # no library, no handle
            self.handle = ctypes.c_void_p(1)
            self._descriptors = {}
            self.algorithms = {}

        def call(self, name, *args, with_handle=True, context=""):
            dev.calls["cuDNN"] += 1
            dev.cudnn_calls[name] += 1
            dev.order.append("cuDNN")
            if name == "cudnnGetConvolution2dForwardOutputDim":
                (_, pad, stride, _), (_, n, _, h, w), (_, k, _, kh, kw) = (a.key for a in args[:3])
                sizes = (n, k, (h + 2 * pad[0] - kh) // stride[0] + 1, (w + 2 * pad[1] - kw) // stride[1] + 1)
            elif name == "cudnnGetPooling2dForwardOutputDim":
                (_, _, kh, kw, ph, pw, sh, sw), (_, n, c, h, w) = (a.key for a in args[:2])
                sizes = (n, c, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)
            else:
                return
            for out, size in zip(args[-4:], sizes):
                out._obj.value = size

        def _kept(self, key, kind, setter, *values):
            return self._descriptors.setdefault(key, Described(key))

        def convolution(self, pad, stride, group):
            key = ("convolution", tuple(pad), tuple(stride), int(group))
            return self._descriptors.setdefault(key, Described(key))
    return CountingCudnn()


def measure(net_name, iterations, with_cudnn=True):
    """({kind: calls an iteration}, host ms an iteration, the fused runs, SGD update calls) of `net_name` on the
    counting device, with the counting cuDNN (with_cudnn) or none; the process's device and mode are restored."""
    from pycaffe_dist import common
    from pycaffe_dist.backend import cudnn, select
    from pycaffe_dist.layers import cudnn_engine
    dev = select.use(counting_device())
    previous = common.mode(), cudnn_engine.is_cuda_device, cudnn.for_device
    common.set_mode_gpu()
    # The layers ask for cuDNN on a CUDA device only; here every layer gets the counting handle (or none).
    handle = counting_cudnn(dev) if with_cudnn else None
    cudnn_engine.is_cuda_device = lambda device: with_cudnn
    cudnn.for_device = lambda device: handle
    try:
        return _count(dev, net_name, iterations)
    finally:
        mode, cudnn_engine.is_cuda_device, cudnn.for_device = previous
        select.forget()
        if mode == "cpu":
            common.set_mode_cpu()


def _count(dev, net_name, iterations):
    import nets as bench_nets
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    net = Net(bench_nets._net_param(net_name), phase=caffe_pb2.TRAIN)
    bench_nets._random_inputs(net)

    def step():
        net.clear_param_diffs()
        net.forward_backward()
    for _ in range(2):      # the first uploads the inputs and makes the buffers
        step()
    dev.calls.clear()
    dev.cudnn_calls.clear()
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
    ap.add_argument("--no-cudnn", action="store_true", help="a GPU without cuDNN: every layer runs our kernels")
    args = ap.parse_args()
    columns = ("kernel launches", "cuDNN", "GEMM", "GEMV", "axpy, scal", "memsets, copies", "host waits",
               "in mid-pass")
    print("| net | " + " | ".join(columns) + " | all calls | layer runs fused | host ms / iteration | "
          "SGD update calls |")
    print("|---|" + "---:|" * (len(columns) + 4))
    for name in args.nets.split(","):
        per, host_ms, fused, update = measure(name, args.iterations, with_cudnn=not args.no_cudnn)
        total = sum(v for k, v in per.items() if k not in ("uploads", "argument checks", "in mid-pass"))
        print("| %s | %s | %d | %s | %.2f | %d |" % (name, " | ".join("%d" % per.get(c, 0) for c in columns), total,
                                                    fused, host_ms, update))


if __name__ == "__main__":
    main()
