"""RNN, LSTM and LSTMUnit, after Caffe's src/caffe/layers/recurrent_layer.cpp, rnn_layer.cpp, lstm_layer.cpp and
lstm_unit_layer.cpp.

Caffe builds an unrolled net of InnerProduct/Eltwise/... layers; its parameters are that net's InnerProduct
blobs in the order the unrolled layers are created, which is the order of `self.blobs` here:
  LSTM: W_xc (4H, K), b_c (4H), [W_xc_static (4H, K_static)], W_hc (4H, H)
  RNN:  W_xh (H, K),  b_h (H),  [W_xh_static (H, K_static)],  W_hh (H, H), W_ho (H, H), b_o (H)
with H = num_output, K = prod(x.shape[2:]) and K_static = prod(x_static.shape[1:]).
"""
from ..net.blob import count
from .base import Layer, check_param_shapes
from .registry import register


class _RecurrentLayer(Layer):
    """Caffe's RecurrentLayer. Bottoms: x (T, N, ...), cont (T, N), [x_static (N, ...)], then with expose_hidden
    the initial recurrent states; tops: the output (T, N, num_output), then with expose_hidden the final states.
    Every recurrent state is (1, N, num_output)."""
    recurrent_names = ()       # Caffe's RecurrentInputBlobNames (the final states are named after them)
    gates = 1                  # rows of the input transform per hidden unit

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
        expected = self.param_shapes()
        if self.blobs:
            check_param_shapes(self, expected)
        else:
            fillers = self.param_fillers(rp.weight_filler, rp.bias_filler)
            self.blobs = [self.make_param(shape, f) for shape, f in zip(expected, fillers)]

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


@register("LSTM")
class LSTMLayer(_RecurrentLayer):
    recurrent_names = ("h_0", "c_0")   # lstm_layer.cpp RecurrentInputBlobNames; outputs h_T, c_T

    def param_shapes(self):
        g = 4 * self.num_output
        shapes = [(g, self.input_dim), (g,)]
        if self.static_input:
            shapes.append((g, self.static_dim))
        return shapes + [(g, self.num_output)]

    def param_fillers(self, weight, bias):
        return [weight, bias] + ([weight] if self.static_input else []) + [weight]

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

    def param_shapes(self):
        H = self.num_output
        shapes = [(H, self.input_dim), (H,)]
        if self.static_input:
            shapes.append((H, self.static_dim))
        return shapes + [(H, H), (H, H), (H,)]

    def param_fillers(self, weight, bias):
        return [weight, bias] + ([weight] if self.static_input else []) + [weight, weight, bias]

    def flops(self, bottom, top):
        T, N, H = self.T, self.N, self.num_output
        flops = 2 * T * N * H * (self.input_dim + 2 * H) + 2 * T * N * H        # W_xh x + b_h, W_hh h, W_ho h + b_o
        if self.static_input:
            flops += 2 * N * H * self.static_dim + T * N * H
        return flops + T * N * H * (2 + 4 + 4)   # sums, tanh of h and of o


@register("LSTMUnit")
class LSTMUnitLayer(Layer):
    """One LSTM step. Bottoms: c_prev (1, N, H), gate input x (1, N, 4H), cont (1, N); tops: c, h (1, N, H)."""
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

    def flops(self, bottom, top):
        # per unit: 3 sigmoids + 2 tanh (counted 4 each), c = cont*f*c_prev + i*g (4), h = o*tanh(c) (1)
        return top[0].count * (20 + 5)
