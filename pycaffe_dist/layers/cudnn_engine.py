"""Caffe's `engine` fields: whether a layer's GPU code runs Caffe's kernels (ours) or cuDNN, and the cuDNN path of
the layers that have one (backend/cudnn.py holds the bindings).

Caffe's layer_factory.cpp, in a cuDNN build and GPU mode, turns engine DEFAULT into CUDNN for Convolution and
Deconvolution (CAFFE where a dilation is > 1), Pooling, LRN, ReLU, Sigmoid, TanH and Softmax; and its cuDNN layers
leave some settings to Caffe's own code: Pooling MAX (in-place trouble with cuDNN's indices) and a Pooling layer
with the mask top, LRN ACROSS_CHANNELS with local_size > 16, ReLU with a negative_slope. We follow it:

- engine CAFFE: our kernels.
- DEFAULT or CUDNN on a CUDA device where cuDNN loads: cuDNN for the settings Caffe's cuDNN layers take, our kernels
  for the others, silently, as Caffe's factory. Beyond Caffe's own fall-backs, ours also run (deliberately) for
  what Caffe's cuDNN layers would abort on or compute differently: a dilation other than 1 (Caffe: LOG(FATAL)
  with CUDNN; a 0 dilation reaches cuDNN and fails), convolutions over other than 2 spatial axes or axis 1,
  STOCHASTIC pooling (cuDNN has none), AVE pooling whose last windows reach past the padding (Caffe's CEIL output
  size; Caffe divides those windows by their clipped size, cuDNN by the whole kernel), LRN settings that
  cudnnSetLRNDescriptor refuses (k < 1e-5, beta < 0.01), and LRN WITHIN_CHANNEL (Caffe's CuDNNLCNLayer, cuDNN's
  divisive normalization, is not bound: our kernels compute Caffe's LRN sub-net).
- DEFAULT or CUDNN where cuDNN cannot run (no libcudnn, PCD_CUDNN=0, the handle fails): our kernels, and ONE
  warning per process saying why, when CUDNN was asked for explicitly or when DEFAULT meant CUDNN (a real GPU).
  The emulated device has no cuDNN: DEFAULT means CAFFE there without a word, as in a CPU-only Caffe build; an
  explicit CUDNN gets the warning. CPU mode never asks (the GPU code does not run), as Caffe's cuDNN layers run
  their CPU code there.

- PCD_CUDNN_LAYERS=Convolution,Deconvolution (a list of layer types): engine DEFAULT means cuDNN only for the
  types listed, our kernels for the others; an explicit CUDNN is kept. For measuring: each cuDNN call costs the
  host tens of microseconds where a launch of ours costs about ten (tools/gpu_host_costs.py), and a small net's
  step is paced by the host (tools/gpu_check.sh times the nets both ways).

Caffe chooses when it creates the layer (Caffe::mode()); we choose at the layer's first GPU pass on a device.
Each `*_op` is the cuDNN op that runs a layer now, or None; each `*_forward` / `*_backward` returns True when
cuDNN did the work, False when the layer's own GPU code must.
"""
import logging
import os

from ..backend import cudnn, select
from ..blob.blob import count
from ..errors import DeviceError
from ..proto import caffe_pb2

log = logging.getLogger("pycaffe_dist")

DEFAULT, CAFFE, CUDNN = 0, 1, 2     # every Engine enum of caffe.proto (Convolution, Pooling, LRN, ReLU, ...)
LAYERS_VARIABLE = "PCD_CUDNN_LAYERS"    # the layer types engine DEFAULT may send to cuDNN (unset: all, as Caffe)
PP = caffe_pb2.PoolingParameter
_notice = {}                        # "given": the one warning of this process about a missing cuDNN


def is_cuda_device(dev):
    """A real GPU (pycuda's device), which can have cuDNN; the emulated device cannot."""
    from ..backend.cuda import CudaDevice
    return isinstance(dev, CudaDevice)


def forget():
    """Give the warning again next time (tests)."""
    _notice.clear()


def context(layer, engine):
    """The Cudnn to run `layer`'s GPU code with, or None for our kernels; resolved once per layer and device."""
    if engine == CAFFE:
        return None
    dev = select.current()
    held = layer.__dict__.get("_cudnn_context")
    if held is None or held[0] is not dev:
        held = layer._cudnn_context = (dev, _resolve(layer, dev, engine == CUDNN))
    return held[1]


def default_takes_cudnn(layer_type):
    """Whether engine DEFAULT may mean cuDNN for a layer of `layer_type`: yes unless PCD_CUDNN_LAYERS lists types
    and not this one."""
    listed = {name.strip() for name in os.environ.get(LAYERS_VARIABLE, "").split(",") if name.strip()}
    return not listed or layer_type in listed


def _resolve(layer, dev, explicit):
    if not explicit and not default_takes_cudnn(layer.param.type):
        return None
    if not is_cuda_device(dev):
        if explicit:
            _warn_once(layer, explicit, "the %s has no cuDNN" % dev.name)
        return None
    try:
        return cudnn.for_device(dev)
    except DeviceError as exc:
        _warn_once(layer, explicit, str(exc))
        return None


def _warn_once(layer, explicit, why):
    if _notice:
        return
    _notice["given"] = True
    log.warning("layer '%s' (%s): %s, but %s. Caffe's GPU kernels run instead (engine CAFFE), here and in every "
                "layer that would use cuDNN (this warning is given once).", layer.name, layer.param.type,
                "engine CUDNN is asked for" if explicit else "engine DEFAULT means CUDNN on a GPU, as in Caffe",
                why)


def _kept_op(layer, key, make):
    """The layer's cuDNN op for `key` (its shapes and settings), made again when they change."""
    held = layer.__dict__.get("_cudnn_op")
    if held is None or held[0] != key:
        held = layer._cudnn_op = (key, make())
    return held[1]


# --- Convolution and Deconvolution (CuDNNConvolutionLayer, CuDNNDeconvolutionLayer) --------------------------------

def convolution_op(layer):
    if layer.num_spatial_axes != 2 or layer.channel_axis != 1 or any(d != 1 for d in layer.dilation):
        return None
    ctx = context(layer, layer.param.convolution_param.engine)
    if ctx is None:
        return None
    if layer.reverse_dimensions:    # a deconvolution is the convolution from its top (x) to its bottom (y)
        x_shape = (layer.num, layer.num_output) + tuple(layer.output_spatial)
        y_shape = (layer.num, layer.channels) + tuple(layer.input_spatial)
        w_shape = (layer.channels, layer.num_output // layer.group) + tuple(layer.kernel)
    else:
        x_shape = (layer.num, layer.channels) + tuple(layer.input_spatial)
        y_shape = (layer.num, layer.num_output) + tuple(layer.output_spatial)
        w_shape = (layer.num_output, layer.channels // layer.group) + tuple(layer.kernel)
    if not (count(x_shape) and count(y_shape)):
        return None
    key = ("convolution", x_shape, w_shape, tuple(layer.pad), tuple(layer.stride), layer.group)

    def make():
        op = cudnn.ConvolutionOp(ctx, x_shape, w_shape, layer.pad, layer.stride, layer.group)
        if op.y_shape != y_shape:
            raise DeviceError("layer '%s': cuDNN's %s gives %s, the layer %s" % (layer.name, op.describe(),
                                                                                 op.y_shape, y_shape))
        return op
    return _kept_op(layer, key, make)


def convolution_forward(layer, bottom, top, bias=True):
    """bias=False: without the bias (the caller adds it)."""
    op = convolution_op(layer)
    if op is None:
        return False
    dev, w = select.current(), layer.blobs[0].gpu_data
    for b, t in zip(bottom, top):
        y = t.mutable_gpu_data
        if layer.reverse_dimensions:
            op.backward_data(dev, w, b.gpu_data, y)     # CuDNNDeconvolutionLayer: top = W^T bottom
        else:
            op.forward(dev, b.gpu_data, w, y)
        if layer.bias_term and bias:
            op.add_bias(layer.blobs[1].gpu_data, y, side="x" if layer.reverse_dimensions else "y")
    return True


def convolution_backward(layer, top, propagate_down, bottom):
    """Caffe's order and accumulation: bias diff +=, weight diff +=, bottom diff =."""
    op = convolution_op(layer)
    if op is None:
        return False
    dev, w = select.current(), layer.blobs[0].gpu_data
    want_w = layer.param_propagate_down[0]
    want_b = layer.bias_term and layer.param_propagate_down[1]
    deconv = layer.reverse_dimensions
    for i, (t, b) in enumerate(zip(top, bottom)):
        dy = t.gpu_diff
        if want_b:
            op.bias_diff(dy, layer.blobs[1].mutable_gpu_diff, side="x" if deconv else "y")
        if want_w:
            if deconv:
                op.backward_filter(dev, dy, b.gpu_data, layer.blobs[0].mutable_gpu_diff)
            else:
                op.backward_filter(dev, b.gpu_data, dy, layer.blobs[0].mutable_gpu_diff)
        if propagate_down[i]:
            if deconv:
                op.forward(dev, dy, w, b.mutable_gpu_diff)
            else:
                op.backward_data(dev, w, dy, b.mutable_gpu_diff)
    return True


# --- Pooling (CuDNNPoolingLayer: AVE only, one top) -----------------------------------------------------------------

def pooling_op(layer, bottom, top):
    pp = layer.param.pooling_param
    if pp.pool != PP.AVE or len(top) > 1:
        return None     # MAX and the mask top: Caffe's factory keeps its own layer; STOCHASTIC: cuDNN has none
    ctx = context(layer, pp.engine)
    if ctx is None:
        return None
    shape = tuple(bottom[0].shape)
    # cuDNN's output size is FLOOR's; where Caffe's (CEIL) has one more window, that window reaches past the
    # padding and Caffe divides it by its clipped size: our kernels.
    floor = tuple((size + 2 * p - k) // s + 1 for size, k, p, s in zip(shape[2:], layer.kernel, layer.pad,
                                                                         layer.stride))
    if floor != tuple(layer.pooled) or not count(shape) or not count(layer.pooled):
        return None
    key = ("pooling", shape, tuple(layer.kernel), tuple(layer.pad), tuple(layer.stride))
    return _kept_op(layer, key, lambda: cudnn.PoolingOp(ctx, cudnn.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                                         shape, layer.pooled, layer.kernel, layer.pad, layer.stride))


def pooling_forward(layer, bottom, top):
    op = pooling_op(layer, bottom, top)
    if op is None:
        return False
    op.forward(bottom[0].gpu_data, top[0].mutable_gpu_data)
    return True


def pooling_backward(layer, top, propagate_down, bottom):
    op = pooling_op(layer, bottom, top)
    if op is None:
        return False
    if propagate_down[0]:
        op.backward(top[0].gpu_data, top[0].gpu_diff, bottom[0].gpu_data, bottom[0].mutable_gpu_diff)
    return True


# --- LRN (CuDNNLRNLayer: ACROSS_CHANNELS) ---------------------------------------------------------------------------

def lrn_op(layer, bottom):
    if not (layer.across_channels and cudnn.CUDNN_LRN_MIN_N <= layer.size <= cudnn.CUDNN_LRN_MAX_N
            and layer.k >= cudnn.CUDNN_LRN_MIN_K and layer.beta >= cudnn.CUDNN_LRN_MIN_BETA):
        return None
    ctx = context(layer, layer.param.lrn_param.engine)
    if ctx is None:
        return None
    shape = tuple(bottom[0].shape)
    if not count(shape):
        return None
    key = ("lrn", shape, layer.size, layer.alpha, layer.beta, layer.k)
    return _kept_op(layer, key, lambda: cudnn.LRNOp(ctx, shape, layer.size, layer.alpha, layer.beta, layer.k))


def lrn_forward(layer, bottom, top):
    op = lrn_op(layer, bottom)
    if op is None:
        return False
    op.forward(bottom[0].gpu_data, top[0].mutable_gpu_data)
    return True


def lrn_backward(layer, top, propagate_down, bottom):
    op = lrn_op(layer, bottom)
    if op is None:
        return False
    if propagate_down[0]:
        op.backward(top[0].gpu_data, top[0].gpu_diff, bottom[0].gpu_data, bottom[0].mutable_gpu_diff)
    return True


# --- Softmax (CuDNNSoftmaxLayer) ------------------------------------------------------------------------------------

def softmax_op(layer, blob):
    ctx = context(layer, layer.param.softmax_param.engine)
    if ctx is None:
        return None
    dims = (blob.count_range(0, layer.axis), blob.shape[layer.axis], blob.count_range(layer.axis + 1))
    if not count(dims):
        return None
    return _kept_op(layer, ("softmax",) + dims, lambda: cudnn.SoftmaxOp(ctx, *dims))


def softmax_forward(layer, bottom, top):
    op = softmax_op(layer, bottom[0])
    if op is None:
        return False
    op.forward(bottom[0].gpu_data, top[0].mutable_gpu_data)
    return True


def softmax_backward(layer, top, propagate_down, bottom):
    op = softmax_op(layer, top[0])
    if op is None:
        return False
    if propagate_down[0]:
        op.backward(top[0].gpu_data, top[0].gpu_diff, bottom[0].mutable_gpu_diff)
    return True


# --- ReLU, Sigmoid, TanH (CuDNNReLULayer, CuDNNSigmoidLayer, CuDNNTanHLayer) ----------------------------------------

_ACTIVATIONS = {"ReLU": ("relu_param", cudnn.CUDNN_ACTIVATION_RELU),
                "Sigmoid": ("sigmoid_param", cudnn.CUDNN_ACTIVATION_SIGMOID),
                "TanH": ("tanh_param", cudnn.CUDNN_ACTIVATION_TANH)}


def activation_op(layer, blob):
    field, mode = _ACTIVATIONS[layer.param.type]
    if layer.param.type == "ReLU" and layer.param.relu_param.negative_slope != 0:
        return None     # CuDNNReLULayer runs ReLULayer's code for a leaky ReLU
    ctx = context(layer, getattr(layer.param, field).engine)
    if ctx is None:
        return None
    shape = tuple(blob.shape)
    if not count(shape):
        return None
    return _kept_op(layer, ("activation", mode, shape), lambda: cudnn.ActivationOp(ctx, mode, shape))


def neuron_forward(layer, bottom, top):
    op = activation_op(layer, bottom[0])
    if op is None:
        return False
    op.forward(bottom[0].gpu_data, top[0].mutable_gpu_data)
    return True


def neuron_backward(layer, top, propagate_down, bottom):
    """In place, x is the top: ReLU's, sigmoid's and tanh's gradients need only y (or the sign of x)."""
    op = activation_op(layer, top[0])
    if op is None:
        return False
    if propagate_down[0]:
        op.backward(top[0].gpu_data, top[0].gpu_diff, bottom[0].gpu_data, bottom[0].mutable_gpu_diff)
    return True
