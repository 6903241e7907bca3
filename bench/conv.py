"""Convolution passes on the CPU, our float32 path (csrc/sgemm.h's GEMM reading images and output diffs in place;
conv_direct.h's unpacked sums for layers with few weight columns; fold8.h's col2im) against the BLAS path
(unrolled columns, numpy's OpenBLAS), in the same process and interleaved.

    python bench/conv.py [--threads 1] [--repeats 3] [--iterations 30]

The layers are LeNet's two convolutions (batch 64) and CIFAR-10 quick's three (batch 100). For each pass (forward
with bias; weight gradient alone; weight and input gradients together, as a backward computes them) it prints
the best over --repeats of the mean time of --iterations calls, in ms, for both paths and their ratio, with our
path's GFLOP/s (the convolution's multiply-adds, counted twice). The two paths alternate within each repeat, so that this VM's drifting speed touches
both alike.
"""
import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from pycaffe_dist import common  # noqa: E402
from pycaffe_dist.backend import conv  # noqa: E402

# name, (channels, height, width), out_channels, kernel, pad, batch
LAYERS = [
    ("LeNet conv1", (1, 28, 28), 20, 5, 0, 64),
    ("LeNet conv2", (20, 12, 12), 50, 5, 0, 64),
    ("CIFAR-10 quick conv1", (3, 32, 32), 32, 5, 2, 100),
    ("CIFAR-10 quick conv2", (32, 16, 16), 32, 5, 2, 100),
    ("CIFAR-10 quick conv3", (32, 8, 8), 64, 5, 2, 100),
]
PASSES = ["forward", "dW", "dW + dX"]


def mean_ms(call, iterations):
    call()
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    return (time.perf_counter() - start) / iterations * 1e3


def passes(engine, w, b, x, y):
    out, dw, dx = np.empty(y.shape, np.float32), np.zeros(w.shape, np.float32), np.empty(x.shape, np.float32)
    return [lambda: engine.image_to_output(w, x, out=out, bias=b),
            lambda: engine.output_to_image(w, y, dw=dw, ims_in=x),
            lambda: engine.output_to_image(w, y, ims_out=dx, dw=dw, ims_in=x)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=30)
    args = ap.parse_args()
    common.set_num_threads(args.threads)
    if not conv.sgemm_enabled():
        raise SystemExit("bench: this build has no AVX2/FMA GEMM (csrc/sgemm.h): nothing to compare")
    rng = np.random.default_rng(0)
    print("| layer | pass | GFLOP | BLAS path ms | ours ms | ours / BLAS | our GFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for name, im_shape, out_channels, k, pad, batch in LAYERS:
        engine = conv.ConvEngine(im_shape, (k, k), (pad, pad), (1, 1), (1, 1), 1, out_channels)
        x = rng.standard_normal((batch,) + im_shape, np.float32)
        w = rng.standard_normal((out_channels, im_shape[0], k, k), np.float32)
        b = rng.standard_normal(out_channels, np.float32)
        y = rng.standard_normal((batch, out_channels) + engine.out_spatial, np.float32)
        calls = passes(engine, w, b, x, y)
        best = {}
        for _ in range(args.repeats):
            for use in (False, True):
                conv.use_sgemm = use
                for i, call in enumerate(calls):
                    key = (use, i)
                    best[key] = min(best.get(key, np.inf), mean_ms(call, args.iterations))
        conv.use_sgemm = True
        gflop = 2.0 * out_channels * engine.rows * engine.positions * batch / 1e9   # one GEMM's multiply-adds
        for i, name_of_pass in enumerate(PASSES):
            flops = gflop * (1, 1, 2)[i]
            blas_ms, ours_ms = best[(False, i)], best[(True, i)]
            print("| %s | %s | %.3f | %.2f | %.2f | %.2f | %.0f |" % (
                name, name_of_pass, flops, blas_ms, ours_ms, ours_ms / blas_ms, flops / ours_ms * 1e3))


if __name__ == "__main__":
    main()
