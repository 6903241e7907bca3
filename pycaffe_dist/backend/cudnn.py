"""cuDNN through ctypes, for Caffe's `engine: CUDNN` layers (layers/cudnn_engine.py chooses where it runs).

Only the legacy (v7-style) API, which cuDNN 9 still ships in libcudnn_ops / libcudnn_cnn behind the libcudnn.so.9
shim: tensor, filter, convolution, pooling, LRN and activation descriptors; cudnnFindConvolution*Algorithm and the
convolution, bias, pooling, LRN, softmax and activation calls. Every signature, enum value and the layout of the
cudnnConvolution*AlgoPerf_t structs are cuDNN 9's (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h), cross-checked against
CuPy's and cudarc's bindings; `_SIGNATURES` declares them all, so that a wrong argument fails in Python.

- Numbers: float32 NCHW tensors, IEEE arithmetic: every convolution descriptor is CUDNN_FMA_MATH, because
  CUDNN_DEFAULT_MATH lets cuDNN run float32 convolutions on TF32 tensor cores (10-bit mantissas) from Ampere on.
- The handle runs on the device's compute stream, in pycuda's primary context (current on the thread, as for
  cuBLAS). Workspaces come from the device's caching allocator, at most WORKSPACE_LIMIT_BYTES per call.
- Convolution algorithms: cudnnFindConvolution*Algorithm (which times them, with memory of its own) once per
  geometry and direction; the fastest that succeeded within the workspace limit, in IEEE float32 math, is kept.
  That includes the FFT and Winograd algorithms, which transform the inputs and lose some float32 accuracy (errors
  of about 1e-5 of the output's magnitude, where GEMM-like and direct algorithms differ from Caffe's kernels by
  summation order only), as Caffe's own cuDNN engine and PyTorch take them where cuDNN prefers them. They halve
  AlexNet's iteration on an H200 (bench/nets.py --gpu: 13.1 ms against 25.9). A transform is taken only where Find
  times it faster than the fastest other algorithm by more than TRANSFORM_MARGIN_MS: Find times the GPU alone, and
  a transform is several launches (transform the inputs, multiply, transform back) where a direct algorithm is one,
  each with its cost on the host, which sets the pace of a net of small convolutions (CIFAR-10 quick's step is a
  few dozen calls). PCD_CUDNN_TRANSFORMS=0 leaves them out, for results closest to the CPU's; =all takes whatever
  Find times fastest (no margin).
- Loading: libcudnn.so.9 from the nvidia-cudnn-cu12/-cu13 wheel (nvidia/cudnn/lib), the system's loader path, or
  $CUDA_HOME/lib64. cuDNN 9 dlopens its sub-libraries (graph, engines, ops, cnn, ...) and, from them, cuBLASLt
  and NVRTC: those found beside it or in the nvidia wheels are loaded first (RTLD_GLOBAL, dependencies first).
  PCD_CUDNN=0 turns cuDNN off. Every failure is a DeviceError of one line that says what was tried.
"""
import ctypes
import ctypes.util
import glob
import os

import numpy as np

from ..errors import DeviceError

DISABLE_VARIABLE = "PCD_CUDNN"          # PCD_CUDNN=0: never load cuDNN (the layers run Caffe's kernels)
WORKSPACE_LIMIT_BYTES = 1 << 30         # the most workspace one convolution call may take (Caffe's cuDNN: 8 MiB)
TRANSFORMS_VARIABLE = "PCD_CUDNN_TRANSFORMS"   # =0: no FFT or Winograd convolutions; =all: no margin (see above)
# What a transform must save over the fastest direct algorithm, in Find's GPU milliseconds: the host's cost of the
# extra launches it makes (3 to 5 kernels where a direct algorithm makes 1, a few microseconds each in the driver)
# with room to spare. AlexNet's and GoogLeNet's large transforms save hundreds of microseconds a call and stay.
TRANSFORM_MARGIN_MS = 0.025
MIN_VERSION = (8, 0, 0)                 # CUDNN_FMA_MATH and the v7-style API with group counts exist from 8.0

# --- enums (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h; the same values in cuDNN 8 and 9) ---------------------------
CUDNN_DATA_FLOAT = 0
CUDNN_TENSOR_NCHW = 0
CUDNN_CROSS_CORRELATION = 1             # Caffe's convolution (no kernel flip)
CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, CUDNN_FMA_MATH = 0, 1, 2, 3
CUDNN_NOT_PROPAGATE_NAN, CUDNN_PROPAGATE_NAN = 0, 1
CUDNN_POOLING_MAX, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 0, 1
CUDNN_ACTIVATION_SIGMOID, CUDNN_ACTIVATION_RELU, CUDNN_ACTIVATION_TANH = 0, 1, 2
CUDNN_LRN_CROSS_CHANNEL_DIM1 = 0
CUDNN_SOFTMAX_ACCURATE = 1              # subtracts the maximum first, as Caffe's softmax
CUDNN_SOFTMAX_MODE_CHANNEL = 1          # over C of (N, C, H, W), at every (n, h, w)
CUDNN_STATUS_SUCCESS = 0
# The convolution algorithms that transform their inputs (cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t values):
# forward FFT 4, FFT_TILING 5, WINOGRAD 6, WINOGRAD_NONFUSED 7; backward data FFT 2, FFT_TILING 3, WINOGRAD 4,
# WINOGRAD_NONFUSED 5; backward filter FFT 2, WINOGRAD 4, WINOGRAD_NONFUSED 5, FFT_TILING 6.
TRANSFORM_ALGORITHMS = {"forward": frozenset((4, 5, 6, 7)), "data": frozenset((2, 3, 4, 5)),
                        "filter": frozenset((2, 4, 5, 6))}
# cudnnSetLRNDescriptor's bounds (#defines of cudnn_ops.h)
CUDNN_LRN_MIN_N, CUDNN_LRN_MAX_N, CUDNN_LRN_MIN_K, CUDNN_LRN_MIN_BETA = 1, 16, 1e-5, 0.01


class AlgoPerf(ctypes.Structure):
    """cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionBwdDataAlgoPerf_t and cudnnConvolutionBwdFilterAlgoPerf_t,
    which share one layout: enums are C ints; `memory` is a size_t (after 4 bytes of padding on LP64: 48 bytes)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]


_P, _I, _U, _D, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_double, ctypes.c_size_t
_PI, _PS, _PP, _PERF = (ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_size_t),
                        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(AlgoPerf))

# name: argument types, in the headers' order (H = the handle, D = a descriptor, both pointers). All return a
# cudnnStatus_t (int) except the first two. alpha / beta are pointers to host floats for float tensors.
_SIGNATURES = {
    "cudnnGetVersion": (),                                                    # -> size_t
    "cudnnGetErrorString": (_I,),                                             # -> const char *
    "cudnnCreate": (_PP,),
    "cudnnSetStream": (_P, _P),
    "cudnnCreateTensorDescriptor": (_PP,),
    "cudnnDestroyTensorDescriptor": (_P,),
    "cudnnSetTensor4dDescriptor": (_P, _I, _I, _I, _I, _I, _I),              # D, format, dataType, n, c, h, w
    "cudnnCreateFilterDescriptor": (_PP,),
    "cudnnDestroyFilterDescriptor": (_P,),
    "cudnnSetFilter4dDescriptor": (_P, _I, _I, _I, _I, _I, _I),              # D, dataType, format, k, c, h, w
    "cudnnCreateConvolutionDescriptor": (_PP,),
    "cudnnDestroyConvolutionDescriptor": (_P,),
    # D, pad_h, pad_w, u (stride h), v (stride w), dilation_h, dilation_w, mode, computeType
    "cudnnSetConvolution2dDescriptor": (_P, _I, _I, _I, _I, _I, _I, _I, _I),
    "cudnnSetConvolutionGroupCount": (_P, _I),
    "cudnnSetConvolutionMathType": (_P, _I),
    "cudnnGetConvolutionMathType": (_P, _PI),
    "cudnnGetConvolution2dForwardOutputDim": (_P, _P, _P, _PI, _PI, _PI, _PI),   # conv, x, w -> n, c, h, w
    "cudnnGetConvolutionForwardAlgorithmMaxCount": (_P, _PI),
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": (_P, _PI),
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": (_P, _PI),
    # H, xDesc, wDesc, convDesc, yDesc, requested, *returned, *perf
    "cudnnFindConvolutionForwardAlgorithm": (_P, _P, _P, _P, _P, _I, _PI, _PERF),
    # H, wDesc, dyDesc, convDesc, dxDesc, requested, *returned, *perf
    "cudnnFindConvolutionBackwardDataAlgorithm": (_P, _P, _P, _P, _P, _I, _PI, _PERF),
    # H, xDesc, dyDesc, convDesc, dwDesc, requested, *returned, *perf
    "cudnnFindConvolutionBackwardFilterAlgorithm": (_P, _P, _P, _P, _P, _I, _PI, _PERF),
    "cudnnGetConvolutionForwardWorkspaceSize": (_P, _P, _P, _P, _P, _I, _PS),          # H, x, w, conv, y, algo
    "cudnnGetConvolutionBackwardDataWorkspaceSize": (_P, _P, _P, _P, _P, _I, _PS),     # H, w, dy, conv, dx, algo
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": (_P, _P, _P, _P, _P, _I, _PS),   # H, x, dy, conv, dw, algo
    # H, alpha, xD, x, wD, w, conv, algo, workspace, bytes, beta, yD, y
    "cudnnConvolutionForward": (_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P),
    # H, alpha, wD, w, dyD, dy, conv, algo, workspace, bytes, beta, dxD, dx
    "cudnnConvolutionBackwardData": (_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P),
    # H, alpha, xD, x, dyD, dy, conv, algo, workspace, bytes, beta, dwD, dw
    "cudnnConvolutionBackwardFilter": (_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P),
    "cudnnConvolutionBackwardBias": (_P, _P, _P, _P, _P, _P, _P),            # H, alpha, dyD, dy, beta, dbD, db
    "cudnnAddTensor": (_P, _P, _P, _P, _P, _P, _P),                          # H, alpha, aD, A, beta, cD, C
    "cudnnCreatePoolingDescriptor": (_PP,),
    "cudnnDestroyPoolingDescriptor": (_P,),
    # D, mode, maxpoolingNanOpt, windowH, windowW, verticalPadding, horizontalPadding, verticalStride, horizontalStride
    "cudnnSetPooling2dDescriptor": (_P, _I, _I, _I, _I, _I, _I, _I, _I),
    "cudnnGetPooling2dForwardOutputDim": (_P, _P, _PI, _PI, _PI, _PI),       # pool, x -> n, c, h, w
    "cudnnPoolingForward": (_P, _P, _P, _P, _P, _P, _P, _P),                 # H, pool, alpha, xD, x, beta, yD, y
    # H, pool, alpha, yD, y, dyD, dy, xD, x, beta, dxD, dx
    "cudnnPoolingBackward": (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P),
    "cudnnCreateLRNDescriptor": (_PP,),
    "cudnnDestroyLRNDescriptor": (_P,),
    "cudnnSetLRNDescriptor": (_P, _U, _D, _D, _D),                          # D, lrnN, lrnAlpha, lrnBeta, lrnK
    "cudnnLRNCrossChannelForward": (_P, _P, _I, _P, _P, _P, _P, _P, _P),     # H, lrn, mode, alpha, xD, x, beta, yD, y
    # H, lrn, mode, alpha, yD, y, dyD, dy, xD, x, beta, dxD, dx
    "cudnnLRNCrossChannelBackward": (_P, _P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P),
    "cudnnSoftmaxForward": (_P, _I, _I, _P, _P, _P, _P, _P, _P),             # H, algo, mode, alpha, xD, x, beta, yD, y
    # H, algo, mode, alpha, yD, y, dyD, dy, beta, dxD, dx
    "cudnnSoftmaxBackward": (_P, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P),
    "cudnnCreateActivationDescriptor": (_PP,),
    "cudnnDestroyActivationDescriptor": (_P,),
    "cudnnSetActivationDescriptor": (_P, _I, _I, _D),                        # D, mode, reluNanOpt, coef
    "cudnnActivationForward": (_P, _P, _P, _P, _P, _P, _P, _P),              # H, act, alpha, xD, x, beta, yD, y
    # H, act, alpha, yD, y, dyD, dy, xD, x, beta, dxD, dx
    "cudnnActivationBackward": (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P),
}

# cuDNN 9's sub-libraries in dependency order (each needs libcudnn_graph; ops, cnn and adv need the engines).
SUBLIBRARIES = ("graph", "engines_precompiled", "engines_runtime_compiled", "heuristic", "ops", "cnn", "adv")
# The CUDA libraries cuDNN 9 opens at run time, in dependency order: cuBLASLt (engines), NVRTC (runtime-compiled
# engines). The nvidia wheels keep them in nvidia/cu13/lib (CUDA 13) or nvidia/{cublas,cuda_nvrtc}/lib (CUDA 12).
CUDA_DEPENDENCIES = ("libcublasLt.so", "libcublas.so", "libnvrtc.so", "libnvrtc-builtins.so")
_WHEEL_DIRS = ("cudnn", "cu13", "cublas", "cuda_nvrtc")

ONE, ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)      # alpha and beta (host floats for float tensors)


def version_tuple(number):
    """cudnnGetVersion()'s number as (major, minor, patch): cuDNN 9 encodes major * 10000 + minor * 100 + patch,
    cuDNN 8 and before major * 1000 + minor * 100 + patch."""
    number = int(number)
    if number >= 90000:
        return number // 10000, number % 10000 // 100, number % 100
    return number // 1000, number % 1000 // 100, number % 100


def _nvidia_wheel_roots():
    """The site-packages/nvidia folders of the nvidia-* wheels (a namespace package), if any is installed."""
    try:
        import nvidia
    except ImportError:
        return []
    return list(getattr(nvidia, "__path__", []))


def library_candidates():
    """Where libcudnn may be, best first: the nvidia-cudnn wheel, the loader's path, the CUDA toolkit."""
    for root in _nvidia_wheel_roots():
        yield from sorted(glob.glob(os.path.join(root, "cudnn", "lib", "libcudnn.so.*[0-9]")))
    found = ctypes.util.find_library("cudnn")
    if found:
        yield found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            yield from sorted(glob.glob(os.path.join(home, "lib64", "libcudnn.so*")))


def _mapped_libraries():
    """File names of the shared libraries already in this process (so that none is loaded twice from two places)."""
    try:
        with open("/proc/self/maps") as maps:
            return {os.path.basename(line.split()[-1]) for line in maps if ".so" in line}
    except OSError:
        return set()


def _preload(cudnn_path):
    """Load what cuDNN will dlopen, dependencies first, RTLD_GLOBAL: the CUDA libraries from the wheels and beside
    libcudnn (unless the process has them already), then cuDNN's sub-libraries beside libcudnn. Returns the
    failures as 'file: why' (cuDNN may still work without an engine library; the caller reports them on error)."""
    here = os.path.dirname(os.path.abspath(cudnn_path)) if os.sep in cudnn_path else None
    folders = ([here] if here else []) + [os.path.join(root, sub, "lib") for root in _nvidia_wheel_roots()
                                          for sub in _WHEEL_DIRS[1:]]
    mapped, failures = _mapped_libraries(), []

    def load(path):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            failures.append("%s: %s" % (os.path.basename(path), exc))

    for stem in CUDA_DEPENDENCIES:
        if any(name.startswith(stem + ".") for name in mapped):
            continue
        for folder in folders:
            found = sorted(glob.glob(os.path.join(folder, stem + ".*[0-9]")))
            if found:
                load(found[0])
                break
    if here:
        for sub in SUBLIBRARIES:
            found = sorted(glob.glob(os.path.join(here, "libcudnn_%s.so.*[0-9]" % sub)))
            if found:
                load(found[0])
    return failures


class Library:
    """libcudnn, loaded, with its functions typed from _SIGNATURES."""

    def __init__(self, lib, path, preload_failures=()):
        self.lib, self.path = lib, path
        self.preload_failures = list(preload_failures)
        for name, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise DeviceError("%s has no %s: not a cuDNN of the v7-style API (8.x or 9.x)" % (path, name)) \
                    from None
            fn.argtypes = list(argtypes)
            fn.restype = ctypes.c_int
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        lib.cudnnGetErrorString.restype = ctypes.c_char_p
        self.version = version_tuple(lib.cudnnGetVersion())
        if self.version < MIN_VERSION:
            raise DeviceError("%s is cuDNN %d.%d.%d; the CUDNN engine needs cuDNN 8 or later"
                              % ((path,) + self.version))

    @property
    def version_text(self):
        return "%d.%d.%d" % self.version

    def status_text(self, status):
        text = self.lib.cudnnGetErrorString(status)
        return text.decode() if text else "status %d" % status


_library = {}       # the process's Library, or the DeviceError that loading it raised (asked once)


def load():
    """The process's libcudnn (loaded on first use), or the DeviceError saying why there is none."""
    if "result" not in _library:
        try:
            _library["result"] = _load()
        except DeviceError as exc:
            _library["result"] = exc
    result = _library["result"]
    if isinstance(result, DeviceError):
        raise result
    return result


def forget():
    """Forget the loaded (or missing) library, so that load() looks again (tests)."""
    _library.clear()


def _load():
    if os.environ.get(DISABLE_VARIABLE, "").strip() == "0":
        raise DeviceError("cuDNN is turned off (%s=0)" % DISABLE_VARIABLE)
    tried = []
    for path in library_candidates():
        if not os.path.basename(path).startswith("libcudnn.so"):
            continue
        failures = _preload(path)
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            tried.append("%s (%s)" % (path, exc))
            continue
        return Library(lib, path, failures)
    where = "; ".join(tried) if tried else "no libcudnn.so in the nvidia-cudnn wheel (nvidia/cudnn/lib), the " \
        "loader's path (ctypes.util.find_library) or $CUDA_HOME/lib64 (/usr/local/cuda/lib64)"
    raise DeviceError("cuDNN cannot be loaded: %s; pip install nvidia-cudnn-cu12 or nvidia-cudnn-cu13 for the "
                      "CUDA engine" % where)


# --- the handle and its descriptors ------------------------------------------------------------------------------

class _Descriptor:
    """One cuDNN descriptor; destroyed when the last reference goes. Passes as its pointer in ctypes calls."""
    __slots__ = ("_as_parameter_", "_destroy")

    def __init__(self, library, kind):
        pointer = ctypes.c_void_p()
        status = getattr(library.lib, "cudnnCreate%sDescriptor" % kind)(ctypes.byref(pointer))
        if status != CUDNN_STATUS_SUCCESS:
            raise DeviceError("cudnnCreate%sDescriptor failed: %s" % (kind, library.status_text(status)))
        self._as_parameter_ = pointer
        self._destroy = getattr(library.lib, "cudnnDestroy%sDescriptor" % kind)

    def __del__(self):
        try:
            self._destroy(self._as_parameter_)
        except Exception:       # interpreter shutdown: the library may be gone already
            pass


class Cudnn:
    """A cuDNN handle on one device's compute stream, with its descriptors kept by their parameters (they never
    change once set, so ops of equal shapes share them) and the convolution algorithms found, by geometry."""

    def __init__(self, stream_handle, library=None):
        self.library = library or load()
        self.lib = self.library.lib
        self.handle = ctypes.c_void_p()
        self.call("cudnnCreate", ctypes.byref(self.handle), with_handle=False)
        self.call("cudnnSetStream", ctypes.c_void_p(stream_handle))
        self._descriptors = {}
        self.algorithms = {}    # (direction, geometry, transform margin or None) -> (algo, workspace bytes)

    def call(self, name, *args, with_handle=True, context=""):
        status = getattr(self.lib, name)(*(((self.handle,) if with_handle else ()) + args))
        if status != CUDNN_STATUS_SUCCESS:
            extra = ""
            if self.library.preload_failures:
                extra = " (libraries that did not load: %s)" % "; ".join(self.library.preload_failures)
            raise DeviceError("%s failed%s: %s%s" % (name, context and " for " + context,
                                                    self.library.status_text(status), extra))

    def _kept(self, key, kind, setter, *values):
        descriptor = self._descriptors.get(key)
        if descriptor is None:
            descriptor = _Descriptor(self.library, kind)
            self.call(setter, descriptor, *values, with_handle=False, context=str(key))
            self._descriptors[key] = descriptor
        return descriptor

    def tensor(self, n, c, h, w):
        """A packed float32 NCHW tensor."""
        dims = tuple(int(d) for d in (n, c, h, w))
        return self._kept(("tensor",) + dims, "Tensor", "cudnnSetTensor4dDescriptor", CUDNN_TENSOR_NCHW,
                          CUDNN_DATA_FLOAT, *dims)

    def filter(self, k, c, h, w):
        dims = tuple(int(d) for d in (k, c, h, w))
        return self._kept(("filter",) + dims, "Filter", "cudnnSetFilter4dDescriptor", CUDNN_DATA_FLOAT,
                          CUDNN_TENSOR_NCHW, *dims)

    def convolution(self, pad, stride, group):
        """Caffe's convolution (cross-correlation, no dilation), float32 accumulation, FMA only, `group` groups."""
        key = ("convolution", tuple(pad), tuple(stride), int(group))
        descriptor = self._descriptors.get(key)
        if descriptor is None:
            descriptor = _Descriptor(self.library, "Convolution")
            self.call("cudnnSetConvolution2dDescriptor", descriptor, int(pad[0]), int(pad[1]), int(stride[0]),
                      int(stride[1]), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT, with_handle=False)
            self.call("cudnnSetConvolutionGroupCount", descriptor, int(group), with_handle=False)
            self.call("cudnnSetConvolutionMathType", descriptor, CUDNN_FMA_MATH, with_handle=False)
            self._descriptors[key] = descriptor
        return descriptor

    def pooling(self, mode, kernel, pad, stride):
        values = tuple(int(v) for v in (kernel[0], kernel[1], pad[0], pad[1], stride[0], stride[1]))
        # NaNs propagate, as in Caffe's cudnn::createPoolingDesc
        return self._kept(("pooling", int(mode)) + values, "Pooling", "cudnnSetPooling2dDescriptor", int(mode),
                          CUDNN_PROPAGATE_NAN, *values)

    def lrn(self, size, alpha, beta, k):
        return self._kept(("lrn", int(size), float(alpha), float(beta), float(k)), "LRN", "cudnnSetLRNDescriptor",
                          int(size), float(alpha), float(beta), float(k))

    def activation(self, mode):
        # NaNs propagate, as in Caffe's cudnn::createActivationDescriptor; coef is unused by these modes
        return self._kept(("activation", int(mode)), "Activation", "cudnnSetActivationDescriptor", int(mode),
                          CUDNN_PROPAGATE_NAN, 0.0)


def _workspace(dev, nbytes):
    """(pointer, bytes) of a workspace from the device's caching allocator, and the array that holds it."""
    if not nbytes:
        return None, 0, None
    array = dev.empty(nbytes, np.uint8)
    return array.ptr, int(nbytes), array


def _ptr(array):
    return ctypes.c_void_p(array.ptr)


def transform_margin_ms():
    """What a transform must save to be taken (PCD_CUDNN_TRANSFORMS): None where transforms are left out (=0), 0 for
    =all, TRANSFORM_MARGIN_MS otherwise (unset, or any other value, as =1 was before the margin)."""
    setting = os.environ.get(TRANSFORMS_VARIABLE, "").strip().lower()
    if setting == "0":
        return None
    return 0.0 if setting == "all" else TRANSFORM_MARGIN_MS


def transforms_allowed():
    """Whether convolutions may take FFT and Winograd algorithms: unless PCD_CUDNN_TRANSFORMS=0."""
    return transform_margin_ms() is not None


def choose_algorithm(results, limit=WORKSPACE_LIMIT_BYTES, transforms=frozenset(), margin_ms=0.0):
    """The fastest (Find sorts them by time) result that ran, within the workspace limit, in IEEE float32 math
    (FMA, or DEFAULT as Find reports algorithms without tensor-core variants); (algo, bytes) or None. An algorithm
    of `transforms` is taken only where it beats the fastest of the others by more than margin_ms, never where
    margin_ms is None."""
    usable = [perf for perf in results if perf.status == CUDNN_STATUS_SUCCESS and perf.memory <= limit and
              perf.mathType in (CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH)]
    direct = [perf for perf in usable if perf.algo not in transforms]
    best = usable[0] if usable else None
    if best is not None and best.algo in transforms and \
            (margin_ms is None or (direct and best.time + margin_ms >= direct[0].time)):
        best = direct[0] if direct else None
    return None if best is None else (int(best.algo), int(best.memory))


class ConvolutionOp:
    """One 2-D convolution geometry: x (N, C, H, W), w (K, C / group, kh, kw), y (N, K, OH, OW), as Caffe's
    CuDNNConvolutionLayer: forward y = w * x; backward data dx = w^T * dy (overwritten); backward filter dw += ...
    and bias db += (Caffe accumulates parameter diffs). A Deconvolution runs the same op with the roles swapped."""

    def __init__(self, cudnn, x_shape, w_shape, pad, stride, group):
        self.cudnn = cudnn
        self.geometry = (tuple(x_shape), tuple(w_shape), tuple(pad), tuple(stride), int(group))
        self.what = self.describe()     # every call's context for its error message, made once
        # The transforms' setting when the op is made (a net's first GPU pass), not read again at every call
        self.margin_ms = transform_margin_ms()
        self.x = cudnn.tensor(*x_shape)
        self.w = cudnn.filter(*w_shape)
        self.conv = cudnn.convolution(pad, stride, group)
        out = [ctypes.c_int() for _ in range(4)]
        cudnn.call("cudnnGetConvolution2dForwardOutputDim", self.conv, self.x, self.w, *map(ctypes.byref, out),
                   with_handle=False, context=self.what)
        self.y_shape = tuple(v.value for v in out)
        self.y = cudnn.tensor(*self.y_shape)
        self.x_bias = cudnn.tensor(1, x_shape[1], 1, 1)
        self.y_bias = cudnn.tensor(1, w_shape[0], 1, 1)

    def describe(self):
        x, w, pad, stride, group = self.geometry
        return "convolution x %s w %s pad %s stride %s group %d" % (x, w, pad, stride, group)

    def _algorithm(self, direction):
        """(algo, workspace bytes) for 'forward', 'data' or 'filter': found once per geometry and direction (and
        the transforms' setting, which a process may change between nets)."""
        key = (direction, self.geometry, self.margin_ms)
        found = self.cudnn.algorithms.get(key)
        if found is None:
            found = self.cudnn.algorithms[key] = self._find(direction, self.margin_ms)
        return found

    def _find(self, direction, margin_ms):
        c = self.cudnn
        count_name, find_name, size_name, descriptors = {
            "forward": ("cudnnGetConvolutionForwardAlgorithmMaxCount", "cudnnFindConvolutionForwardAlgorithm",
                        "cudnnGetConvolutionForwardWorkspaceSize", (self.x, self.w, self.conv, self.y)),
            "data": ("cudnnGetConvolutionBackwardDataAlgorithmMaxCount", "cudnnFindConvolutionBackwardDataAlgorithm",
                     "cudnnGetConvolutionBackwardDataWorkspaceSize", (self.w, self.y, self.conv, self.x)),
            "filter": ("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
                       "cudnnFindConvolutionBackwardFilterAlgorithm", "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                       (self.x, self.y, self.conv, self.w)),
        }[direction]
        wanted = ctypes.c_int()
        c.call(count_name, ctypes.byref(wanted))
        results = (AlgoPerf * max(1, wanted.value))()
        returned = ctypes.c_int()
        c.call(find_name, *descriptors, len(results), ctypes.byref(returned), results, context=self.what)
        chosen = choose_algorithm(results[:returned.value], transforms=TRANSFORM_ALGORITHMS[direction],
                                  margin_ms=margin_ms)
        if chosen is None:
            # Nothing fit or ran: algorithm 0 of each direction (implicit GEMM; ALGO_0), which needs little or no
            # workspace; its size is asked for, not measured.
            size = ctypes.c_size_t()
            c.call(size_name, *descriptors, 0, ctypes.byref(size), context=self.what)
            chosen = (0, int(size.value))
        return chosen

    def forward(self, dev, x, w, y):
        """y = w * x (overwrites y)."""
        algo, nbytes = self._algorithm("forward")
        ptr, nbytes, held = _workspace(dev, nbytes)
        self.cudnn.call("cudnnConvolutionForward", ctypes.byref(ONE), self.x, _ptr(x), self.w, _ptr(w), self.conv,
                        algo, ptr, nbytes, ctypes.byref(ZERO), self.y, _ptr(y), context=self.what)
        del held    # back to the allocator's bin: later work on the same stream runs after this call's

    def backward_data(self, dev, w, dy, dx):
        """dx = the x-gradient of y = w * x for the y-gradient dy (overwrites dx)."""
        algo, nbytes = self._algorithm("data")
        ptr, nbytes, held = _workspace(dev, nbytes)
        self.cudnn.call("cudnnConvolutionBackwardData", ctypes.byref(ONE), self.w, _ptr(w), self.y, _ptr(dy),
                        self.conv, algo, ptr, nbytes, ctypes.byref(ZERO), self.x, _ptr(dx), context=self.what)
        del held

    def backward_filter(self, dev, x, dy, dw):
        """dw += the w-gradient of y = w * x for the y-gradient dy."""
        algo, nbytes = self._algorithm("filter")
        ptr, nbytes, held = _workspace(dev, nbytes)
        self.cudnn.call("cudnnConvolutionBackwardFilter", ctypes.byref(ONE), self.x, _ptr(x), self.y, _ptr(dy),
                        self.conv, algo, ptr, nbytes, ctypes.byref(ONE), self.w, _ptr(dw), context=self.what)
        del held

    def add_bias(self, bias, out, side="y"):
        """out[n, c, :, :] += bias[c], for out the y side (a convolution's top) or the x side (a deconvolution's)."""
        bias_desc, out_desc = (self.y_bias, self.y) if side == "y" else (self.x_bias, self.x)
        self.cudnn.call("cudnnAddTensor", ctypes.byref(ONE), bias_desc, _ptr(bias), ctypes.byref(ONE), out_desc,
                        _ptr(out), context=self.what)

    def bias_diff(self, dout, bias_diff, side="y"):
        """bias_diff[c] += the sum of dout[:, c, :, :]."""
        bias_desc, out_desc = (self.y_bias, self.y) if side == "y" else (self.x_bias, self.x)
        self.cudnn.call("cudnnConvolutionBackwardBias", ctypes.byref(ONE), out_desc, _ptr(dout), ctypes.byref(ONE),
                        bias_desc, _ptr(bias_diff), context=self.what)


class PoolingOp:
    """Pooling of x (N, C, H, W) into y (N, C, *pooled): cudnnPoolingForward / Backward (dx overwritten)."""

    def __init__(self, cudnn, mode, x_shape, pooled, kernel, pad, stride):
        self.cudnn = cudnn
        self.what = "pooling mode %d x %s kernel %s pad %s stride %s" % (mode, tuple(x_shape), tuple(kernel),
                                                                        tuple(pad), tuple(stride))
        self.pool = cudnn.pooling(mode, kernel, pad, stride)
        self.x = cudnn.tensor(*x_shape)
        out = [ctypes.c_int() for _ in range(4)]
        cudnn.call("cudnnGetPooling2dForwardOutputDim", self.pool, self.x, *map(ctypes.byref, out),
                   with_handle=False, context=self.what)
        y_shape = tuple(x_shape[:2]) + tuple(pooled)
        if tuple(v.value for v in out) != y_shape:
            raise DeviceError("cuDNN pools %s into %s, the layer into %s" % (self.what, tuple(v.value for v in out),
                                                                            y_shape))
        self.y = cudnn.tensor(*y_shape)

    def forward(self, x, y):
        self.cudnn.call("cudnnPoolingForward", self.pool, ctypes.byref(ONE), self.x, _ptr(x), ctypes.byref(ZERO),
                        self.y, _ptr(y), context=self.what)

    def backward(self, y, dy, x, dx):
        self.cudnn.call("cudnnPoolingBackward", self.pool, ctypes.byref(ONE), self.y, _ptr(y), self.y, _ptr(dy),
                        self.x, _ptr(x), ctypes.byref(ZERO), self.x, _ptr(dx), context=self.what)


class LRNOp:
    """Cross-channel LRN of x (N, C, H, W): y = x / (k + alpha / size * sum of x^2 over `size` channels)^beta,
    Caffe's ACROSS_CHANNELS (window centred, (size - 1) / 2 channels before)."""

    def __init__(self, cudnn, shape, size, alpha, beta, k):
        self.cudnn = cudnn
        self.what = "LRN x %s size %d alpha %g beta %g k %g" % (tuple(shape), size, alpha, beta, k)
        self.lrn = cudnn.lrn(size, alpha, beta, k)
        self.x = cudnn.tensor(*shape)

    def forward(self, x, y):
        self.cudnn.call("cudnnLRNCrossChannelForward", self.lrn, CUDNN_LRN_CROSS_CHANNEL_DIM1, ctypes.byref(ONE),
                        self.x, _ptr(x), ctypes.byref(ZERO), self.x, _ptr(y), context=self.what)

    def backward(self, y, dy, x, dx):
        self.cudnn.call("cudnnLRNCrossChannelBackward", self.lrn, CUDNN_LRN_CROSS_CHANNEL_DIM1, ctypes.byref(ONE),
                        self.x, _ptr(y), self.x, _ptr(dy), self.x, _ptr(x), ctypes.byref(ZERO), self.x, _ptr(dx),
                        context=self.what)


class SoftmaxOp:
    """Softmax over the channels of (outer, channels, inner), as CuDNNSoftmaxLayer's (N, K, inner, 1) tensors;
    y may be x, dx may be dy (cuDNN computes these in place)."""

    def __init__(self, cudnn, outer, channels, inner):
        self.cudnn = cudnn
        self.what = "softmax of (%d, %d, %d)" % (outer, channels, inner)
        self.x = cudnn.tensor(outer, channels, inner, 1)

    def forward(self, x, y):
        self.cudnn.call("cudnnSoftmaxForward", CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, ctypes.byref(ONE),
                        self.x, _ptr(x), ctypes.byref(ZERO), self.x, _ptr(y), context=self.what)

    def backward(self, y, dy, dx):
        self.cudnn.call("cudnnSoftmaxBackward", CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, ctypes.byref(ONE),
                        self.x, _ptr(y), self.x, _ptr(dy), ctypes.byref(ZERO), self.x, _ptr(dx), context=self.what)


class ActivationOp:
    """An element-wise activation (ReLU, sigmoid, tanh) over a blob of `shape`, seen as (shape[0], rest, 1, 1) (as
    CuPy does); in place allowed (y may be x, dx may be dy)."""

    def __init__(self, cudnn, mode, shape):
        self.cudnn = cudnn
        shape = tuple(int(d) for d in shape) or (1,)
        first = shape[0]
        rest = int(np.prod(shape[1:], dtype=np.int64))
        self.what = "activation mode %d of %s" % (mode, shape)
        self.activation = cudnn.activation(mode)
        self.x = cudnn.tensor(first, rest, 1, 1)

    def forward(self, x, y):
        self.cudnn.call("cudnnActivationForward", self.activation, ctypes.byref(ONE), self.x, _ptr(x),
                        ctypes.byref(ZERO), self.x, _ptr(y), context=self.what)

    def backward(self, y, dy, x, dx):
        self.cudnn.call("cudnnActivationBackward", self.activation, ctypes.byref(ONE), self.x, _ptr(y), self.x,
                        _ptr(dy), self.x, _ptr(x), ctypes.byref(ZERO), self.x, _ptr(dx), context=self.what)


# --- one handle per device ------------------------------------------------------------------------------------

def for_device(dev):
    """The Cudnn of a CudaDevice (made on first use, on its compute stream), or the DeviceError saying why there is
    none; asked once per device."""
    held = getattr(dev, "_cudnn", None)
    if held is None:
        try:
            held = Cudnn(dev.stream.handle)
        except DeviceError as exc:
            held = exc
        dev._cudnn = held
    if isinstance(held, DeviceError):
        raise held
    return held


def describe():
    """'9.x.y (path)' of the loadable cuDNN, or 'not available: why' (dist_caffe device-query)."""
    try:
        library = load()
    except DeviceError as exc:
        return "not available: %s" % exc
    return "%s (%s)" % (library.version_text, library.path)
