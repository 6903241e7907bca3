"""Data pipeline throughput: reading + transforming Fashion-MNIST from each backend, and the share of a LeNet
training step spent waiting for data.

    python bench/data.py [--data-dir data/fashion-mnist] [--batches 300] [--steps 200] [--plot out.png]

1. Records/s of reading, parsing and transforming (scale 1/256) batches of 64, one thread, no prefetch, from a
   datumfile, an LMDB and a LevelDB of the Fashion-MNIST training set (converted once into --data-dir). The
   reference measured in the same run is the rate at which LeNet training consumes records (batch 64 per
   step): "x step rate" above 1 means the reader alone outpaces the solver.
2. `--steps` LeNet training steps (prototxt/lenet_train_test.prototxt, Caffe's lenet_solver settings, datumfile
   source, prefetch on, 1 thread): the time the Data layer's forward waited for the prefetch thread, as a share of
   the step time. Target: under 5 %.
"""
import argparse
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
IDX_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")
BACKENDS = ("datumfile", "lmdb", "leveldb")
BATCH = 64


def ensure_data(data_dir):
    from pycaffe_dist.data.convert import convert_idx
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for backend in BACKENDS:
        path = data_dir / ("train.%s" % backend)
        if not path.exists():
            convert_idx(IDX_DIR / "train-images-idx3-ubyte.gz", IDX_DIR / "train-labels-idx1-ubyte.gz", str(path),
                        backend)
        paths[backend] = path
    test = data_dir / "test.datumfile"
    if not test.exists():
        convert_idx(IDX_DIR / "t10k-images-idx3-ubyte.gz", IDX_DIR / "t10k-labels-idx1-ubyte.gz", str(test),
                    "datumfile")
    return paths


def read_rate(path, backend, batches):
    """Records/s of record_batches (read, parse, stack, transform) called in this thread."""
    from pycaffe_dist.data import sources
    from pycaffe_dist.data.batches import record_batches
    from pycaffe_dist.data.transform import DataTransformer
    from pycaffe_dist.proto import caffe_pb2
    param = caffe_pb2.TransformationParameter(scale=0.00390625)
    with sources.open_records(str(path), backend) as source:
        make_batch = record_batches(source, BATCH, DataTransformer(param, caffe_pb2.TRAIN), str(path))
        make_batch()                                   # opens the store, builds the datumfile index if needed
        start = time.perf_counter()
        for _ in range(batches):
            make_batch()
        return batches * BATCH / (time.perf_counter() - start)


def training_wait(data_dir, steps):
    """(ms per step, ms waited for data per step) over `steps` LeNet steps after a warm-up."""
    from pycaffe_dist import common
    from pycaffe_dist.io.load import read_net, read_solver
    from pycaffe_dist.solver.solver import Solver
    common.set_num_threads(1)
    net = read_net(str(ROOT / "prototxt" / "lenet_train_test.prototxt"))
    for layer in net.layer:
        if layer.type == "Data":
            name = "train.datumfile" if "train" in layer.data_param.source else "test.datumfile"
            layer.data_param.source = str(data_dir / name)
    solver_param = read_solver(str(ROOT / "prototxt" / "lenet_solver.prototxt"))
    solver_param.ClearField("net")
    solver_param.net_param.CopyFrom(net)
    solver_param.test_interval = 10 ** 9
    solver_param.test_initialization = False
    solver_param.display = 0
    solver_param.snapshot = 0
    solver_param.snapshot_after_train = False
    solver_param.snapshot_prefix = os.path.join(tempfile.mkdtemp(), "lenet")
    solver = Solver(solver_param)
    solver.step(10)
    prefetcher = solver.net.layers[0].prefetcher
    waited = prefetcher.wait_s
    start = time.perf_counter()
    solver.step(steps)
    elapsed = time.perf_counter() - start
    return 1000.0 * elapsed / steps, 1000.0 * (prefetcher.wait_s - waited) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT / "data" / "fashion-mnist"))
    parser.add_argument("--batches", type=int, default=300, help="batches of 64 read per backend")
    parser.add_argument("--steps", type=int, default=200, help="timed LeNet training steps")
    parser.add_argument("--plot", help="also draw the records/s bars into this PNG")
    args = parser.parse_args()
    if not IDX_DIR.exists():
        sys.exit("bench/data.py: %s is missing (apt-get install dataset-fashion-mnist)" % IDX_DIR)
    data_dir = pathlib.Path(args.data_dir).resolve()
    paths = ensure_data(data_dir)
    from pycaffe_dist import common
    common.set_num_threads(1)
    step_ms, wait_ms = training_wait(data_dir, args.steps)
    consume_rate = BATCH * 1000.0 / step_ms
    rates = {backend: read_rate(paths[backend], backend, args.batches) for backend in BACKENDS}
    print("Reading + transforming Fashion-MNIST, batch %d, 1 thread, no prefetch (%d batches each)"
          % (BATCH, args.batches))
    print("%-10s %14s %14s" % ("backend", "records/s", "x step rate"))
    for backend in BACKENDS:
        print("%-10s %14.0f %14.1f" % (backend, rates[backend], rates[backend] / consume_rate))
    print("LeNet training consumes %.0f records/s (%.2f ms per step of %d)" % (consume_rate, step_ms, BATCH))
    share = 100.0 * wait_ms / step_ms
    print("\nLeNet step with prefetch (datumfile, %d steps): waited %.3f ms of %.2f ms per step = %.2f %% "
          "(target < 5 %%: %s)" % (args.steps, wait_ms, step_ms, share, "met" if share < 5 else "NOT met"))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(BACKENDS + ("LeNet step",), [rates[b] for b in BACKENDS] + [consume_rate],
               color=["C0", "C0", "C0", "C1"])
        ax.set_ylabel("records / s (1 thread)")
        ax.set_title("Fashion-MNIST read + transform vs LeNet consumption")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print("wrote %s" % args.plot)


if __name__ == "__main__":
    main()
