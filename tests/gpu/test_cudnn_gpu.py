"""cuDNN as Caffe's `engine: CUDNN` (pycaffe_dist/backend/cudnn.py, pycaffe_dist/layers/cudnn_engine.py).

On any machine: the loader's one-line errors (here there is no libcudnn, and the tests make sure of it), the
bindings' struct layout and algorithm choice, which engine runs (DEFAULT is CAFFE on the emulated device, the one
warning, CAFFE honoured, the fall-back where cuDNN is missing), and which layer settings go to cuDNN at all.

On a real GPU with cuDNN (skipped, with the reason, elsewhere): each layer with engine CUDNN against the same
layer with engine CAFFE (our CUDA kernels), forward and backward, on the same inputs, parameters, top diffs and
starting parameter diffs (both accumulate into them). cuDNN sums in other orders (IEEE float32 all the same: FMA
math, no TF32; no FFT or Winograd transforms, which tests/gpu/conftest.py turns off), so the results agree to rtol
1e-4 with an atol of 1e-4 for convolutions (sums of up to 400 products, outputs of order 1 to 10) and 1e-5 for the
other layers. With transforms allowed (the default), convolutions agree to 1e-3 of the output's largest magnitude.
"""
import ctypes
import inspect
import logging
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.backend import cudnn, select
from pycaffe_dist.backend.emulated import EmulatedDevice
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.errors import DeviceError
from pycaffe_dist.layers import create_layer, cudnn_engine
from pycaffe_dist.proto import caffe_pb2
from tests.gpu.conftest import cuda_device
from tests.layers.gradient_checker import layer_param

TRAIN = caffe_pb2.TRAIN
RNG = np.random.default_rng(2024)
CONV_TOL = dict(rtol=1e-4, atol=1e-4)
TRANSFORM_ERROR = 1e-3      # FFT and Winograd: of the largest magnitude (a wrong result is off by about all of it)
TOL = dict(rtol=1e-4, atol=1e-5)


def data(*shape, scale=1.0):
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


@pytest.fixture
def fresh_loader(monkeypatch):
    """cudnn.load() looks again in this test, whatever PCD_CUDNN the run has; the process's library (or its
    absence) comes back afterwards."""
    monkeypatch.delenv(cudnn.DISABLE_VARIABLE, raising=False)
    saved = dict(cudnn._library)
    cudnn.forget()
    yield
    cudnn.forget()
    cudnn._library.update(saved)


@pytest.fixture
def warnings_seen():
    """The warnings of layers/cudnn_engine.py in this test (the once-per-process one given afresh)."""
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    handler = Keep(logging.WARNING)
    cudnn_engine.log.addHandler(handler)
    cudnn_engine.forget()
    yield seen
    cudnn_engine.log.removeHandler(handler)
    cudnn_engine.forget()


@pytest.fixture
def emulated():
    previous = common.mode()
    dev = select.use(EmulatedDevice())
    common.set_mode_gpu()
    yield dev
    if previous == "cpu":
        common.set_mode_cpu()
    select.forget()


# --- the loader and the bindings (any machine) ------------------------------------------------------------------

def test_missing_library_is_one_line_naming_what_was_tried(fresh_loader, monkeypatch):
    monkeypatch.setattr(cudnn, "library_candidates", lambda: iter(["/nowhere/libcudnn.so.9"]))
    with pytest.raises(DeviceError) as caught:
        cudnn.load()
    message = str(caught.value)
    assert "\n" not in message and "/nowhere/libcudnn.so.9" in message and "nvidia-cudnn" in message
    with pytest.raises(DeviceError):     # asked once: the same error again
        cudnn.load()


def test_no_candidate_at_all_says_where_it_looked(fresh_loader, monkeypatch):
    monkeypatch.setattr(cudnn, "library_candidates", lambda: iter([]))
    with pytest.raises(DeviceError, match="nvidia/cudnn/lib.*find_library.*lib64") as caught:
        cudnn.load()
    assert "\n" not in str(caught.value)
    assert cudnn.describe().startswith("not available: cuDNN cannot be loaded")


def test_pcd_cudnn_0_turns_it_off(fresh_loader, monkeypatch):
    monkeypatch.setenv(cudnn.DISABLE_VARIABLE, "0")
    monkeypatch.setattr(cudnn, "library_candidates", lambda: pytest.fail("looked for a library"))
    with pytest.raises(DeviceError, match="turned off"):
        cudnn.load()


def test_version_numbers_of_both_encodings():
    assert cudnn.version_tuple(90100) == (9, 1, 0)
    assert cudnn.version_tuple(91402) == (9, 14, 2)
    assert cudnn.version_tuple(8902) == (8, 9, 2)


def test_algo_perf_layout_is_the_headers():
    # enum algo, enum status, float time, (4 bytes of padding), size_t memory, enum determinism, enum mathType,
    # int reserved[3]: 48 bytes on LP64
    assert ctypes.sizeof(cudnn.AlgoPerf) == 48
    assert [getattr(cudnn.AlgoPerf, f).offset for f in ("algo", "status", "time", "memory", "determinism",
                                                          "mathType", "reserved")] == [0, 4, 8, 16, 24, 28, 32]


def perf(algo, status=0, memory=0, math=cudnn.CUDNN_FMA_MATH, time=1.0):
    return cudnn.AlgoPerf(algo=algo, status=status, time=time, memory=memory, mathType=math)


def test_the_fastest_algorithm_that_ran_fits_and_is_ieee_is_chosen():
    limit = cudnn.WORKSPACE_LIMIT_BYTES
    results = [perf(7, status=3000), perf(6, memory=limit + 1), perf(5, math=cudnn.CUDNN_TENSOR_OP_MATH),
               perf(4, memory=1024), perf(1)]
    assert cudnn.choose_algorithm(results) == (4, 1024)
    assert cudnn.choose_algorithm([perf(2, math=cudnn.CUDNN_DEFAULT_MATH)]) == (2, 0)
    assert cudnn.choose_algorithm([perf(0, status=2000)]) is None
    # FFT and Winograd are left out where PCD_CUDNN_TRANSFORMS=0 (backend/cudnn.py): margin None
    forward = cudnn.TRANSFORM_ALGORITHMS["forward"]
    assert cudnn.choose_algorithm([perf(4), perf(6), perf(1)], transforms=forward, margin_ms=None) == (1, 0)
    assert cudnn.choose_algorithm([perf(4), perf(6)], transforms=forward, margin_ms=None) is None


def test_a_transform_is_taken_only_where_it_saves_more_than_the_margin():
    """Find's times are the GPU's alone; a transform's extra launches cost the host (backend/cudnn.py)."""
    forward = cudnn.TRANSFORM_ALGORITHMS["forward"]

    def chosen(transform_ms, direct_ms, margin_ms=0.025):
        results = sorted([perf(5, time=transform_ms, memory=64), perf(6, time=transform_ms + 0.001, memory=32),
                          perf(7, time=direct_ms, memory=128, math=cudnn.CUDNN_TENSOR_OP_MATH),  # TF32: never
                          perf(1, time=direct_ms, memory=8), perf(0, time=direct_ms + 0.5)], key=lambda p: p.time)
        return cudnn.choose_algorithm(results, transforms=forward, margin_ms=margin_ms)[0]
    assert chosen(0.100, 0.400) == 5           # saves 0.3 ms: taken
    assert chosen(0.100, 0.120) == 1           # saves 20 us of GPU time: the direct algorithm, one launch
    assert chosen(0.100, 0.125) == 1           # exactly the margin is not more than it
    assert chosen(0.100, 0.126) == 5
    assert chosen(0.100, 0.120, margin_ms=0.0) == 5     # PCD_CUDNN_TRANSFORMS=all
    assert chosen(0.100, 0.400, margin_ms=None) == 1    # =0
    assert chosen(0.500, 0.400) == 1           # slower: never
    # With nothing else usable, a transform is what there is (never where they are left out)
    only = [perf(5, time=0.1), perf(1, status=3000, time=0.05)]
    assert cudnn.choose_algorithm(only, transforms=forward, margin_ms=0.025) == (5, 0)
    assert cudnn.choose_algorithm(only, transforms=forward, margin_ms=None) is None


def test_transform_algorithms_are_allowed_unless_turned_off(monkeypatch):
    monkeypatch.delenv(cudnn.TRANSFORMS_VARIABLE, raising=False)
    assert cudnn.transforms_allowed() and cudnn.transform_margin_ms() == cudnn.TRANSFORM_MARGIN_MS
    monkeypatch.setenv(cudnn.TRANSFORMS_VARIABLE, "1")
    assert cudnn.transforms_allowed() and cudnn.transform_margin_ms() == cudnn.TRANSFORM_MARGIN_MS
    monkeypatch.setenv(cudnn.TRANSFORMS_VARIABLE, "All")
    assert cudnn.transforms_allowed() and cudnn.transform_margin_ms() == 0.0
    monkeypatch.setenv(cudnn.TRANSFORMS_VARIABLE, "0")
    assert not cudnn.transforms_allowed() and cudnn.transform_margin_ms() is None


def test_every_binding_has_a_signature():
    """The calls backend/cudnn.py makes are all typed (a wrong argument then fails in Python, not in cuDNN)."""
    source = inspect.getsource(cudnn)
    called = set(re.findall(r'"(cudnn[A-Z]\w+)"', source)) - {"cudnnCreate%sDescriptor", "cudnnDestroy%sDescriptor"}
    assert called <= set(cudnn._SIGNATURES)


# --- which engine runs (any machine) ------------------------------------------------------------------------

def relu_layer(engine="DEFAULT", name="relu"):
    layer = create_layer(layer_param('name: "%s" type: "ReLU" relu_param { engine: %s }' % (name, engine)), TRAIN)
    x = Blob((2, 3))
    layer.setup([x], [Blob()])
    return layer


def test_default_is_caffe_on_the_emulated_device_without_a_word(emulated, warnings_seen, monkeypatch):
    monkeypatch.setattr(cudnn, "load", lambda: pytest.fail("DEFAULT looked for cuDNN on the emulated device"))
    assert cudnn_engine.context(relu_layer(), cudnn_engine.DEFAULT) is None
    assert warnings_seen == []


def test_caffe_is_honoured_and_never_loads_cudnn(emulated, warnings_seen, monkeypatch):
    monkeypatch.setattr(cudnn_engine, "is_cuda_device", lambda dev: True)
    monkeypatch.setattr(cudnn, "for_device", lambda dev: pytest.fail("engine CAFFE asked for cuDNN"))
    assert cudnn_engine.context(relu_layer("CAFFE"), cudnn_engine.CAFFE) is None
    assert warnings_seen == []


def test_explicit_cudnn_on_the_emulated_device_warns_once(emulated, warnings_seen):
    assert cudnn_engine.context(relu_layer("CUDNN", "first"), cudnn_engine.CUDNN) is None
    assert cudnn_engine.context(relu_layer("CUDNN", "second"), cudnn_engine.CUDNN) is None
    assert len(warnings_seen) == 1
    assert "'first'" in warnings_seen[0] and "engine CUDNN is asked for" in warnings_seen[0]
    assert "emulated" in warnings_seen[0] and "engine CAFFE" in warnings_seen[0]


def test_default_on_a_gpu_without_cudnn_warns_once_and_runs_ours(emulated, warnings_seen, monkeypatch,
                                                                  fresh_loader):
    """A real GPU (as far as the engine can tell) where libcudnn is missing: our kernels, and one warning why."""
    monkeypatch.setattr(cudnn_engine, "is_cuda_device", lambda dev: True)
    monkeypatch.setattr(cudnn, "library_candidates", lambda: iter([]))
    emulated.stream.handle = 0      # for_device opens a handle on the device's stream: the load fails first
    layers = [relu_layer(name="r%d" % i) for i in range(3)]
    assert all(cudnn_engine.context(layer, cudnn_engine.DEFAULT) is None for layer in layers)
    assert len(warnings_seen) == 1
    assert "engine DEFAULT means CUDNN" in warnings_seen[0] and "cuDNN cannot be loaded" in warnings_seen[0]


def test_pcd_cudnn_0_on_a_gpu_falls_back_with_the_reason(emulated, warnings_seen, monkeypatch, fresh_loader):
    monkeypatch.setattr(cudnn_engine, "is_cuda_device", lambda dev: True)
    monkeypatch.setenv(cudnn.DISABLE_VARIABLE, "0")
    emulated.stream.handle = 0
    assert cudnn_engine.context(relu_layer("CUDNN"), cudnn_engine.CUDNN) is None
    assert len(warnings_seen) == 1 and "PCD_CUDNN=0" in warnings_seen[0]


def test_explicit_cudnn_layers_compute_with_our_kernels_where_there_is_none(emulated, warnings_seen):
    """The fall-back is the CAFFE engine's code: the same numbers."""
    x = data(2, 4, 6, 6)
    texts = {
        "conv": 'type: "Convolution" convolution_param { engine: ENGINE num_output: 3 kernel_size: 3 pad: 1 '
                'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 } }',
        "pool": 'type: "Pooling" pooling_param { engine: ENGINE pool: AVE kernel_size: 2 stride: 2 }',
        "lrn": 'type: "LRN" lrn_param { engine: ENGINE local_size: 3 alpha: 0.5 beta: 0.75 }',
        "softmax": 'type: "Softmax" softmax_param { engine: ENGINE }',
        "tanh": 'type: "TanH" tanh_param { engine: ENGINE }',
    }
    for what, text in texts.items():
        want = run_layer(text, [x], "CAFFE")[1]
        got = run_layer(text, [x], "CUDNN", params=want["params"])[1]
        for key in want:
            if key != "params":
                np.testing.assert_array_equal(got[key], want[key], err_msg="%s %s" % (what, key))
    assert len(warnings_seen) == 1


def test_cpu_mode_never_asks(warnings_seen, monkeypatch):
    monkeypatch.setattr(cudnn_engine, "context", lambda *a: pytest.fail("the CPU code asked for an engine"))
    layer = relu_layer("CUDNN")
    bottom, top = [Blob((2, 3))], [Blob()]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert warnings_seen == []


# --- which settings go to cuDNN (any machine: a stand-in context and ops) -------------------------------------

class StandIn:
    """Records the op made for a layer (its constructor's arguments) instead of calling cuDNN."""

    def __init__(self, *args):
        self.args = args
        if len(args) == 6 and isinstance(args[2], tuple) and len(args[2]) == 4:   # ConvolutionOp's
            _, x, w, pad, stride, _ = args
            self.y_shape = (x[0], w[0]) + tuple((s + 2 * p - k) // st + 1 for s, k, p, st in
                                                zip(x[2:], w[2:], pad, stride))


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(cudnn_engine, "context", lambda layer, engine: None if engine == cudnn_engine.CAFFE
                        else "cudnn")
    for name in ("ConvolutionOp", "PoolingOp", "LRNOp", "SoftmaxOp", "ActivationOp"):
        monkeypatch.setattr(cudnn, name, StandIn)


def set_up(text, *shapes, num_tops=1):
    layer = create_layer(layer_param(text), TRAIN)
    bottom, top = [Blob(s) for s in shapes], [Blob() for _ in range(num_tops)]
    layer.setup(bottom, top)
    return layer, bottom, top


def conv(extra, shape, kind="Convolution", num_output=4):
    layer, _, _ = set_up('type: "%s" convolution_param { num_output: %d %s }' % (kind, num_output, extra), shape)
    return cudnn_engine.convolution_op(layer)


def test_convolutions_that_go_to_cudnn(stand_in):
    op = conv("kernel_size: 3 stride: 2 pad: 1 group: 2", (2, 4, 7, 6))
    assert op.args[1:] == ((2, 4, 7, 6), (4, 2, 3, 3), (1, 1), (2, 2), 2)
    # a deconvolution is the convolution from its top (x) to its bottom (y), W (channels, num_output / group, k)
    op = conv("kernel_size: 4 stride: 2 pad: 1 group: 2", (2, 6, 3, 5), kind="Deconvolution", num_output=4)
    assert op.args[1:] == ((2, 4, 6, 10), (6, 2, 4, 4), (1, 1), (2, 2), 2)
    assert conv("kernel_size: 3 engine: CAFFE", (1, 2, 5, 5)) is None
    assert conv("kernel_size: 3 dilation: 2", (1, 2, 7, 7)) is None         # Caffe: CAFFE (LOG(FATAL) with CUDNN)
    assert conv("kernel_size: 3 dilation: 0", (1, 2, 5, 5)) is None
    assert conv("kernel_size: 2", (1, 2, 4, 4, 4)) is None                   # 3-D
    assert conv("kernel_size: 2 axis: 2", (2, 1, 2, 4, 4)) is None
    assert conv("kernel_size: 1", (1, 2)) is None                            # no spatial axis


def pool(extra, shape, num_tops=1):
    layer, bottom, top = set_up('type: "Pooling" pooling_param { %s }' % extra, shape, num_tops=num_tops)
    return cudnn_engine.pooling_op(layer, bottom, top)


def test_pooling_that_goes_to_cudnn(stand_in):
    op = pool("pool: AVE kernel_size: 3 stride: 2 pad: 1", (2, 3, 7, 7))
    assert op.args[1:] == (cudnn.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, (2, 3, 7, 7), (4, 4), (3, 3),
                           (1, 1), (2, 2))
    assert pool("pool: AVE global_pooling: true", (2, 3, 4, 5)) is not None
    assert pool("pool: AVE kernel_size: 2 stride: 2 round_mode: FLOOR", (1, 2, 5, 5)) is not None
    assert pool("pool: AVE kernel_size: 3 stride: 2", (2, 3, 6, 6)) is None        # CEIL: a clipped last window
    assert pool("pool: MAX kernel_size: 2 stride: 2", (2, 3, 6, 6)) is None        # Caffe's factory: CAFFE
    assert pool("pool: MAX kernel_size: 2 stride: 2", (2, 3, 6, 6), num_tops=2) is None
    assert pool("pool: STOCHASTIC kernel_size: 2 stride: 2", (2, 3, 6, 6)) is None
    assert pool("pool: AVE kernel_size: 2 stride: 2 engine: CAFFE", (2, 3, 6, 6)) is None


def test_lrn_softmax_and_neurons_that_go_to_cudnn(stand_in):
    def lrn(extra):
        layer, bottom, _ = set_up('type: "LRN" lrn_param { %s }' % extra, (2, 7, 3, 4))
        return cudnn_engine.lrn_op(layer, bottom)
    args = lrn("local_size: 5 alpha: 0.001 beta: 0.75 k: 2").args
    assert args[1:3] == ((2, 7, 3, 4), 5) and np.allclose(args[3:], (0.001, 0.75, 2.0))   # float fields
    assert lrn("local_size: 17") is None                                     # > CUDNN_LRN_MAX_N: Caffe's own
    assert lrn("norm_region: WITHIN_CHANNEL") is None                       # CuDNNLCNLayer: not bound
    assert lrn("k: 0") is None                                              # cuDNN's k >= 1e-5
    assert lrn("beta: 0") is None                                           # cuDNN's beta >= 0.01

    layer, bottom, _ = set_up('type: "Softmax" softmax_param { axis: 2 }', (2, 3, 4, 5))
    assert cudnn_engine.softmax_op(layer, bottom[0]).args[1:] == (6, 4, 5)

    for kind, mode in (("ReLU", cudnn.CUDNN_ACTIVATION_RELU), ("Sigmoid", cudnn.CUDNN_ACTIVATION_SIGMOID),
                       ("TanH", cudnn.CUDNN_ACTIVATION_TANH)):
        layer, bottom, _ = set_up('type: "%s"' % kind, (2, 3, 4))
        assert cudnn_engine.activation_op(layer, bottom[0]).args[1:] == (mode, (2, 3, 4))
    layer, bottom, _ = set_up('type: "ReLU" relu_param { negative_slope: 0.1 }', (2, 3))
    assert cudnn_engine.activation_op(layer, bottom[0]) is None                # CuDNNReLULayer runs ReLULayer's


# --- cuDNN against our kernels: on a real GPU, and (any machine with a C compiler) the stand-in library -----------

def real_gpu_present():
    try:
        from pycaffe_dist.backend.cuda import device_count
        return device_count() > 0
    except DeviceError:
        return False


@pytest.fixture(scope="session")
def stub_library(tmp_path_factory):
    """tests/gpu/cudnn_stub.c built as a libcudnn.so.9: cuDNN's prototypes, naive host arithmetic, strict checks."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the stand-in libcudnn")
    path = tmp_path_factory.mktemp("cudnn_stub") / "libcudnn.so.9"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-std=c99", "-o", str(path),
                    str(pathlib.Path(__file__).with_name("cudnn_stub.c")), "-lm"], check=True)
    return str(path)


@pytest.fixture(params=["stub", "cuda"])
def gpu_with_cudnn(request, monkeypatch):
    """The device whose layers run cuDNN: the real GPU with the real cuDNN (skipped without either), or the emulated
    device with the stand-in library (skipped on a machine with a GPU: its symbols must not meet the real ones)."""
    if request.param == "cuda":
        dev = cuda_device()      # skips without a GPU
        try:
            cudnn.for_device(dev)
        except DeviceError as exc:
            pytest.skip("no cuDNN: %s" % exc)
    else:
        if real_gpu_present():
            pytest.skip("a GPU is here: the real cuDNN is tested instead of the stand-in")
        path = request.getfixturevalue("stub_library")
        request.getfixturevalue("fresh_loader")
        monkeypatch.setattr(cudnn, "library_candidates", lambda: iter([path]))
        monkeypatch.setattr(cudnn_engine, "is_cuda_device", lambda dev: True)
        dev = EmulatedDevice()
        dev.stream.handle = 0
    previous = common.mode()
    select.use(dev)
    common.set_mode_gpu()
    yield dev
    if previous == "cpu":
        common.set_mode_cpu()
    select.forget()


def run_layer(text, bottoms, engine, params=None, num_tops=1, in_place=False, seed=7):
    """forward_gpu and backward_gpu of the layer of `text` (its ENGINE replaced) on copies of `bottoms`; random
    top diffs and starting parameter diffs from `seed`, bottom diffs starting as garbage. Returns (layer, results);
    results["params"] are the parameters used (pass them to the other engine's run)."""
    draws = np.random.default_rng(seed)
    bottom = []
    for x in bottoms:
        blob = Blob(x.shape)
        blob.data[...] = x
        blob.diff[...] = 7.0
        bottom.append(blob)
    top = bottom[:1] if in_place else [Blob() for _ in range(num_tops)]
    layer = create_layer(layer_param(text.replace("ENGINE", engine)), TRAIN)
    layer.setup(bottom, top)
    for blob, value in zip(layer.blobs, params or []):
        blob.data[...] = value
    out = {"params": [blob.data.copy() for blob in layer.blobs]}
    layer.reshape(bottom, top)
    layer.forward_gpu(bottom, top)
    for i, t in enumerate(top):
        out["top %d" % i] = t.data.copy()
        t.diff[...] = draws.standard_normal(t.shape).astype(np.float32)
    for i, blob in enumerate(layer.blobs):
        blob.diff[...] = draws.standard_normal(blob.shape).astype(np.float32)
    layer.backward_gpu(top, [True] * len(bottom), bottom)
    for i, b in enumerate(bottom):
        out["bottom diff %d" % i] = b.diff.copy()
    for i, blob in enumerate(layer.blobs):
        out["param diff %d" % i] = blob.diff.copy()
    return layer, out


def compare_engines(text, bottoms, tol=TOL, of_largest=None, **kwargs):
    """The layer with engine CUDNN (which must run cuDNN) against engine CAFFE (our kernels); with `of_largest`,
    each result agrees to that fraction of its largest magnitude instead of `tol`."""
    ours, want = run_layer(text, bottoms, "CAFFE", **kwargs)
    theirs, got = run_layer(text, bottoms, "CUDNN", params=want["params"], **kwargs)
    assert "_cudnn_op" in theirs.__dict__, "engine CUDNN did not run cuDNN"
    assert "_cudnn_op" not in ours.__dict__, "engine CAFFE ran cuDNN"
    for key in want:
        if key != "params":
            if of_largest is not None:
                tol = dict(rtol=0, atol=of_largest * float(np.abs(want[key]).max()))
            np.testing.assert_allclose(got[key], want[key], err_msg="%s: %s" % (text, key), **tol)
    return theirs


def conv_text(extra, kind="Convolution", num_output=4):
    return ('type: "%s" convolution_param { engine: ENGINE num_output: %d %s weight_filler { type: "gaussian" '
            'std: 0.5 } bias_filler { type: "gaussian" std: 0.5 } }' % (kind, num_output, extra))


CONV_CASES = [
    ("kernel_size: 3 stride: 2", (2, 3, 6, 5), 4),
    ("kernel_size: 3 stride: 2 pad: 1 group: 2", (2, 4, 5, 5), 4),
    ("kernel_size: 1", (3, 3, 4, 3), 4),
    ("kernel_size: 1 stride: 2", (2, 3, 5, 4), 4),
    ("kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0 bias_term: false", (1, 2, 5, 6), 4),
    ("kernel_size: 3 group: 4", (2, 4, 6, 6), 8),                               # depthwise
    ("kernel_size: 5 pad: 2", (4, 16, 14, 14), 32),                             # where FFT / Winograd would win
    ("kernel_size: 3 pad: 1", (8, 32, 16, 16), 64),
]


@pytest.mark.parametrize("extra,shape,num_output", CONV_CASES)
def test_convolution(gpu_with_cudnn, extra, shape, num_output):
    compare_engines(conv_text(extra, num_output=num_output), [data(*shape)], tol=CONV_TOL)


@pytest.mark.parametrize("extra,shape,num_output", CONV_CASES)
def test_convolution_with_transforms_allowed(gpu_with_cudnn, monkeypatch, extra, shape, num_output):
    monkeypatch.delenv(cudnn.TRANSFORMS_VARIABLE)       # the default
    compare_engines(conv_text(extra, num_output=num_output), [data(*shape)], of_largest=TRANSFORM_ERROR)


def test_the_default_takes_a_transform_where_find_puts_it_first(gpu_with_cudnn, monkeypatch):
    """Each geometry and direction is found once per setting of PCD_CUDNN_TRANSFORMS; with =0 no transform is ever
    taken. The stand-in's Find puts a transform first in every direction; a real cuDNN's choice depends on it."""
    text = conv_text("kernel_size: 5 pad: 2", num_output=32)
    layer, _ = run_layer(text, [data(4, 16, 14, 14)], "CUDNN")
    geometry = layer._cudnn_op[1].geometry
    ctx = cudnn.for_device(gpu_with_cudnn)
    monkeypatch.delenv(cudnn.TRANSFORMS_VARIABLE)
    run_layer(text, [data(4, 16, 14, 14)], "CUDNN")
    chosen = {(key[0], key[2] is not None): algo for key, (algo, _) in ctx.algorithms.items() if key[1] == geometry}
    assert set(chosen) == {(d, t) for d in ("forward", "data", "filter") for t in (False, True)}
    for direction in ("forward", "data", "filter"):
        assert chosen[direction, False] not in cudnn.TRANSFORM_ALGORITHMS[direction]
        if gpu_with_cudnn.name.startswith("emulated"):      # the stand-in's transform saves 0.1 ms
            assert chosen[direction, True] in cudnn.TRANSFORM_ALGORITHMS[direction]


def test_convolution_of_two_bottoms(gpu_with_cudnn):
    compare_engines(conv_text("kernel_size: 3 pad: 1"), [data(2, 3, 5, 5), data(2, 3, 5, 5)], num_tops=2,
                    tol=CONV_TOL)


@pytest.mark.parametrize("extra,shape", [("kernel_size: 3 stride: 2", (2, 3, 3, 3)),
                                         ("kernel_size: 4 stride: 2 pad: 1 group: 2", (2, 4, 3, 2)),
                                         ("kernel_size: 1 bias_term: false", (2, 3, 2, 3))])
def test_deconvolution(gpu_with_cudnn, extra, shape):
    compare_engines(conv_text(extra, kind="Deconvolution"), [data(*shape)], tol=CONV_TOL)


def test_default_is_cudnn_on_a_gpu_and_finds_each_direction_once(gpu_with_cudnn):
    text = conv_text("kernel_size: 3 pad: 1").replace("engine: ENGINE ", "")
    first, _ = run_layer(text, [data(2, 3, 5, 5)], "")
    assert "_cudnn_op" in first.__dict__, "DEFAULT did not mean CUDNN on a GPU"
    op = first._cudnn_op[1]
    ctx = cudnn.for_device(gpu_with_cudnn)
    found = {key for key in ctx.algorithms if key[1] == op.geometry}
    assert {key[0] for key in found} == {"forward", "data", "filter"}
    before = len(ctx.algorithms)
    run_layer(text, [data(2, 3, 5, 5)], "")          # same geometry: found already
    assert len(ctx.algorithms) == before
    math = ctypes.c_int(-1)
    ctx.call("cudnnGetConvolutionMathType", op.conv, ctypes.byref(math), with_handle=False)
    assert math.value == cudnn.CUDNN_FMA_MATH, "float32 convolutions must not run on TF32 tensor cores"


def test_default_sends_only_the_listed_types_to_cudnn(gpu_with_cudnn, monkeypatch):
    """PCD_CUDNN_LAYERS=Convolution: a DEFAULT convolution still runs cuDNN, a DEFAULT ReLU our kernel; an
    explicit CUDNN is kept."""
    monkeypatch.setenv(cudnn_engine.LAYERS_VARIABLE, " Convolution , Deconvolution")
    conv, _ = run_layer(conv_text("kernel_size: 3 pad: 1").replace("engine: ENGINE ", ""), [data(2, 3, 5, 5)], "")
    assert "_cudnn_op" in conv.__dict__
    relu_text = 'type: "ReLU" relu_param { engine: ENGINE }'
    relu, _ = run_layer(relu_text.replace("engine: ENGINE ", ""), [data(2, 3, 4)], "")
    assert "_cudnn_op" not in relu.__dict__, "DEFAULT meant cuDNN for a type PCD_CUDNN_LAYERS leaves out"
    relu, _ = run_layer(relu_text, [data(2, 3, 4)], "CUDNN")
    assert "_cudnn_op" in relu.__dict__
    assert cudnn_engine.default_takes_cudnn("Convolution") and not cudnn_engine.default_takes_cudnn("Pooling")
    monkeypatch.delenv(cudnn_engine.LAYERS_VARIABLE)
    assert cudnn_engine.default_takes_cudnn("Pooling")


POOL_CASES = [
    ("kernel_size: 3 stride: 2 pad: 1", (2, 3, 7, 7)),
    ("kernel_size: 2 stride: 2", (2, 3, 6, 6)),
    ("kernel_size: 3 stride: 1 pad: 1", (1, 2, 5, 6)),
    ("kernel_h: 2 kernel_w: 4 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 1", (2, 2, 5, 8)),
    ("global_pooling: true", (2, 3, 4, 5)),
]


@pytest.mark.parametrize("extra,shape", POOL_CASES)
def test_ave_pooling(gpu_with_cudnn, extra, shape):
    compare_engines('type: "Pooling" pooling_param { engine: ENGINE pool: AVE %s }' % extra, [data(*shape)])


@pytest.mark.parametrize("size,alpha,beta,k", [(5, 1e-4, 0.75, 1.0), (3, 0.5, 0.5, 2.0), (5, 1.0, 0.75, 1.0),
                                               (1, 2.0, 1.5, 1.0), (15, 1.0, 0.75, 1.0)])
def test_lrn(gpu_with_cudnn, size, alpha, beta, k):
    compare_engines('type: "LRN" lrn_param { engine: ENGINE local_size: %d alpha: %g beta: %g k: %g }'
                    % (size, alpha, beta, k), [data(2, 7, 4, 5)])


@pytest.mark.parametrize("shape,axis", [((2, 5, 3, 4), 1), ((2, 5, 3, 4), 2), ((6, 10), 1), ((4, 3, 2), 0)])
def test_softmax(gpu_with_cudnn, shape, axis):
    compare_engines('type: "Softmax" softmax_param { engine: ENGINE axis: %d }' % axis, [data(*shape, scale=3.0)])


def test_softmax_in_place(gpu_with_cudnn):
    compare_engines('type: "Softmax" softmax_param { engine: ENGINE }', [data(2, 5, 3, 4, scale=3.0)],
                    in_place=True)


@pytest.mark.parametrize("kind,field", [("ReLU", "relu_param"), ("Sigmoid", "sigmoid_param"),
                                        ("TanH", "tanh_param")])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 8, 17, 13), (7,)])
@pytest.mark.parametrize("in_place", [False, True])
def test_neurons(gpu_with_cudnn, kind, field, shape, in_place):
    compare_engines('type: "%s" %s { engine: ENGINE }' % (kind, field), [data(*shape, scale=2.0)],
                    in_place=in_place)


def test_device_query_names_cudnn(gpu_with_cudnn):
    dev = gpu_with_cudnn
    line = cudnn.describe() if isinstance(dev, EmulatedDevice) else dev.describe()["cuDNN"]
    assert line.split(".")[0].isdigit() and int(line.split(".")[0]) >= 8, line
