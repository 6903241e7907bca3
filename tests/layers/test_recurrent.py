"""RNN, LSTM and LSTMUnit forward/backward (pycaffe_dist/layers/recurrent.py): gradients with Caffe's checker (the
settings of test_rnn_layer.cpp / test_lstm_layer.cpp), values against plain numpy recurrences, Caffe's sequence
semantics (cont resets, the state carried between forward passes, no gradient through exposed hidden states).

There is no golden case for these types. Shapes and param order are in test_recurrent_shapes.py."""
import logging

import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.net.net import Net as GraphNet
from pycaffe_dist.pycaffe import Net, TEST, TRAIN
from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.layers import create_layer
from tests.layers.gradient_checker import GradientChecker, layer_param

RNG = np.random.default_rng(31)
# Caffe's tests: weights gaussian std 0.2, biases gaussian std 0.1 (larger here so the recurrence matters).
FILLERS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.3 }'


def recurrent_param(type_, num_output, extra=""):
    return layer_param('name: "rec" type: "%s" recurrent_param { num_output: %d %s %s }'
                       % (type_, num_output, FILLERS, extra))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# --- plain numpy references -------------------------------------------------------------------------------------

def lstm_reference(x, cont, W_xc, b_c, W_hc, W_static=None, x_static=None, h=None, c=None):
    T, N = cont.shape
    H = W_hc.shape[1]
    h = np.zeros((N, H)) if h is None else h
    c = np.zeros((N, H)) if c is None else c
    static = 0 if W_static is None else x_static.reshape(N, -1) @ W_static.T
    out = []
    for t in range(T):
        gates = x[t].reshape(N, -1) @ W_xc.T + b_c + (cont[t][:, None] * h) @ W_hc.T + static
        i, f, o = (sigmoid(gates[:, k * H:(k + 1) * H]) for k in range(3))
        g = np.tanh(gates[:, 3 * H:])
        c = cont[t][:, None] * f * c + i * g
        h = o * np.tanh(c)
        out.append(h)
    return np.stack(out), h, c


def rnn_reference(x, cont, W_xh, b_h, W_hh, W_ho, b_o, W_static=None, x_static=None, h=None):
    T, N = cont.shape
    h = np.zeros((N, W_hh.shape[0])) if h is None else h
    static = 0 if W_static is None else x_static.reshape(N, -1) @ W_static.T
    out = []
    for t in range(T):
        h = np.tanh(x[t].reshape(N, -1) @ W_xh.T + b_h + (cont[t][:, None] * h) @ W_hh.T + static)
        out.append(np.tanh(h @ W_ho.T + b_o))
    return np.stack(out), h


def reference(type_, layer, bottoms):
    """The reference output(s) for the layer's params and float bottoms x, cont, [x_static], [h_0, c_0]."""
    params = [b.data.astype(np.float64) for b in layer.blobs]
    x, cont = bottoms[:2]
    static = {}
    if layer.static_input:
        static = {"W_static": params.pop(2), "x_static": bottoms[2]}
    hidden = [b[0] for b in bottoms[2 + layer.static_input:]]
    state = dict(zip(("h", "c"), hidden))
    if type_ == "LSTM":
        return lstm_reference(x, cont, *params, **static, **state)
    return rnn_reference(x, cont, *params, **static, **state)


def float32_layer(param, bottoms, num_tops=1):
    bottom = []
    for x in bottoms:
        blob = Blob(np.shape(x))
        blob.data[...] = x
        bottom.append(blob)
    top = [Blob() for _ in range(num_tops)]
    layer = create_layer(param)
    layer.setup(bottom, top)
    return layer, bottom, top


# --- LSTMUnit ---------------------------------------------------------------------------------------------------

def unit_bottoms(cont, num=3, hidden=3):
    return [RNG.uniform(-1, 1, (1, num, hidden)), RNG.uniform(-1, 1, (1, num, 4 * hidden)),
            np.asarray(cont, dtype=float).reshape(1, num)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lstm_unit_forward_matches_formula(dtype):
    c_prev, x, cont = unit_bottoms([1, 0, 1], num=3, hidden=4)
    x *= 3     # reach the saturated parts of the sigmoids
    layer, bottom, top = float32_layer(layer_param('type: "LSTMUnit"'), [c_prev, x, cont], num_tops=2)
    for b in bottom + top:
        b.astype(dtype)
    layer.forward(bottom, top)
    c_prev, x, cont = (b.data.astype(np.float64) for b in bottom)     # the values as the layer holds them
    gates = x[0].reshape(3, 4, 4)
    i, f, o, g = sigmoid(gates[:, 0]), sigmoid(gates[:, 1]), sigmoid(gates[:, 2]), np.tanh(gates[:, 3])
    c = cont[0][:, None] * f * c_prev[0] + i * g
    h = o * np.tanh(c)
    assert top[0].data.dtype == dtype and top[1].data.dtype == dtype
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(top[0].data[0], c, rtol=tol, atol=tol)
    np.testing.assert_allclose(top[1].data[0], h, rtol=tol, atol=tol)
    # cont = 0 forgets c_prev: stream 1's c is i * g alone
    np.testing.assert_allclose(top[0].data[0, 1], (i * g)[1], rtol=tol, atol=tol)


@pytest.mark.parametrize("cont", [[0, 0, 0], [1, 0, 1]])    # TestLSTMUnitGradient, TestLSTMUnitGradientNonZeroCont
@pytest.mark.parametrize("check_bottom", [0, 1])             # cont (bottom 2) gets no gradient
def test_lstm_unit_gradient(cont, check_bottom):
    gc = GradientChecker(1e-2, 1e-3)
    layer, bottom, top = gc.make(layer_param('type: "LSTMUnit"'), unit_bottoms(cont), num_tops=2)
    gc.check_exhaustive(layer, bottom, top, check_bottom)


def test_lstm_unit_refuses_gradient_to_cont():
    gc = GradientChecker()
    layer, bottom, top = gc.make(layer_param('type: "LSTMUnit"'), unit_bottoms([1, 1, 1]), num_tops=2)
    layer.forward(bottom, top)
    with pytest.raises(NetError, match="Cannot backpropagate to sequence indicators"):
        layer.backward(top, [True, True, True], bottom)


def test_lstm_unit_respects_propagate_down():
    gc = GradientChecker()
    layer, bottom, top = gc.make(layer_param('type: "LSTMUnit"'), unit_bottoms([1, 1, 1]), num_tops=2)
    layer.forward(bottom, top)
    top[0].diff[...] = 1
    top[1].diff[...] = 1
    bottom[0].diff[...] = 7
    layer.backward(top, [False, True, False], bottom)
    assert np.all(bottom[0].diff == 7) and np.all(bottom[1].diff != 0)


# --- RNN and LSTM: values ---------------------------------------------------------------------------------------

CONT = np.array([[0, 0], [1, 0], [1, 1]], dtype=float)     # stream 1 restarts at t = 1


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
@pytest.mark.parametrize("static, exposed", [(False, False), (True, False), (False, True), (True, True)])
def test_forward_matches_numpy(type_, static, exposed):
    T, N, H = 3, 2, 4
    n_hidden = (2 if type_ == "LSTM" else 1) if exposed else 0
    bottoms = [RNG.standard_normal((T, N, 2, 3)), np.ones((T, N)) if exposed else CONT]
    if static:
        bottoms.append(RNG.standard_normal((N, 5)))
    bottoms += [RNG.standard_normal((1, N, H)) for _ in range(n_hidden)]
    extra = "expose_hidden: true" if exposed else ""
    layer, bottom, top = float32_layer(recurrent_param(type_, H, extra), bottoms, num_tops=1 + n_hidden)
    layer.forward(bottom, top)
    out, *final = reference(type_, layer, [b.data.astype(np.float64) for b in bottom])
    assert top[0].data.dtype == np.float32
    np.testing.assert_allclose(top[0].data, out, rtol=1e-5, atol=1e-6)
    for t, state in zip(top[1:], final):
        np.testing.assert_allclose(t.data[0], state, rtol=1e-5, atol=1e-6)
    if exposed:
        bottom[2 + static].data[...] = 0     # the initial state is read: changing it changes the output
        layer.forward(bottom, top)
        assert np.abs(top[0].data - out).max() > 1e-3


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_cont_zero_cuts_the_past(type_):
    """cont_t = 0 resets a stream: its outputs from t on do not depend on earlier inputs; other streams' do."""
    x = RNG.standard_normal((3, 2, 3))
    layer, bottom, top = float32_layer(recurrent_param(type_, 4), [x, CONT])
    layer.forward(bottom, top)
    before = top[0].data.copy()
    bottom[0].data[0] += 1        # change t = 0 of both streams
    layer.forward(bottom, top)
    after = top[0].data
    assert np.all(after[0] != before[0])
    assert np.abs(after[1:, 0] - before[1:, 0]).min() > 0       # stream 0 continues: everything moves
    np.testing.assert_array_equal(after[1:, 1], before[1:, 1])  # stream 1 restarted at t = 1


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_state_carries_over_between_forward_passes(type_):
    """Caffe's TestForward: a 3-step sequence in one pass equals 3 one-step passes (h_0 = the previous h_T); with
    cont = 0 at every step the one-step passes differ from it after the first step."""
    T, N, H = 3, 3, 5
    x = RNG.standard_normal((T, N, 3, 2))
    cont = (np.arange(T) > 0)[:, None].repeat(N, axis=1).astype(float)
    full, bottom, top = float32_layer(recurrent_param(type_, H), [x, cont])
    full.forward(bottom, top)
    expected = top[0].data.copy()
    for reset in (False, True):
        step, sb, st = float32_layer(recurrent_param(type_, H), [x[:1], cont[:1]])
        for mine, theirs in zip(step.blobs, full.blobs):
            mine.data[...] = theirs.data
        for t in range(T):
            sb[0].data[...] = x[t:t + 1]
            sb[1].data[...] = 0 if reset else t > 0
            step.forward(sb, st)
            if t == 0 or not reset:
                np.testing.assert_allclose(st[0].data[0], expected[t], rtol=1e-5, atol=1e-6)
            else:
                assert np.all(st[0].data[0] != expected[t])


# --- RNN and LSTM: gradients ------------------------------------------------------------------------------------

def make(type_, bottoms, H=2, extra="", num_tops=1):
    gc = GradientChecker(1e-2, 1e-3)
    return gc, gc.make(recurrent_param(type_, H, extra), bottoms, num_tops=num_tops)


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
@pytest.mark.parametrize("T, N, cont", [
    (1, 3, np.zeros((1, 3))),                       # TestGradient (cont never filled: 0)
    (2, 2, (np.arange(4) > 2).reshape(2, 2)),       # TestGradientNonZeroContBufferSize2
    (3, 2, CONT),
])
def test_gradient(type_, T, N, cont):
    """Caffe's checks of bottom 0 (x) and the params; cont = 0 at t = 0, so the carried-over state is cut."""
    gc, (layer, bottom, top) = make(type_, [RNG.uniform(-1, 1, (T, N, 3, 1)), cont.astype(float)])
    gc.check(layer, bottom, top, 0)


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_gradient_exhaustive(type_):
    """CheckGradientExhaustive as Caffe's tests run it (one objective per output element), on a small case."""
    gc, (layer, bottom, top) = make(type_, [RNG.uniform(-1, 1, (2, 2, 2)), (np.arange(4) > 2).reshape(2, 2) * 1.0])
    gc.check_exhaustive(layer, bottom, top, 0)


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
@pytest.mark.parametrize("check_bottom", [0, 2])
def test_gradient_with_static_input(type_, check_bottom):
    """TestGradientNonZeroContBufferSize2WithStaticInput: bottom 0 and bottom 2 (x_static, here (N, 2, 3, 4) as
    Caffe's but smaller)."""
    bottoms = [RNG.uniform(-1, 1, (2, 2, 3)), (np.arange(4) > 2).reshape(2, 2) * 1.0,
               RNG.uniform(-1, 1, (2, 2, 3))]
    gc, (layer, bottom, top) = make(type_, bottoms)
    gc.check(layer, bottom, top, check_bottom)


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_gradient_expose_hidden(type_):
    """With expose_hidden the output depends on h_0 (c_0) through every step (cont = 1). Caffe backpropagates only
    the output top's diff, to x and the params: the objective is each last-step output, one at a time."""
    T, N, H = 2, 2, 2
    n = 2 if type_ == "LSTM" else 1
    bottoms = [RNG.uniform(-1, 1, (T, N, 3)), np.ones((T, N)), RNG.uniform(-1, 1, (N, 2))]
    bottoms += [RNG.uniform(-1, 1, (1, N, H)) for _ in range(n)]
    gc, (layer, bottom, top) = make(type_, bottoms, H, "expose_hidden: true", num_tops=1 + n)
    for index in range((T - 1) * N * H, T * N * H):
        gc.check_single(layer, bottom, top, check_bottom=0, top_id=0, index=index)


@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_exposed_hidden_states_get_no_gradient(type_):
    """recurrent_layer.cpp shares only the data of h_0 / c_0 and of the h_T / c_T tops: their diffs are neither
    written nor read."""
    n = 2 if type_ == "LSTM" else 1
    bottoms = [RNG.standard_normal((2, 2, 3)), np.ones((2, 2))] + [RNG.standard_normal((1, 2, 3)) for _ in range(n)]
    gc, (layer, bottom, top) = make(type_, bottoms, 3, "expose_hidden: true", num_tops=1 + n)
    layer.forward(bottom, top)
    top[0].diff[...] = RNG.standard_normal(top[0].shape)
    for b in bottom[2:]:
        b.diff[...] = 7
    layer.backward(top, [True, False] + [True] * n, bottom)
    grads = [bottom[0].diff.copy()] + [b.diff.copy() for b in layer.blobs]
    assert all(np.all(b.diff == 7) for b in bottom[2:])
    for t in top[1:]:
        t.diff[...] = 100
    for b in layer.blobs:
        b.diff[...] = 0
    layer.backward(top, [True, False] + [True] * n, bottom)
    for got, want in zip([bottom[0].diff] + [b.diff for b in layer.blobs], grads):
        np.testing.assert_array_equal(got, want)


def test_float64_reaches_the_unrolled_net():
    """The checker turns layer.blobs into float64 after setup: the unrolled net uses those very blobs, and its
    intermediate blobs follow the bottoms' dtype."""
    gc, (layer, bottom, top) = make("LSTM", [RNG.standard_normal((3, 2, 3)), CONT, RNG.standard_normal((2, 2))])
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    net = layer.unrolled_net
    by_name = {id(b) for b in layer.blobs}
    assert all(id(b) in by_name for l in net.layers for b in l.blobs)
    assert sum(len(l.blobs) for l in net.layers) == 2 + 1 + 3     # W_xc and b_c, W_xc_static, W_hc once per step
    assert all(net.blob_by_name(n).data.dtype == np.float64 for n in net.blob_names)
    assert top[0].data.dtype == np.float64


# --- param handling ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_", ["LSTM", "RNN"])
def test_param_diffs_accumulate_and_follow_param_propagate_down(type_):
    gc, (layer, bottom, top) = make(type_, [RNG.standard_normal((3, 2, 3)), CONT])
    layer.forward(bottom, top)
    top[0].diff[...] = RNG.standard_normal(top[0].shape)
    layer.backward(top, [True, False], bottom)
    once = [b.diff.copy() for b in layer.blobs]
    assert all(np.abs(d).max() > 0 for d in once)
    layer.backward(top, [True, False], bottom)
    for b, d in zip(layer.blobs, once):
        np.testing.assert_allclose(b.diff, 2 * d)       # Caffe accumulates param diffs
    for b in layer.blobs:
        b.diff[...] = 0
    layer.param_propagate_down[-1] = False
    bottom[0].diff[...] = 7
    layer.backward(top, [False, False], bottom)
    assert np.all(layer.blobs[-1].diff == 0) and np.all(bottom[0].diff == 7)
    for b, d in zip(layer.blobs[:-1], once[:-1]):
        np.testing.assert_allclose(b.diff, d)


NET = """
name: "seq"
force_backward: true
layer { name: "in" type: "Input" top: "x" top: "cont" top: "target"
        input_param { shape { dim: 3 dim: 2 dim: 3 } shape { dim: 3 dim: 2 } shape { dim: 3 dim: 2 dim: 4 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
        recurrent_param { num_output: 4 %s } }
layer { name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }
""" % FILLERS


def test_in_a_net_with_shared_weights():
    """In a Net: filled params in Caffe's order, forward as the reference, a loss gradient reaches x; a test net
    sharing the train net's weights (Net.share_with shares their data) uses them at its next forward."""
    param = parse_text(NET, caffe_pb2.NetParameter())
    train = Net(param, phase=TRAIN)
    x = RNG.standard_normal((3, 2, 3))
    train.blobs["x"].data[...] = x
    train.blobs["cont"].data[...] = CONT
    train.blobs["target"].data[...] = 0
    train.forward()
    layer = train.layer_dict["lstm"]
    assert [b.shape for b in train.params["lstm"]] == [(16, 3), (16,), (16, 4)]
    out, _, _ = reference("LSTM", layer, [x, CONT])
    np.testing.assert_allclose(train.blobs["h"].data, out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(train.blobs["loss"].data, (out ** 2).sum() / 2 / 3, rtol=1e-5)
    train.backward()
    assert np.abs(train.blobs["x"].diff).max() > 0 and all(np.abs(b.diff).max() > 0 for b in layer.blobs)

    test = Net(param, phase=TEST)
    test.share_with(train)
    test.blobs["x"].data[...] = x
    test.blobs["cont"].data[...] = CONT
    test.forward()
    np.testing.assert_array_equal(test.blobs["h"].data, train.blobs["h"].data)


def test_setting_up_a_net_allocates_nothing():
    """Shape-only nets (net-info) stay unallocated: the bottoms and tops are shared with the unrolled net only at
    forward time."""
    net = GraphNet(parse_text(NET, caffe_pb2.NetParameter()), fill_params=False)
    for name in ("x", "cont", "h"):
        assert net.blob_by_name(name).data_memory is None and net.blob_by_name(name).diff_memory is None
    assert all(b.data_memory is None for b in net.layers[net.layer_index("lstm")].blobs)


def test_debug_info_logs_the_unrolled_net(caplog):
    gc, (layer, bottom, top) = make("RNN", [RNG.standard_normal((2, 2, 3)), np.ones((2, 2))], 3, "debug_info: true")
    with caplog.at_level(logging.INFO, logger="pycaffe_dist"):
        layer.forward(bottom, top)
        layer.backward(top, [True, False], bottom)
    text = caplog.text
    assert "[Forward] Layer rec_h_neuron_2, top blob h_2 data:" in text
    assert "[Backward] Layer rec_x_transform, bottom blob x diff:" in text
    assert "[Backward] Layer rec_W_ho_h_1, param blob 0 diff:" in text
