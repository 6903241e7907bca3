"""The Layer contract, after Caffe's include/caffe/layer.hpp.

A layer is built from its LayerParameter, then `setup(bottom, top)` checks the blob counts, runs
`layer_setup` (read parameters, create `self.blobs`) and `reshape` (set top shapes from bottom shapes).
`forward(bottom, top)` and `backward(top, propagate_down, bottom)` compute; they call backend kernels and do not
know which backend runs them. `flops(bottom, top)` counts the forward pass's floating-point operations
(a multiply-add is 2), for net-info. `buffer(name, ...)` is every scratch array a layer keeps between calls, on the
host or the device (Caffe's internal blobs: ones multipliers, column buffers, masks, saved inputs).
"""
import numpy as np

from ..backend import select
from ..errors import NetError
from .. import common
from ..blob.blob import Blob, canonical_axis, count
from ..blob.filler import fill, filler_problem


class Layer:
    type = None                  # Caffe's type string; set by @register
    exact_num_bottom = None      # Caffe's ExactNumBottomBlobs / MinBottomBlobs / MaxBottomBlobs ...
    min_bottom = None
    max_bottom = None
    exact_num_top = None
    min_top = None
    max_top = None
    equal_num_bottom_top = False
    auto_top_blobs = False       # Caffe's AutoTopBlobs: the net adds anonymous tops up to the minimum
    is_loss = False              # loss layers weigh their first top 1 unless loss_weight says otherwise
    has_backward = True          # False where Caffe's Backward is NOT_IMPLEMENTED or a no-op (data, accuracy, ...)
    # True where reshape's effect (the tops' shapes, the layer's own state) follows from the shapes of the bottoms
    # and tops alone: the Net then skips it while those are unchanged. Not so for layers that look at data
    # (Filter), draw batches, or run user code (Python).
    reshape_from_shapes = False
    # GPU code, as methods of the same signatures as forward/backward, where a layer has it: they read and write
    # the blobs' device copies (gpu_data, mutable_gpu_diff, ...) through backend.device. None: the Net runs the CPU
    # code on the host copies instead, as Caffe's Layer::Forward_gpu falls back to Forward_cpu.
    forward_gpu = None
    backward_gpu = None
    # True where forward_gpu leaves a check of its input to finish_forward_gpu, which the Net calls when it reads
    # the forward's losses: a check read on the host in mid-pass would make the host wait for the GPU there.
    defers_checks = False

    def __init__(self, param, phase=None):
        # Each layer owns a copy of its LayerParameter, as Caffe's Layer does: a layer may edit it (BatchNorm adds
        # lr_mult 0 specs) without the Net seeing that, and Net.to_proto writes this copy.
        self.param = type(param)()
        self.param.CopyFrom(param)
        self.name = param.name
        self.phase = param.phase if phase is None else phase
        # Blobs stored in the LayerParameter (deploy nets with embedded weights) come first, as in Caffe's
        # Layer constructor; layer_setup then skips its fillers ("Skipping parameter initialization").
        self.blobs = [Blob.from_proto_new(b, what="layer '%s' blob %d" % (self.name, i))
                      for i, b in enumerate(param.blobs)]
        del self.param.blobs[:]   # now held by self.blobs; to_proto writes them back
        self.param_propagate_down = []
        self.loss_weights = []
        self._buffers = {}   # buffer(): {(name, on the device): (device or None, array)}

    def finish_forward_gpu(self):
        """Raise what the last forward_gpu found wrong in its input (where defers_checks)."""

    # --- helpers for subclasses -----------------------------------------------------------------------

    def error(self, message):
        return NetError("layer '%s' (%s): %s" % (self.name, self.param.type, message))

    def check(self, condition, message):
        if not condition:
            raise self.error(message)

    def make_param(self, shape, filler=None):
        """A new learnable blob of `shape`, filled by `filler` (a FillerParameter) when its data is first used;
        a filler Caffe would refuse for this shape is refused now, naming the layer."""
        if filler is not None:
            problem = filler_problem(filler, shape)
            self.check(problem is None, problem)
        return Blob(shape, init=None if filler is None else (lambda blob: fill(filler, blob)))

    # --- the contract ---------------------------------------------------------------------------------

    def setup(self, bottom, top):
        self.check_blob_counts(bottom, top)
        self.layer_setup(bottom, top)
        self.param_propagate_down = [True] * len(self.blobs)
        self.reshape(bottom, top)
        self.set_loss_weights(top)

    def check_blob_counts(self, bottom, top):
        def bound(n, exact, lo, hi, what):
            if exact is not None and n != exact:
                raise self.error("takes exactly %d %s blob(s), got %d" % (exact, what, n))
            if lo is not None and n < lo:
                raise self.error("takes at least %d %s blob(s), got %d" % (lo, what, n))
            if hi is not None and n > hi:
                raise self.error("takes at most %d %s blob(s), got %d" % (hi, what, n))
        bound(len(bottom), self.exact_num_bottom, self.min_bottom, self.max_bottom, "bottom")
        bound(len(top), self.exact_num_top, self.min_top, self.max_top, "top")
        if self.equal_num_bottom_top and len(bottom) != len(top):
            raise self.error("needs as many tops as bottoms, got %d bottoms and %d tops" % (len(bottom), len(top)))

    def set_loss_weights(self, top):
        """Caffe's Layer::SetLossWeights: one weight per top, defaulting to 1 on top 0 of loss layers."""
        weights = list(self.param.loss_weight)
        if weights and len(weights) != len(top):
            raise self.error("loss_weight must be unspecified or given once per top (%d tops, %d weights)"
                             % (len(top), len(weights)))
        if not weights:
            weights = [1.0 if (self.is_loss and i == 0) else 0.0 for i in range(len(top))]
        self.loss_weights = weights
        for w, blob in zip(weights, top):
            if w:
                blob.diff[...] = w   # Caffe stores the loss weight in the top's diff

    def layer_setup(self, bottom, top):
        """Read parameters and create self.blobs (unless they came with the LayerParameter)."""

    def reshape(self, bottom, top):
        raise NotImplementedError("%s.reshape" % type(self).__name__)

    def forward(self, bottom, top):
        raise self.error("forward is not implemented for this layer type yet")

    def backward(self, top, propagate_down, bottom):
        raise self.error("backward is not implemented for this layer type yet")

    def allow_force_backward(self, bottom_index):
        return True

    def flops(self, bottom, top):
        return 0

    @property
    def rng(self):
        return common.rng()

    def buffer(self, name, size_or_shape=None, dtype=np.float32, fill=None, device=False, at_least=False):
        """A scratch array the layer keeps under `name` between calls, as Caffe's layers keep internal blobs
        (bias_multiplier_, col_buffer_, max_idx_, rand_vec_, ...): a numpy array, or with `device` an array on the
        process's device (select.current()). Host and device buffers of one name are two buffers.

        size_or_shape: a number of elements (a flat array), or on the host a shape. The array kept under `name` is
        returned unless it must be made again: on another device, of another dtype, or of another size (a number)
        or shape (a shape); with `at_least`, only when it has fewer elements than asked for (a buffer that grows,
        as a Blob keeps its capacity), and a new one has at least one element. `fill` sets every element of a new
        array (Caffe's ones multipliers); a kept one is returned as it is, whatever was written into it.

        Without size_or_shape: the array last made under `name` (what a forward left for its backward)."""
        key = (name, bool(device))
        if size_or_shape is None:
            return self._buffers[key][1]
        dtype = np.dtype(dtype)
        where = select.current() if device else None
        shape = tuple(size_or_shape) if isinstance(size_or_shape, tuple) and not device else None
        size = count(size_or_shape) if isinstance(size_or_shape, tuple) else int(size_or_shape)
        if at_least:
            size = max(1, size)
        held = self._buffers.get(key)
        if held is not None and held[0] is where and held[1].dtype == dtype:
            array = held[1]
            if at_least:
                fits = array.size >= size
            elif shape is not None:
                fits = array.shape == shape
            else:
                fits = array.size == size
            if fits:
                return array
        if device:
            array = where.empty(size, dtype)
            if fill is not None:
                where.fill(array, fill)
        else:
            array = np.empty(size if shape is None else shape, dtype)
            if fill is not None:
                array.fill(fill)
        self._buffers[key] = (where, array)
        return array

    def adopt_buffer(self, name, array, device=True):
        """Keep `array` under `name` as if buffer() had made it (another layer's array, shared: net/gpu_fusion.py
        gives a fused Scale the BatchNorm's x_norm as its kept input)."""
        self._buffers[(name, bool(device))] = (select.current() if device else None, array)

# --- helpers shared by the layer modules ------------------------------------------------------------------

def checked_axis(layer, axis, num_axes, what="axis"):
    """canonical_axis with the layer's name in the error."""
    try:
        return canonical_axis(axis, num_axes, what)
    except NetError as exc:
        raise layer.error(str(exc)) from None


def check_param_shapes(layer, expected):
    """Blobs that came with the LayerParameter must have the shapes the layer would have made (Caffe's
    "Incorrect number of weight blobs." / "Incorrect weight shape: expected shape ...; instead, shape was ...")."""
    layer.check(len(layer.blobs) == len(expected), "Incorrect number of weight blobs: expected %d, got %d"
                % (len(expected), len(layer.blobs)))
    for i, (blob, shape) in enumerate(zip(layer.blobs, expected)):
        layer.check(blob.shape == tuple(shape), "Incorrect shape of param blob %d: expected shape %s; instead, "
                    "shape was %s" % (i, tuple(shape), blob.shape))


def c_div(a, b):
    """C's integer division (truncates toward zero), which Caffe's output-size formulas use."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q
