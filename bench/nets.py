"""Forward+backward time per iteration of our nets against PyTorch, on the CPU or (--gpu) on one NVIDIA GPU.

CPU mode measures LeNet and CIFAR-10 quick by default; --gpu measures LeNet, CIFAR-10 quick and AlexNet.

    python bench/nets.py [--iterations 30] [--rounds 3] [--threads 1,2] [--nets lenet,cifar10_quick]
                         [--batch googlenet=8] [--plot out.png]
    python bench/nets.py --nets lenet,cifar10_quick,resnet18,squeezenet,googlenet --iterations 10
    python bench/nets.py --gpu [--iterations 30] [--nets lenet,cifar10_quick,alexnet] [--plot out.png]
                         [--gemm-size 8192] [--torch-tf32]

CPU mode. Each measurement runs in its own process (thread settings are fixed at start-up, and peak RSS is per
process): the same net (bench/nets/*_input.prototxt, TRAIN phase, Input layers with random data and labels),
`--iterations` forward+backward passes timed after warm-up passes. PyTorch runs the same layers (built from the
prototxt) with torch.set_num_threads. Each setting runs `--rounds` processes of ours and of PyTorch in turns
(ours, PyTorch, PyTorch, ours, ...), and a time is the median over all of a framework's iterations: these
shared machines run for seconds at a time up to 1.3x slower (a LeNet iteration 16.6 ms instead of 12.9), and
one process each could land one framework in a slow spell and the other in a fast one. The real Caffe's figures
on these machines (1 thread, from `caffe time`) are quoted for reference: 17.4 ms (LeNet), 162 ms (CIFAR-10
quick). A float32 GEMM through numpy's BLAS on one thread, timed after each of our timed iterations (off their
clock), says how fast the machine ran meanwhile; the row's "GEMM floor" is the net's forward+backward FLOPs
(counted as in GPU mode below) at that rate times the threads: what its products alone would take, the floor
issue 3 names (8 and 66 ms at 104 GFLOP/s). Peak RSS is the process's maximum resident set (the largest of the
rounds); "+RSS" subtracts what the process held before building the net (Python, numpy or torch themselves, and
for ours the GEMM's two 1 MB matrices). The CPU batch is NETS's, or CPU_BATCH's where the CPU takes a smaller one
(ResNet-18 and GoogLeNet 16), or --batch's. "path" is the vector path of our float32 convolutions (AVX-512 or
AVX2: csrc/sgemm.h, chosen by the build; BLAS without AVX2); after the table, each net's convolutions are listed
with the kernels their passes take (ConvEngine.kernel_path). "target": issue 29's ours/PyTorch targets at 1
thread on an AVX-512 machine.

GPU mode (--gpu; needs pycuda, the nvcc-built kernels and PyTorch with CUDA). Nets and batches: LeNet 64,
CIFAR-10 quick 100, AlexNet 128 (bench/nets/alexnet_input.prototxt: Caffe's bvlc_alexnet train_val with Input
layers). Each measurement again runs in its own process:
- ours: `select.use_gpu(0)`, the Net in TRAIN phase, random data and labels; one iteration is
  `clear_param_diffs` + `forward_backward` (as a solver step does, and as PyTorch's zero_grad below). Layers
  without GPU code fall back to their CPU code on host copies (as Caffe's Forward_gpu does): the table's notes
  name them, since their copies are part of the time.
- PyTorch: the same layers as torch modules (torch_model) on "cuda", zero_grad + forward + loss + backward.
  Convolutions and matmuls in IEEE float32, as ours (cuBLAS's default math): PyTorch's own default lets cuDNN use
  TF32 for convolutions, which --torch-tf32 restores. cudnn.benchmark stays off (PyTorch's default).
- Timing: GPU work is asynchronous, so each iteration is bracketed by a device synchronisation
  (select.current().synchronize() for ours, torch.cuda.synchronize() for PyTorch) before the clock is read at each
  end; `--iterations` after 3 warm-up iterations, in `--rounds` processes per framework (default 2) taken in turns
  as in CPU mode, and a time is the median over all of a framework's iterations.
- GEMM reference, in the same run: a float32 C = A B of `--gemm-size`^3 (default 8192) through our device's gemm
  (cuBLAS on DeviceArrays) and through torch.matmul, 2 n^3 FLOPs each, median of 10 after 3 warm-ups, in TFLOP/s.
  The "% GEMM" columns compare a net's achieved rate with the higher of the two: how close to the machine's
  float32 GEMM roof each framework runs the net.
- FLOPs of one forward+backward: the forward is what our layers' `flops(bottom, top)` count (as `dist_caffe
  net-info`; a multiply-add is 2). The backward of a Convolution/Deconvolution/InnerProduct layer is counted as
  2x its forward (one GEMM-sized product for the weight gradient, one for the bottom gradient), or 1x where the
  bottom takes no gradient (the first convolution, on the data); any other layer's backward as 1x its forward
  where it runs backward at all. The same count serves both frameworks (they run the same net).
PCD_DEVICE=emulated runs ours on the emulated device (the CUDA kernels compiled for the host, numpy BLAS): slow,
for checking this code path without a GPU (use --nets lenet --iterations 2, and --torch-device cpu for PyTorch);
the GEMM size then defaults to 1024. Without a usable GPU, --gpu exits with one line saying why.
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
        "cifar10_quick": (HERE / "nets" / "cifar10_quick_input.prototxt", 100),
        "alexnet": (HERE / "nets" / "alexnet_input.prototxt", 128),
        "resnet50": (HERE / "nets" / "resnet50_input.prototxt", 32),
        "googlenet": (HERE / "nets" / "googlenet_input.prototxt", 32),
        "squeezenet": (HERE / "nets" / "squeezenet_input.prototxt", 32),
        "resnet18": (HERE / "nets" / "resnet18_input.prototxt", 16)}
# CPU mode's batch where it is smaller than NETS's (the GPU's); --batch overrides either.
CPU_BATCH = {"googlenet": 16}
# Issue 29's targets on the CPU, 1 thread on an AVX-512 machine, ours / PyTorch.
CPU_TARGETS = {"lenet": 0.5, "cifar10_quick": 0.8, "resnet18": 0.9, "squeezenet": 0.9, "googlenet": 0.9}
GPU_NETS = ("lenet", "cifar10_quick", "alexnet", "resnet50", "googlenet")
# Issue 28's targets on one GPU, ours / PyTorch, IEEE float32 both.
GPU_TARGETS = {"lenet": 0.6, "cifar10_quick": 0.8, "alexnet": 0.8, "resnet50": 1.0, "googlenet": 1.0}
CAFFE_MS = {"lenet": 17.4, "cifar10_quick": 162.0}   # caffe time, 1 thread, same machines (issue 3)
WARMUP = 3
GEMM_REPS = 10
CALIBRATION_N = 512
GEMM_LAYERS = ("Convolution", "Deconvolution", "InnerProduct")   # backward = 2 x forward (see the docstring)


def _current_rss_mb():
    """Resident memory now (the torch child's base: its peak may include our Net, built and freed to shape its
    copy, while the base must not)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2.0 ** 20


def _peak_rss_mb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _net_param(net_name, batch=None):
    """The net's prototxt with its Input layers at `batch` (NETS's where None)."""
    from pycaffe_dist.io.load import read_net
    path, default = NETS[net_name]
    batch = batch or default
    param = read_net(str(path))
    for layer in param.layer:
        if layer.type == "Input":
            for shape in layer.input_param.shape:
                shape.dim[0] = batch
    return param


def _times_ms(step, iterations, sync=None, between=None):
    """Wall times of `iterations` calls of `step` after WARMUP calls; with `sync` (asynchronous devices), the
    device is idle when the clock starts and has finished the step's work when it stops; `between` runs after each
    timed call, off the clock."""
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(iterations):
        if sync is not None:
            sync()
        start = time.perf_counter()
        step()
        if sync is not None:
            sync()
        times.append(1000.0 * (time.perf_counter() - start))
        if between is not None:
            between()
    return times


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def _median_ms(step, iterations, sync=None):
    return _median(_times_ms(step, iterations, sync))


def _random_inputs(net):
    import numpy as np
    rng = np.random.default_rng(0)
    data, label = net.blob_by_name("data"), net.blob_by_name("label")
    data.data[...] = rng.standard_normal(data.shape)
    label.data[...] = rng.integers(0, 10, label.shape)


def run_ours(net_name, threads, iterations, batch=None):
    from pycaffe_dist import common
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    common.set_num_threads(threads)
    gemm_sample, gemm_gflops, ours_gflops = _gemm_sampler()
    gemm_sample()   # BLAS's own buffers, allocated at its first call, belong to the base too
    del gemm_gflops[:], ours_gflops[:]
    base = _peak_rss_mb()
    net = Net(_net_param(net_name, batch), phase=caffe_pb2.TRAIN)
    _random_inputs(net)
    times = _times_ms(net.forward_backward, iterations, between=gemm_sample)
    return {"times_ms": times, "gemm_gflops": gemm_gflops, "ours_gflops": ours_gflops, "flops": fwd_bwd_flops(net),
            "conv_paths": conv_paths(net), "path": simd_path()}, base


def simd_path():
    """The vector path of our float32 convolutions in this build: "AVX-512", "AVX2" or "BLAS"."""
    from pycaffe_dist._kernels import conv_fused
    from pycaffe_dist.backend import conv
    if not conv.sgemm_enabled():
        return "BLAS"
    return {"avx512": "AVX-512", "avx2": "AVX2"}[conv_fused.simd()]


def conv_paths(net):
    """[(layer, input shape, kernels)] for the net's CPU convolutions: what each one's engine dispatches to."""
    found = []
    for layer_id, layer in enumerate(net.layers):
        engine = getattr(layer, "engine", None)
        if layer.type in ("Convolution", "Deconvolution") and engine is not None:
            dtype = net.blob_list[net.bottom_ids[layer_id][0]].data.dtype
            found.append((layer.name, "x".join(str(d) for d in engine.im_shape), engine.kernel_path(dtype)))
    return found


def _gemm_sampler():
    """A function that times one float32 CALIBRATION_N^3 GEMM through numpy's BLAS (one thread: see
    common.set_num_threads) and one through our csrc/sgemm.h (one thread; where built), and adds their GFLOP/s to
    the two lists returned with it: how fast the machine runs now. On an AVX-512 machine numpy's OpenBLAS may
    still run an AVX2 kernel (Zen 5), and ours the AVX-512 one: the floor takes the faster."""
    import numpy as np
    from pycaffe_dist.backend import blas, conv
    a = np.random.default_rng(0).standard_normal((CALIBRATION_N, CALIBRATION_N)).astype(np.float32)
    c = np.empty_like(a)
    rates, ours = [], []
    gemm = blas.kernel("gemm").gemm if conv.sgemm_enabled() else None

    def sample():
        start = time.perf_counter()
        np.matmul(a, a, out=c)
        rates.append(2.0 * CALIBRATION_N ** 3 / (time.perf_counter() - start) / 1e9)
        if gemm is not None:
            start = time.perf_counter()
            gemm(False, False, 1.0, a, a, 0.0, c, 1)
            ours.append(2.0 * CALIBRATION_N ** 3 / (time.perf_counter() - start) / 1e9)
    return sample, rates, ours


def fwd_bwd_flops(net):
    """FLOPs of one forward+backward of a built Net (the docstring says how the backward is counted)."""
    total = 0
    for layer_id, layer in enumerate(net.layers):
        bottom = [net.blob_list[i] for i in net.bottom_ids[layer_id]]
        top = [net.blob_list[i] for i in net.top_ids[layer_id]]
        forward = int(layer.flops(bottom, top))
        backward = 0
        if net.layer_need_backward[layer_id]:
            if layer.type in GEMM_LAYERS:
                backward = forward * (2 if any(net.bottom_need_backward[layer_id]) else 1)
            else:
                backward = forward
        total += forward + backward
    return total


def _host_layers(net):
    """Layers that run their CPU code on host copies in GPU mode (no forward_gpu, or no backward_gpu where they
    run backward)."""
    # Input has no GPU code (nor has Caffe's InputLayer) but its forward does nothing: nothing moves for it.
    return ["%s (%s)" % (layer.name, layer.type) for layer_id, layer in enumerate(net.layers)
            if layer.type != "Input" and
            (layer.forward_gpu is None or (net.layer_need_backward[layer_id] and layer.backward_gpu is None))]


def _open_gpu():
    """Our device 0 in GPU mode, or {"error": why} where there is none."""
    from pycaffe_dist.backend import select
    from pycaffe_dist.errors import DeviceError
    try:
        return select.use_gpu(0), None
    except DeviceError as exc:
        return None, {"error": str(exc)}


def run_ours_gpu(net_name, iterations):
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    dev, error = _open_gpu()
    if error:
        return error
    net = Net(_net_param(net_name), phase=caffe_pb2.TRAIN)
    _random_inputs(net)     # host copies: the first forward uploads them, once

    def step():
        net.clear_param_diffs()
        net.forward_backward()
    times = _times_ms(step, iterations, sync=dev.synchronize)
    return {"ms": _median(times), "times_ms": times, "flops": fwd_bwd_flops(net), "device": dev.name,
            "host_layers": _host_layers(net)}


def torch_model(net_name, batch=None):
    """PyTorch's copy of the net (bench/torch_net.py: the same layers, shapes and loss weights), built from our Net
    in TRAIN phase, which is freed again before anything is timed."""
    import gc
    from pycaffe_dist.net.net import Net
    from pycaffe_dist.proto import caffe_pb2
    sys.path.insert(0, str(HERE))
    import torch_net
    net = Net(_net_param(net_name, batch), phase=caffe_pb2.TRAIN)
    model, torch = torch_net.build(net)
    del net
    gc.collect()
    return model, torch


def _torch_inputs(param, torch):
    """{"data": random images, "label": labels in 0..9}, as _random_inputs gives ours."""
    from pycaffe_dist.proto import caffe_pb2
    shape = tuple(next(l for l in param.layer if l.type == "Input" and
                       all(r.phase != caffe_pb2.TEST for r in l.include)).input_param.shape[0].dim)
    gen = torch.Generator().manual_seed(0)
    return {"data": torch.randn(shape, generator=gen), "label": torch.randint(0, 10, (shape[0],), generator=gen)}


def run_torch(net_name, threads, iterations, batch=None):
    base = _current_rss_mb()
    model, torch = torch_model(net_name, batch)
    torch.set_num_threads(threads)
    inputs = _torch_inputs(_net_param(net_name, batch), torch)

    def step():
        model.zero_grad(set_to_none=False)
        model(inputs).backward()
    return {"times_ms": _times_ms(step, iterations)}, base


def _torch_on(device_name, tf32):
    """torch, set up for `device_name` with IEEE float32 (or TF32) products, and its synchronisation; or an error."""
    import torch
    sync = None
    if device_name.startswith("cuda"):
        if not torch.cuda.is_available():
            return None, None, {"error": "torch %s sees no CUDA device (CPU-only build, or no driver)"
                                % torch.__version__}
        sync = torch.cuda.synchronize
    precision = "tf32" if tf32 else "ieee"
    if hasattr(torch.backends.cudnn, "conv") and hasattr(torch.backends.cudnn.conv, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
    else:   # before torch 2.9
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return torch, sync, None


def run_torch_gpu(net_name, iterations, device_name, tf32):
    torch, sync, error = _torch_on(device_name, tf32)
    if error:
        return error
    model, _ = torch_model(net_name)
    model.to(device_name)
    inputs = {k: v.to(device_name) for k, v in _torch_inputs(_net_param(net_name), torch).items()}

    def step():
        model.zero_grad(set_to_none=False)
        model(inputs).backward()
    times = _times_ms(step, iterations, sync=sync)
    name = torch.cuda.get_device_name() if sync else "cpu"
    return {"ms": _median(times), "times_ms": times, "device": name}


def gemm_ours(n):
    import numpy as np
    dev, error = _open_gpu()
    if error:
        return error
    rng = np.random.default_rng(0)
    a, b, c = (dev.empty(n * n) for _ in range(3))
    for array in (a, b):
        dev.upload(array, rng.standard_normal(n * n, dtype=np.float32))
    dev.memset(c, 0)
    ms = _median_ms(lambda: dev.gemm(False, False, n, n, n, 1.0, a, b, 0.0, c), GEMM_REPS, sync=dev.synchronize)
    return {"tflops": 2.0 * n ** 3 / (ms * 1e-3) / 1e12, "ms": ms, "device": dev.name}


def gemm_torch(n, device_name, tf32):
    torch, sync, error = _torch_on(device_name, tf32)
    if error:
        return error
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device_name) for _ in range(2))
    c = torch.empty(n, n, device=device_name)
    ms = _median_ms(lambda: torch.matmul(a, b, out=c), GEMM_REPS, sync=sync)
    return {"tflops": 2.0 * n ** 3 / (ms * 1e-3) / 1e12, "ms": ms}


def child(args):
    if args.gpu:
        if args.child == "ours":
            result = run_ours_gpu(args.nets, args.iterations)
        elif args.child == "torch":
            result = run_torch_gpu(args.nets, args.iterations, args.torch_device, args.torch_tf32)
        elif args.child == "gemm-ours":
            result = gemm_ours(args.gemm_size)
        else:
            result = gemm_torch(args.gemm_size, args.torch_device, args.torch_tf32)
        print(json.dumps(result), flush=True)
        # pycuda aborts the process at exit when a context is still pushed, as our CudaDevice leaves its primary
        # context: the result is out, so leave without the interpreter's teardown.
        os._exit(0)
    runner = run_ours if args.child == "ours" else run_torch
    result, base = runner(args.nets, args.threads_one, args.iterations, args.batch_one)
    peak = _peak_rss_mb()
    print(json.dumps(dict(result, peak_mb=peak, extra_mb=peak - base)))


def _in_turns(net_name, threads, iterations, rounds, have_torch, batch):
    """Ours and PyTorch at one setting, `rounds` processes each, taken in turns (ours first in even rounds): the
    medians of all their iterations, and the larger peak RSS of each."""
    runs = {"ours": [], "torch": []}
    extra = ["--batch-one", str(batch)]
    for r in range(rounds):
        order = ("ours", "torch") if r % 2 == 0 else ("torch", "ours")
        for which in order:
            if which == "ours" or have_torch:
                runs[which].append(measure(which, net_name, threads, iterations, extra))

    def pooled(results):
        if not results:
            return None
        summary = {"ms": _median([t for res in results for t in res["times_ms"]]),
                   "peak_mb": max(res["peak_mb"] for res in results),
                   "extra_mb": max(res["extra_mb"] for res in results)}
        if "flops" in results[0]:   # ours: the net's FLOPs and the GEMM rate timed between its iterations
            summary.update(flops=results[0]["flops"], conv_paths=results[0]["conv_paths"], path=results[0]["path"],
                           gemm_gflops=_median([g for res in results for g in res["gemm_gflops"]]),
                           ours_gflops=_median([g for res in results for g in res["ours_gflops"]] or [0.0]))
        return summary
    return pooled(runs["ours"]), pooled(runs["torch"])


def measure(which, net_name, threads, iterations, extra=()):
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    command = [sys.executable, __file__, "--child", which, "--iterations", str(iterations)]
    if net_name is not None:
        command += ["--nets", net_name]
    if threads is not None:
        command += ["--threads-one", str(threads)]
    out = subprocess.run(command + list(extra), env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("bench: %s %s%s failed:\n%s" % (
            which, net_name, " with %d threads" % threads if threads is not None else "", out.stderr))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--threads", help="CPU mode: thread counts to measure (default 1,2); --gpu: the host threads "
                                      "(default: the libraries' own)")
    ap.add_argument("--nets", help="default: lenet,cifar10_quick (CPU), %s (--gpu); also: %s"
                                   % (",".join(GPU_NETS), ", ".join(sorted(NETS))))
    ap.add_argument("--plot", help="also write a bar chart (PNG) of the times")
    ap.add_argument("--gpu", action="store_true", help="ours and PyTorch on GPU 0, with a GEMM reference")
    ap.add_argument("--gemm-size", type=int, help="--gpu: n of the n x n x n GEMM reference (default 8192, or "
                                                  "1024 on the emulated device or --torch-device cpu)")
    ap.add_argument("--torch-tf32", action="store_true",
                    help="--gpu: let PyTorch use TF32 (its default for cuDNN convolutions) instead of IEEE float32")
    ap.add_argument("--torch-device", default="cuda", help=argparse.SUPPRESS)   # cpu: check the torch side here
    ap.add_argument("--rounds", type=int,
                    help="processes per framework and setting, taken in turns (default 3, --gpu 2; see the docstring)")
    ap.add_argument("--child", choices=["ours", "torch", "gemm-ours", "gemm-torch"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--threads-one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", default="", help="CPU mode: NET=N[,NET=N...], the batch of those nets (default: "
                                                "CPU_BATCH's, else NETS's)")
    ap.add_argument("--batch-one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.gpu and args.threads_one is not None:
            from pycaffe_dist import common
            common.set_num_threads(args.threads_one)
        return child(args)
    args.rounds = args.rounds if args.rounds is not None else (2 if args.gpu else 3)
    if args.rounds < 1:
        ap.error("--rounds must be 1 or more, got %d" % args.rounds)
    if args.gpu:
        return main_gpu(args)
    args.threads = args.threads or "1,2"
    args.nets = args.nets or "lenet,cifar10_quick"
    # Not imported here: Linux carries a parent's peak RSS into the children it starts (fork + exec).
    have_torch = importlib.util.find_spec("torch") is not None
    if not have_torch:
        print("bench: PyTorch is not installed (pip install torch==2.13.0): its columns stay empty")
    batches = {name: CPU_BATCH.get(name, NETS[name][1]) for name in NETS}
    for item in filter(None, args.batch.split(",")):
        name, _, value = item.partition("=")
        if name not in NETS or not value.isdigit():
            ap.error("--batch wants NET=N with NET one of %s, got %r" % (", ".join(NETS), item))
        batches[name] = int(value)
    rows, paths = [], []
    header = ("net", "batch", "threads", "path", "pycaffe-dist ms", "PyTorch ms", "ours/PyTorch", "target",
              "Caffe ms (1 thr)",
              "ours/Caffe", "BLAS GEMM GFLOP/s", "sgemm.h GFLOP/s", "GEMM floor ms", "ours % of GEMM", "peak RSS ours MB",
              "peak RSS torch MB", "+RSS ours", "+RSS torch")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for net_name in args.nets.split(","):
        for threads in [int(t) for t in args.threads.split(",")]:
            batch = batches[net_name]
            ours, ref = _in_turns(net_name, threads, args.iterations, args.rounds, have_torch, batch)
            gemm_gflops = max(ours["gemm_gflops"], ours["ours_gflops"])
            caffe = CAFFE_MS.get(net_name) if threads == 1 and batch == NETS[net_name][1] else None
            floor_ms = ours["flops"] / (threads * gemm_gflops * 1e9) * 1e3
            target = CPU_TARGETS.get(net_name) if threads == 1 else None
            verdict = "-" if target is None or ref is None else "<= %.2f %s" % (
                target, "met" if ours["ms"] / ref["ms"] <= target else "NOT MET")
            row = (net_name, batch, threads, ours["path"], "%.1f" % ours["ms"], "%.1f" % ref["ms"] if ref else "-",
                   "%.2f" % (ours["ms"] / ref["ms"]) if ref else "-", verdict, "%.1f" % caffe if caffe else "-",
                   "%.2f" % (ours["ms"] / caffe) if caffe else "-", "%.0f" % ours["gemm_gflops"],
                   "%.0f" % ours["ours_gflops"] if ours["ours_gflops"] else "-", "%.1f" % floor_ms,
                   "%.0f" % (100 * floor_ms / ours["ms"]), "%.0f" % ours["peak_mb"],
                   "%.0f" % ref["peak_mb"] if ref else "-", "%.0f" % ours["extra_mb"],
                   "%.0f" % ref["extra_mb"] if ref else "-")
            rows.append((net_name, threads, ours["ms"], ref["ms"] if ref else None, floor_ms))
            print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
            if threads == int(args.threads.split(",")[0]):
                paths.append((net_name, ours["conv_paths"]))
    print("\nBLAS GEMM GFLOP/s: a float32 %d^3 GEMM through numpy's BLAS on one thread, timed after each of our\n"
          "timed iterations (the median; issue 3 puts these machines at about 104 GFLOP/s a core); sgemm.h GFLOP/s:\n"
          "the same through our csrc/sgemm.h (its AVX-512 kernel where built). GEMM floor: the net's forward+backward\n"
          "FLOPs at the faster rate times the threads, what its products alone take; ours %% of GEMM = floor / ours."
          % CALIBRATION_N)
    for net_name, convs in paths:
        print("\n%s: the kernels of each convolution (layer, input C x H x W: path)" % net_name)
        for name, shape, path in convs:
            print("  %s %s: %s" % (name, shape, path))
    if args.plot:
        plot(rows, args.plot)


def _gpu_in_turns(net_name, threads, iterations, rounds, have_torch, extra):
    """Ours and PyTorch on the GPU, `rounds` processes each in turns (ours, PyTorch, PyTorch, ours, ...): each a
    median over all of its framework's iterations. A step of a few milliseconds is paced by the host, whose speed
    drifts by a quarter over a minute on a shared machine (CIFAR-10 quick: 1.46 and 1.93 ms on two days, the same
    code): taken in turns, both frameworks meet the same spells."""
    runs = {"ours": [], "torch": []}
    for r in range(rounds):
        for which in (("ours", "torch") if r % 2 == 0 else ("torch", "ours")):
            if which == "torch" and not have_torch:
                continue
            result = measure(which, net_name, threads, iterations, extra)
            if "error" in result:
                what = "no GPU" if which == "ours" else "PyTorch failed on %s" % net_name
                raise SystemExit("bench/nets.py --gpu: %s: %s" % (what, result["error"]))
            runs[which].append(result)
    pooled = {}
    for which, results in runs.items():
        if results:
            pooled[which] = dict(results[0], ms=_median([t for res in results for t in res["times_ms"]]))
    return pooled["ours"], pooled.get("torch")


def main_gpu(args):
    nets = (args.nets or ",".join(GPU_NETS)).split(",")
    unknown = [n for n in nets if n not in NETS]
    if unknown:
        raise SystemExit("bench/nets.py --gpu: unknown net(s) %s (known: %s)" % (", ".join(unknown), ", ".join(NETS)))
    threads = int(args.threads.split(",")[0]) if args.threads else None
    emulated = os.environ.get("PCD_DEVICE", "") == "emulated"
    gemm_size = args.gemm_size or (1024 if emulated or args.torch_device == "cpu" else 8192)
    extra = ["--gpu", "--torch-device", args.torch_device, "--gemm-size", str(gemm_size)]
    extra += ["--torch-tf32"] if args.torch_tf32 else []

    # Ours first: it says whether there is a GPU at all (a DeviceError's reason), before anything long runs.
    gemm = measure("gemm-ours", None, threads, 1, extra)
    if "error" in gemm:
        raise SystemExit("bench/nets.py --gpu: no GPU: %s" % gemm["error"])
    have_torch = importlib.util.find_spec("torch") is not None
    torch_gemm = measure("gemm-torch", None, threads, 1, extra) if have_torch else {"error": "PyTorch is not installed"}
    if "error" in torch_gemm:
        print("bench: PyTorch on %s unavailable (%s): its columns stay empty"
              % (args.torch_device, torch_gemm["error"]))
        have_torch = False
    roof = max(gemm["tflops"], torch_gemm["tflops"] if have_torch else 0.0)
    print("bench: ours on %s; PyTorch on %s%s" % (gemm["device"], args.torch_device,
                                                   " (TF32 allowed)" if args.torch_tf32 else " (IEEE float32)"))
    print("bench: GEMM %d^3 float32: ours (device gemm) %.3g TFLOP/s, torch.matmul %s; %% GEMM below is of %.3g"
          % (gemm_size, gemm["tflops"], "%.3g TFLOP/s" % torch_gemm["tflops"] if have_torch else "-", roof))
    header = ("net", "batch", "GFLOP/iter", "ours ms", "torch ms", "ours/torch", "target", "ours TFLOP/s",
              "torch TFLOP/s", "ours % GEMM", "torch % GEMM")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    rows, notes = [], []
    for net_name in nets:
        ours, ref = _gpu_in_turns(net_name, threads, args.iterations, args.rounds, have_torch, extra)
        flops = ours["flops"]
        ours_tf = flops / (ours["ms"] * 1e-3) / 1e12
        ref_tf = flops / (ref["ms"] * 1e-3) / 1e12 if ref else None
        target = GPU_TARGETS.get(net_name)
        verdict = "-" if target is None else "<= %.1f %s" % (
            target, ("met" if ours["ms"] / ref["ms"] <= target else "NOT MET") if ref else "not measured")
        row = (net_name, NETS[net_name][1], "%.2f" % (flops / 1e9), "%.2f" % ours["ms"],
               "%.2f" % ref["ms"] if ref else "-", "%.2f" % (ours["ms"] / ref["ms"]) if ref else "-", verdict,
               "%.3g" % ours_tf, "%.3g" % ref_tf if ref else "-", "%.1f" % (100 * ours_tf / roof),
               "%.1f" % (100 * ref_tf / roof) if ref else "-")
        rows.append((net_name, ours["ms"], ref["ms"] if ref else None, ours_tf, ref_tf))
        print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
        if ours["host_layers"]:
            notes.append("%s: on the host (no GPU code): %s" % (net_name, ", ".join(ours["host_layers"])))
    for note in notes:
        print("bench: " + note)
    if args.plot:
        plot_gpu(rows, roof, "PyTorch %s" % args.torch_device, args.plot)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = ["%s\n%d thread%s" % (n, t, "s" if t > 1 else "") for n, t, _, _, _ in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(1.8 * len(rows) + 2, 4))
    ax.bar([x - 0.2 for x in xs], [r[2] for r in rows], 0.4, label="pycaffe-dist")
    ax.bar([x + 0.2 for x in xs], [r[3] or 0 for r in rows], 0.4, label="PyTorch CPU")
    ax.hlines([r[4] for r in rows], [x - 0.45 for x in xs], [x + 0.45 for x in xs], colors="black",
              label="GEMM floor (the FLOPs at the measured GEMM rate)")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("forward+backward ms / iteration")
    ax.margins(y=0.3)   # room for the legend above the bars
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    print("bench: wrote", path)


def plot_gpu(rows, roof, torch_label, path):
    """Left: ours/PyTorch time per net (target <= 1), each bar labelled with both times; right: achieved TFLOP/s
    against the GEMM roof."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = list(range(len(rows)))
    labels = [r[0] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(2.4 * len(rows) + 4, 4))
    ratios = [r[1] / r[2] if r[2] else 0 for r in rows]
    bars = left.bar(xs, ratios, 0.5, color="C0")
    for bar, r in zip(bars, rows):
        left.annotate("%.4g / %s ms" % (r[1], "%.4g" % r[2] if r[2] else "-"),
                      (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    left.axhline(1.0, color="grey", linestyle="--", label="target: as fast as %s" % torch_label)
    left.set_xticks(xs, labels)
    left.set_ylabel("forward+backward time, ours / PyTorch")
    left.legend()
    right.bar([x - 0.2 for x in xs], [r[3] for r in rows], 0.4, label="pycaffe-dist GPU")
    right.bar([x + 0.2 for x in xs], [r[4] or 0 for r in rows], 0.4, label=torch_label)
    right.axhline(roof, color="grey", linestyle="--", label="float32 GEMM %.3g TFLOP/s" % roof)
    right.set_xticks(xs, labels)
    right.set_ylabel("achieved TFLOP/s")
    right.legend()
    fig.tight_layout()
    fig.savefig(path)
    print("bench: wrote", path)


if __name__ == "__main__":
    main()
