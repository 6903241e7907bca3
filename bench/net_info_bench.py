"""How long `dist_caffe net-info` takes on deep zoo deploy nets (target: ResNet-152, 670 layers, under 1 s).

Prints a table per net: parse, parse + upgrade, graph build (setup + shape inference of every layer) and the table's
formatting, with each stage's ratio to the reference measured in the same run: protobuf's own text parse of the
same file, the least any prototxt tool must spend.

    python bench/net_info_bench.py [--repeat 5]
"""
import argparse
import logging
import pathlib
import statistics
import subprocess
import sys
import time

from google.protobuf import text_format

from pycaffe_dist.io.load import upgrade_net_with_notice
from pycaffe_dist.io.prototxt import read_text
from pycaffe_dist.net.info import format_table
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2

ZOO = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "zoo"
NETS = ["KaimingHe_deep-residual-networks/prototxt/ResNet-152-deploy.prototxt",
        "KaimingHe_deep-residual-networks/prototxt/ResNet-50-deploy.prototxt",
        "bvlc/models/bvlc_googlenet/deploy.prototxt"]


def timed(fn, repeat):
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def bench(path, repeat):
    text = path.read_text()
    ref, _ = timed(lambda: text_format.Parse(text, caffe_pb2.NetParameter()), repeat)
    parse, _ = timed(lambda: read_text(path, caffe_pb2.NetParameter()), repeat)

    def upgraded():
        net = read_text(path, caffe_pb2.NetParameter())
        upgrade_net_with_notice(net, str(path))
        return net
    upgrade_total, param = timed(upgraded, repeat)
    build, net = timed(lambda: Net(param, phase=caffe_pb2.TEST, fill_params=False), repeat)
    table, _ = timed(lambda: format_table(net), repeat)
    cli_start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pycaffe_dist", "net-info", str(path)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli = time.perf_counter() - cli_start
    return len(net.layers), [("protobuf text parse (reference)", ref), ("parse (read_text)", parse),
                             ("parse + upgrade", upgrade_total), ("build Net + shapes", build),
                             ("format table", table), ("in-process total", upgrade_total + build + table),
                             ("CLI process, end to end", cli)], ref


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    logging.getLogger("pycaffe_dist").setLevel(logging.ERROR)   # the zoo deploys' upgrade notices, once per run
    for rel in NETS:
        layers, rows, ref = bench(ZOO / rel, args.repeat)
        print("\n%s (%d layers after splits), median of %d" % (rel, layers, args.repeat))
        print("%-34s %10s %12s" % ("stage", "seconds", "x reference"))
        for name, seconds in rows:
            print("%-34s %10.4f %12.2f" % (name, seconds, seconds / ref))


if __name__ == "__main__":
    main()
