"""RNN, LSTM and LSTMUnit, after Caffe's src/caffe/layers/recurrent_layer.cpp, rnn_layer.cpp, lstm_layer.cpp and
lstm_unit_layer.cpp.

RNN and LSTM build, as Caffe does, an unrolled net of InnerProduct/Eltwise/Scale/Slice/Concat/Reshape/TanH/
LSTMUnit layers (one group per time step, weights shared by ParamSpec name) and run its forward and backward.
Their blobs are that net's learnable params, in the order its layers create them:
  LSTM: W_xc (4H, K), b_c (4H), [W_xc_static (4H, K_static)], W_hc (4H, H)
  RNN:  W_xh (H, K),  b_h (H),  [W_xh_static (H, K_static)],  W_hh (H, H), W_ho (H, H), b_o (H)
with H = num_output, K = prod(x.shape[2:]) and K_static = prod(x_static.shape[1:]).

Caffe's quirks kept: without expose_hidden the state carries over between forward passes (h_0 = the last h_T;
cont = 0 at t = 0 resets it); with expose_hidden, h_0 / c_0 are read but get no gradient and the diffs of the
h_T / c_T tops are ignored ("we can't backpropagate across batches").

On the GPU path the unrolled net runs its layers' GPU code (LSTMUnit's kernels are csrc/cuda/recurrent.cu, after
lstm_unit_layer.cu) on device memory shared with the layer's bottoms and tops, as Caffe's RecurrentLayer::Forward_gpu
runs unrolled_net_->ForwardTo: nothing crosses to the host but the loss weight's scalar.
"""
import numpy as np

from ..backend import select
from ..blob.blob import count
from ..proto import caffe_pb2
from .base import Layer, check_param_shapes
from .registry import register


def _add_layer(net, type_, name, bottom=(), top=()):
    lp = net.layer.add(type=type_, name=name)
    lp.bottom.extend(bottom)
    lp.top.extend(top)
    return lp


def _add_inner_product(net, name, bottom, top, num_output, axis, params, weight_filler, bias_filler=None,
                       propagate_down=False):
    """Caffe's hidden_param (no bias) or biased_hidden_param, with its params named for sharing."""
    lp = _add_layer(net, "InnerProduct", name, [bottom], [top])
    ip = lp.inner_product_param
    ip.num_output, ip.axis, ip.bias_term = num_output, axis, bias_filler is not None
    ip.weight_filler.CopyFrom(weight_filler)
    if bias_filler is not None:
        ip.bias_filler.CopyFrom(bias_filler)
    for param_name in params:
        lp.param.add(name=param_name)
    if propagate_down:
        lp.propagate_down.append(True)
    return lp


def _add_state_input(net, names, num, num_output):
    layer = _add_layer(net, "Input", "", top=names)
    for _ in names:
        layer.input_param.shape.add().dim.extend((1, num, num_output))   # a single time step


def _add_static_transform(net, name, num_output, weight_filler, param):
    """x_static (N, ...) -> (1, N, num_output), added to every time step's input sum."""
    _add_inner_product(net, name, "x_static", name + "_preshape", num_output, 1, [param], weight_filler,
                       propagate_down=True)
    reshape = _add_layer(net, "Reshape", name + "_reshape", [name + "_preshape"], [name])
    reshape.reshape_param.shape.dim.extend((1, -1, num_output))


def _add_slice(net, name, bottom, tops):
    _add_layer(net, "Slice", name, [bottom], tops).slice_param.axis = 0


def _add_cont_scale(net, t):
    """h_conted_{t-1} = cont_t * h_{t-1}: cont_t = 0 flushes the state at the start of a sequence."""
    scale = _add_layer(net, "Scale", "h_conted_%d" % (t - 1), ["h_%d" % (t - 1), "cont_%d" % t],
                       ["h_conted_%d" % (t - 1)])
    scale.scale_param.axis = 0


def _add_sum(net, name, bottoms, top):
    _add_layer(net, "Eltwise", name, bottoms, [top]).eltwise_param.operation = caffe_pb2.EltwiseParameter.SUM


class _RecurrentLayer(Layer):
    """Caffe's RecurrentLayer. Bottoms: x (T, N, ...), cont (T, N), [x_static (N, ...)], then with expose_hidden
    the initial recurrent states; tops: the output (T, N, num_output), then with expose_hidden the final states.
    Every recurrent state is (1, N, num_output)."""
    recurrent_names = ()       # Caffe's RecurrentInputBlobNames (the final states are named after them)
    output_name = None         # Caffe's OutputBlobNames: the unrolled net's blob that is top[0]

    @property
    def _num_hidden_exposed(self):
        return len(self.recurrent_names) if self.param.recurrent_param.expose_hidden else 0

    @property
    def min_bottom(self):
        return 2 + self._num_hidden_exposed

    @property
    def max_bottom(self):
        return 3 + self._num_hidden_exposed

    @property
    def exact_num_top(self):
        return 1 + self._num_hidden_exposed

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1   # "Can't propagate to sequence continuation indicators."

    def layer_setup(self, bottom, top):
        rp = self.param.recurrent_param
        self.num_output = rp.num_output
        self._check_inputs(bottom)
        self.T, self.N = bottom[0].shape[:2]
        self.static_input = len(bottom) > 2 + self._num_hidden_exposed
        self.check(self.num_output > 0, "num_output must be positive")
        self.check(len(bottom[0].shape) >= 3, "bottom[0] (x) needs a feature axis: (#timesteps, #streams, ...), "
                   "got %s (the input transform is an InnerProduct with axis 2)" % (bottom[0].shape,))
        self.input_dim = count(bottom[0].shape, 2)
        if self.static_input:
            s = bottom[2].shape
            self.check(len(s) >= 1 and s[0] == self.N, "bottom[2] (x_static) must be (#streams, ...) with "
                       "#streams = %d, got %s" % (self.N, s))
            self.check(len(s) >= 2, "bottom[2] (x_static) needs a feature axis: (#streams, ...), got %s" % (s,))
            self.static_dim = count(s, 1)
        self._build_unrolled_net(bottom)
        owners = self.unrolled_net.learnable_params
        if self.blobs:
            check_param_shapes(self, [b.shape for b in owners])
            self._bind_params()
        else:
            self.blobs = list(owners)    # unfilled until first used, like every layer's params

    def _build_unrolled_net(self, bottom):
        from ..net.net import Net    # not at import time: pycaffe_dist.net imports this package
        net_param = caffe_pb2.NetParameter()
        inputs = ["x", "cont"] + (["x_static"] if self.static_input else [])
        layer = _add_layer(net_param, "Input", "", top=inputs)
        for blob in bottom[:len(inputs)]:
            layer.input_param.shape.add().dim.extend(blob.shape)
        self.fill_unrolled_net(net_param)
        prefix = self.name + "_" if self.name else ""
        for lp in net_param.layer:
            lp.name = prefix + lp.name
        # A "pseudo-loss" on the output makes the net backpropagate to it (force_backward would also reach cont);
        # it never runs.
        pseudo_loss = self.output_name + "_pseudoloss"
        _add_layer(net_param, "Reduction", pseudo_loss, [self.output_name], [pseudo_loss]).loss_weight.append(1)

        # Phase TEST, as Caffe's (its NetParameter has no state); params filled when first used.
        net = self.unrolled_net = Net(net_param, fill_params=False)
        net.debug_info = self.param.recurrent_param.debug_info
        self.last_layer = net.layer_index(pseudo_loss) - 1
        self.input_blobs = [net.blob_by_name(name) for name in inputs]
        self.recur_input_blobs = [net.blob_by_name(name) for name in self.recurrent_names]
        self.recur_output_blobs = [net.blob_by_name(name) for name in self.recurrent_output_names()]
        self.output_blob = net.blob_by_name(self.output_name)
        self.inner_blobs = [net.blob_by_name(name) for name in net.blob_names]
        self.inner_dtype = np.dtype(np.float32)
        # Layers reading x / x_static (their gradients follow propagate_down) and, for every param slot of every
        # layer, the index of its blob in self.blobs.
        self.input_transforms = [net.layer_index(prefix + name) for name in self.input_transform_names()]
        self.param_slots = [(net.layers[l], p, k) for (l, p), k in zip(net.param_layer_index,
                                                                       net.learnable_param_ids)]

    def _bind_params(self):
        """Caffe's unrolled_net_->ShareWeights(): every time step uses this layer's blobs, also after someone
        replaced them."""
        if all(layer.blobs[p] is self.blobs[k] for layer, p, k in self.param_slots):
            return
        for layer, p, k in self.param_slots:
            layer.blobs[p] = self.blobs[k]
        self.unrolled_net.share_weights()

    def _check_inputs(self, bottom):
        x, cont = bottom[0].shape, bottom[1].shape
        self.check(len(x) >= 2, "bottom[0] must have at least 2 axes -- (#timesteps, #streams, ...)")
        self.check(len(cont) == 2, "bottom[1] must have exactly 2 axes -- (#timesteps, #streams)")
        self.check(cont == x[:2], "bottom[1] (cont) has shape %s; it must be (#timesteps, #streams) = %s"
                   % (cont, x[:2]))

    def reshape(self, bottom, top):
        self._check_inputs(bottom)
        self.check(bottom[0].shape[0] == self.T, "input number of timesteps changed")
        self.check(count(bottom[0].shape, 2) == self.input_dim, "bottom[0] has %d features per timestep; the "
                   "layer was set up for %d" % (count(bottom[0].shape, 2), self.input_dim))
        self.N = bottom[0].shape[1]
        state = (1, self.N, self.num_output)
        if self.static_input:
            s = bottom[2].shape
            self.check(len(s) >= 2 and s[0] == self.N and count(s, 1) == self.static_dim,
                       "bottom[2] (x_static) has shape %s; expected (%d, ...) with %d features"
                       % (s, self.N, self.static_dim))
        offset = 2 + self.static_input
        for j, b in enumerate(bottom[offset:]):
            self.check(b.shape == state, "shape mismatch - recur_input_blobs_[%d] (%s): %s vs. bottom[%d]: %s"
                       % (j, self.recurrent_names[j], state, offset + j, b.shape))
        top[0].reshape((self.T, self.N, self.num_output))
        for t in top[1:]:
            t.reshape(state)
        self._reshape_unrolled(bottom, state)

    def _reshape_unrolled(self, bottom, state):
        """Caffe's Reshape of the unrolled net. The bottoms and tops are shared with it at forward time (Caffe does
        it here), so that setting up a net for its shapes allocates nothing."""
        dtype = bottom[0].dtype
        if dtype != self.inner_dtype:    # float64 under the gradient checker: the inner blobs follow the bottoms
            for blob in self.inner_blobs:
                blob.astype(dtype)
            self.inner_dtype = dtype
        for blob, b in zip(self.input_blobs, bottom):
            blob.reshape(b.shape)
        for blob in self.recur_input_blobs:
            blob.reshape(state)
        self.unrolled_net.reshape()

    def forward(self, bottom, top):
        self._forward(bottom, top, gpu=False)

    def forward_gpu(self, bottom, top):
        self._forward(bottom, top, gpu=True)

    def _forward(self, bottom, top, gpu):
        """Caffe's RecurrentLayer::Forward_cpu / Forward_gpu: the unrolled net runs on the same path (`gpu`)."""
        self._bind_params()
        for blob, b in zip(self.input_blobs, bottom):
            blob.share_data(b)
        # Caffe shares the diffs of x and x_static, not of cont: the input transforms write the bottoms' gradients.
        self.input_blobs[0].share_diff(bottom[0])
        if self.static_input:
            self.input_blobs[2].share_diff(bottom[2])
        if self._num_hidden_exposed:     # h_0 (c_0) share their data only: Caffe gives them no gradient
            for blob, b in zip(self.recur_input_blobs, bottom[2 + self.static_input:]):
                blob.share_data(b)
        else:
            for blob_0, blob_T in zip(self.recur_input_blobs, self.recur_output_blobs):
                # the state carries over from the previous forward pass (recurrent_layer.cu: caffe_copy on the
                # device)
                if gpu:
                    select.current().copy(blob_0.mutable_gpu_data, blob_T.gpu_data)
                else:
                    blob_0.data[...] = blob_T.data
        self.unrolled_net.forward_from_to(0, self.last_layer, gpu=gpu)
        # top[0] shares the output blob's data and diff, after the forward: with one time step the output Concat
        # shares h_1's memory only then. The final states share their data only; their diffs are not used.
        top[0].share_data(self.output_blob)
        top[0].share_diff(self.output_blob)
        if self.loss_weights[0]:
            if gpu:
                select.current().fill(top[0].mutable_gpu_diff, self.loss_weights[0])
            else:
                top[0].diff[...] = self.loss_weights[0]
        for t, blob in zip(top[1:], self.recur_output_blobs):
            t.share_data(blob)

    def backward(self, top, propagate_down, bottom):
        self._backward(top, propagate_down, bottom, gpu=False)

    def backward_gpu(self, top, propagate_down, bottom):
        self._backward(top, propagate_down, bottom, gpu=True)

    def _backward(self, top, propagate_down, bottom, gpu):
        # Caffe backpropagates into x / x_static and every param unconditionally; we skip what is not asked for.
        net = self.unrolled_net
        for layer_id, i in zip(self.input_transforms, (0, 2)):
            net.bottom_need_backward[layer_id][0] = propagate_down[i]
        for layer, p, k in self.param_slots:
            layer.param_propagate_down[p] = self.param_propagate_down[k]
        net.backward_from_to(self.last_layer, 0, gpu=gpu)

    def input_transform_names(self):
        return ["x_transform"] + ([self.static_transform_name] if self.static_input else [])


@register("LSTM")
class LSTMLayer(_RecurrentLayer):
    recurrent_names = ("h_0", "c_0")   # lstm_layer.cpp RecurrentInputBlobNames; outputs h_T, c_T
    output_name = "h"
    static_transform_name = "W_xc_x_static"

    def recurrent_output_names(self):
        return ["h_%d" % self.T, "c_T"]

    def fill_unrolled_net(self, net):
        """lstm_layer.cpp FillUnrolledNet: per step, gate_input_t = W_hc h_conted_{t-1} + W_xc x_t + b_c
        [+ W_xc_static x_static], then LSTMUnit(c_{t-1}, gate_input_t, cont_t) -> c_t, h_t."""
        rp = self.param.recurrent_param
        T, G = self.T, 4 * self.num_output
        _add_state_input(net, ["c_0", "h_0"], self.N, self.num_output)
        _add_slice(net, "cont_slice", "cont", ["cont_%d" % t for t in range(1, T + 1)])
        _add_inner_product(net, "x_transform", "x", "W_xc_x", G, 2, ["W_xc", "b_c"], rp.weight_filler,
                           rp.bias_filler, propagate_down=True)
        if self.static_input:
            _add_static_transform(net, "W_xc_x_static", G, rp.weight_filler, "W_xc_static")
        _add_slice(net, "W_xc_x_slice", "W_xc_x", ["W_xc_x_%d" % t for t in range(1, T + 1)])
        for t in range(1, T + 1):
            _add_cont_scale(net, t)
            _add_inner_product(net, "transform_%d" % t, "h_conted_%d" % (t - 1), "W_hc_h_%d" % (t - 1), G, 2,
                               ["W_hc"], rp.weight_filler)
            _add_sum(net, "gate_input_%d" % t, ["W_hc_h_%d" % (t - 1), "W_xc_x_%d" % t] +
                     (["W_xc_x_static"] if self.static_input else []), "gate_input_%d" % t)
            _add_layer(net, "LSTMUnit", "unit_%d" % t, ["c_%d" % (t - 1), "gate_input_%d" % t, "cont_%d" % t],
                       ["c_%d" % t, "h_%d" % t])
        _add_layer(net, "Split", "", ["c_%d" % T], ["c_T"])
        _add_layer(net, "Concat", "h_concat", ["h_%d" % t for t in range(1, T + 1)], ["h"]).concat_param.axis = 0

    def flops(self, bottom, top):
        T, N, H = self.T, self.N, self.num_output
        gemm = 2 * T * N * 4 * H * (self.input_dim + H) + T * N * 4 * H      # W_xc x + b_c, W_hc h
        if self.static_input:
            gemm += 2 * N * 4 * H * self.static_dim + T * N * 4 * H
        # per unit and step: gate sums (4 adds), 3 sigmoids + 2 tanh (counted 4 each), c and h products (4)
        return gemm + T * N * H * (4 + 20 + 4)


@register("RNN")
class RNNLayer(_RecurrentLayer):
    recurrent_names = ("h_0",)          # rnn_layer.cpp; output h_T
    output_name = "o"
    static_transform_name = "W_xh_x_static"

    def recurrent_output_names(self):
        return ["h_%d" % self.T]

    def fill_unrolled_net(self, net):
        """rnn_layer.cpp FillUnrolledNet: h_t = tanh(W_hh h_conted_{t-1} + W_xh x_t + b_h [+ W_xh_static x_static]),
        o_t = tanh(W_ho h_t + b_o)."""
        rp = self.param.recurrent_param
        T, H = self.T, self.num_output
        _add_state_input(net, ["h_0"], self.N, H)
        _add_slice(net, "cont_slice", "cont", ["cont_%d" % t for t in range(1, T + 1)])
        _add_inner_product(net, "x_transform", "x", "W_xh_x", H, 2, ["W_xh", "b_h"], rp.weight_filler,
                           rp.bias_filler, propagate_down=True)
        if self.static_input:
            _add_static_transform(net, "W_xh_x_static", H, rp.weight_filler, "W_xh_static")
        _add_slice(net, "W_xh_x_slice", "W_xh_x", ["W_xh_x_%d" % t for t in range(1, T + 1)])
        for t in range(1, T + 1):
            _add_cont_scale(net, t)
            _add_inner_product(net, "W_hh_h_%d" % (t - 1), "h_conted_%d" % (t - 1), "W_hh_h_%d" % (t - 1), H, 2,
                               ["W_hh"], rp.weight_filler)
            _add_sum(net, "h_input_sum_%d" % t, ["W_hh_h_%d" % (t - 1), "W_xh_x_%d" % t] +
                     (["W_xh_x_static"] if self.static_input else []), "h_neuron_input_%d" % t)
            _add_layer(net, "TanH", "h_neuron_%d" % t, ["h_neuron_input_%d" % t], ["h_%d" % t])
            _add_inner_product(net, "W_ho_h_%d" % t, "h_%d" % t, "W_ho_h_%d" % t, H, 2, ["W_ho", "b_o"],
                               rp.weight_filler, rp.bias_filler)
            _add_layer(net, "TanH", "o_neuron_%d" % t, ["W_ho_h_%d" % t], ["o_%d" % t])
        _add_layer(net, "Concat", "o_concat", ["o_%d" % t for t in range(1, T + 1)], ["o"]).concat_param.axis = 0

    def flops(self, bottom, top):
        T, N, H = self.T, self.N, self.num_output
        flops = 2 * T * N * H * (self.input_dim + 2 * H) + 2 * T * N * H        # W_xh x + b_h, W_hh h, W_ho h + b_o
        if self.static_input:
            flops += 2 * N * H * self.static_dim + T * N * H
        return flops + T * N * H * (2 + 4 + 4)   # sums, tanh of h and of o


def _sigmoid(x):
    with np.errstate(over="ignore"):     # exp(-x) overflows to inf for x << 0: the sigmoid is then 0, as in Caffe
        return 1 / (1 + np.exp(-x))


@register("LSTMUnit")
class LSTMUnitLayer(Layer):
    """One LSTM step. Bottoms: c_prev (1, N, H), gate input x (1, N, 4H) = (i, f, o, g) pre-activations, cont (1, N);
    tops: c = cont * f * c_prev + i * g and h = o * tanh(c), with i, f, o sigmoids and g a tanh (1, N, H)."""
    exact_num_bottom = 3
    exact_num_top = 2

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2   # "Can't propagate to sequence continuation indicators."

    def reshape(self, bottom, top):
        c_prev, x, cont = (b.shape for b in bottom)
        num = c_prev[1] if len(c_prev) > 1 else None
        for i, s in enumerate((c_prev, x, cont)):
            self.check(len(s) == (2 if i == 2 else 3), "bottom[%d] must have %d axes, got shape %s"
                       % (i, 2 if i == 2 else 3, s))
            self.check(s[0] == 1 and s[1] == num, "bottom[%d] must be (1, #streams = %s, ...), got %s" % (i, num, s))
        self.hidden_dim = c_prev[2]
        self.check(x[2] == 4 * self.hidden_dim, "bottom[1] (gate input) must have 4 * %d = %d features, got %d"
                   % (self.hidden_dim, 4 * self.hidden_dim, x[2]))
        for t in top:
            t.reshape(c_prev)

    def forward(self, bottom, top):
        c_prev, x, cont = bottom[0].data[0], bottom[1].data[0], bottom[2].data[0]
        num, H = c_prev.shape
        ifo = _sigmoid(x[:, :3 * H]).reshape(num, 3, H)
        i, f, o = ifo[:, 0], ifo[:, 1], ifo[:, 2]
        f *= cont[:, None]       # Caffe: f = cont == 0 ? 0 : cont * sigmoid(f')
        g = np.tanh(x[:, 3 * H:])
        c = top[0].data[0]
        np.multiply(f, c_prev, out=c)
        c += i * g
        tanh_c = np.tanh(c)
        np.multiply(o, tanh_c, out=top[1].data[0])
        self.saved = (i, f, o, g, tanh_c)    # Caffe recomputes these in its backward

    def backward(self, top, propagate_down, bottom):
        self.check(not propagate_down[2], "Cannot backpropagate to sequence indicators.")
        i, f, o, g, tanh_c = self.saved
        c_diff, h_diff = top[0].diff[0], top[1].diff[0]
        c_term = c_diff + h_diff * o * (1 - tanh_c * tanh_c)
        if propagate_down[0]:
            np.multiply(c_term, f, out=bottom[0].diff[0])
        if propagate_down[1]:
            num, H = i.shape
            x_diff = bottom[1].diff[0].reshape(num, 4, H)
            x_diff[:, 0] = c_term * g * i * (1 - i)
            x_diff[:, 1] = c_term * bottom[0].data[0] * f * (1 - f)
            x_diff[:, 2] = h_diff * tanh_c * o * (1 - o)
            x_diff[:, 3] = c_term * i * (1 - g * g)

    def forward_gpu(self, bottom, top):
        # lstm_unit_layer.cu's LSTMActsForward and LSTMUnitForward in one kernel, one thread per hidden unit
        select.current().launch("lstm_unit_forward", top[0].count, self.hidden_dim, bottom[0].gpu_data,
                                bottom[1].gpu_data, bottom[2].gpu_data, top[0].mutable_gpu_data,
                                top[1].mutable_gpu_data)

    def backward_gpu(self, top, propagate_down, bottom):
        self.check(not propagate_down[2], "Cannot backpropagate to sequence indicators.")
        if not (propagate_down[0] or propagate_down[1]):
            return
        # LSTMUnitBackward and LSTMActsBackward in one kernel; a bottom not asked for is passed read-only and not
        # written
        c_prev_diff, x_diff = (b.mutable_gpu_diff if down else b.gpu_diff
                               for b, down in zip(bottom[:2], propagate_down[:2]))
        select.current().launch("lstm_unit_backward", top[0].count, self.hidden_dim, bottom[0].gpu_data,
                                bottom[1].gpu_data, bottom[2].gpu_data, top[0].gpu_data, top[0].gpu_diff,
                                top[1].gpu_diff, int(propagate_down[0]), int(propagate_down[1]), c_prev_diff, x_diff)

    def flops(self, bottom, top):
        # per unit: 3 sigmoids + 2 tanh (counted 4 each), c = cont*f*c_prev + i*g (4), h = o*tanh(c) (1)
        return top[0].count * (20 + 5)
