"""Caffe's finite-difference gradient checker (src/caffe/test/test_gradient_check_util.hpp), in float64.

The layer runs on float64 blobs, as Caffe's tests run it with Dtype = double. An objective of the tops is
chosen, the layer's backward gives the analytic gradient of every checked blob (bottoms and parameters), and
central differences with `stepsize` estimate it. Where |x| is within `kink_range` of `kink` (ReLU's 0, ...)
the check is skipped. Errors must be below threshold * max(|analytic|, |estimated|, 1).

Objectives (Caffe's GetObjAndGradient): top_id None -> half the sum of squares of all tops (diff = data);
(top_id, index) -> 2 * top[top_id][index] (diff 2 there, 0 elsewhere).
"""
import numpy as np

from pycaffe_dist import common
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2


class GradientChecker:
    def __init__(self, stepsize=1e-2, threshold=1e-3, seed=1701, kink=0.0, kink_range=-1.0):
        self.stepsize, self.threshold, self.seed = stepsize, threshold, seed
        self.kink, self.kink_range = kink, kink_range

    # --- setting up -------------------------------------------------------------------------------------

    @staticmethod
    def make(layer_param, bottoms, phase=caffe_pb2.TRAIN, num_tops=1, seed=1701, dtype=np.float64):
        """Build and set up the layer on copies of `bottoms` (arrays) in `dtype` (float64 for the checks);
        returns (layer, bottom, top)."""
        common.set_random_seed(seed)
        bottom = []
        for x in bottoms:
            blob = Blob(np.shape(x), dtype=dtype)
            blob.data[...] = x
            bottom.append(blob)
        top = [Blob(dtype=dtype) for _ in range(num_tops)]
        layer = create_layer(layer_param, phase)
        layer.setup(bottom, top)
        for blob in layer.blobs:
            blob.astype(dtype)
        return layer, bottom, top

    # --- Caffe's GetObjAndGradient ----------------------------------------------------------------------

    @staticmethod
    def objective(top, top_id, index):
        if top_id is None:
            loss = 0.0
            for blob in top:
                loss += float(np.sum(blob.data.astype(np.float64) ** 2))
                blob.diff[...] = blob.data
            return loss / 2
        for blob in top:
            blob.diff[...] = 0
        top[top_id].diff.reshape(-1)[index] = 2
        return 2 * float(top[top_id].data.reshape(-1)[index])

    def _forward(self, layer, bottom, top):
        common.set_random_seed(self.seed)   # layers that draw (Dropout) draw the same numbers every time
        layer.reshape(bottom, top)
        layer.forward(bottom, top)

    # --- the checks -------------------------------------------------------------------------------------

    def check_single(self, layer, bottom, top, check_bottom=None, top_id=None, index=None, element_wise=False,
                     check_params=True):
        """check_bottom: None = every bottom, an int = that bottom only, -2 = parameters only (Caffe's -1/-2)."""
        checked = []
        if check_params:
            for blob in layer.blobs:
                blob.diff[...] = 0
                checked.append(("param %d" % len(checked), blob))
        if check_bottom is None:
            propagate = [True] * len(bottom)
            checked += [("bottom %d" % i, b) for i, b in enumerate(bottom)]
        elif check_bottom >= 0:
            propagate = [i == check_bottom for i in range(len(bottom))]
            checked.append(("bottom %d" % check_bottom, bottom[check_bottom]))
        else:
            propagate = [False] * len(bottom)
        assert checked, "no blobs to check"
        self._forward(layer, bottom, top)
        self.objective(top, top_id, index)
        layer.backward(top, propagate, bottom)
        computed = [np.array(b.diff, dtype=np.float64).reshape(-1) for _, b in checked]
        failures = []
        for (what, blob), analytic in zip(checked, computed):
            flat = blob.data.reshape(-1)
            for i in range(flat.size):
                estimated = 0.0
                if not element_wise or i == index:
                    flat[i] += self.stepsize
                    self._forward(layer, bottom, top)
                    plus = self.objective(top, top_id, index)
                    flat[i] -= 2 * self.stepsize
                    self._forward(layer, bottom, top)
                    minus = self.objective(top, top_id, index)
                    flat[i] += self.stepsize
                    estimated = (plus - minus) / self.stepsize / 2
                feature = flat[i]
                if self.kink - self.kink_range > abs(feature) or abs(feature) > self.kink + self.kink_range:
                    scale = max(abs(analytic[i]), abs(estimated), 1.0)
                    if abs(analytic[i] - estimated) > self.threshold * scale:
                        failures.append("%s[%d] (top %s, index %s): analytic %.6g, estimated %.6g, x = %.6g"
                                        % (what, i, top_id, index, analytic[i], estimated, feature))
        assert not failures, "%s: %d gradient mismatches, first: %s" % (
            layer.name or layer.param.type, len(failures), "; ".join(failures[:5]))

    def check(self, layer, bottom, top, check_bottom=None):
        """Caffe's CheckGradient: one objective over all tops."""
        self.check_single(layer, bottom, top, check_bottom)

    def check_exhaustive(self, layer, bottom, top, check_bottom=None):
        """Caffe's CheckGradientExhaustive: one objective per top element."""
        self._forward(layer, bottom, top)
        for top_id, blob in enumerate(top):
            for index in range(blob.count):
                self.check_single(layer, bottom, top, check_bottom, top_id, index)

    def check_eltwise(self, layer, bottom, top):
        """Caffe's CheckGradientEltwise: element-wise layers, only the diagonal is differenced."""
        self._forward(layer, bottom, top)
        for top_id, blob in enumerate(top):
            for index in range(blob.count):
                self.check_single(layer, bottom, top, None, top_id, index, element_wise=True)


def layer_param(text):
    """A LayerParameter from prototxt text (name defaults to the type)."""
    from pycaffe_dist.io.prototxt import parse_text
    param = parse_text(text, caffe_pb2.LayerParameter())
    if not param.name:
        param.name = param.type
    return param


def check_layer(text, bottoms, mode="single", phase=caffe_pb2.TRAIN, num_tops=1, check_bottom=None, **checker):
    """Set up the layer given by prototxt `text` on float64 `bottoms` and check its gradients."""
    gc = GradientChecker(**checker)
    layer, bottom, top = gc.make(layer_param(text), bottoms, phase, num_tops, gc.seed)
    if mode == "single":
        gc.check(layer, bottom, top, check_bottom)
    elif mode == "exhaustive":
        gc.check_exhaustive(layer, bottom, top, check_bottom)
    elif mode == "eltwise":
        gc.check_eltwise(layer, bottom, top)
    else:
        raise ValueError(mode)
    return layer, bottom, top
