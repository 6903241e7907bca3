"""Shapes, params and checks of RNN, LSTM and LSTMUnit (pycaffe_dist/layers/recurrent.py).

There is no golden case for these types; the expected shapes are Caffe's (recurrent_layer.cpp, lstm_layer.cpp,
rnn_layer.cpp: the InnerProduct blobs of the unrolled net in creation order)."""
import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2


def setup(type_, text, *bottom_shapes, ntop=1, blobs=()):
    lp = parse_text('name: "l" type: "%s" %s' % (type_, text), caffe_pb2.LayerParameter())
    for b in blobs:
        Blob(b).to_proto(proto=lp.blobs.add())
    layer = create_layer(lp)
    bottom, top = [Blob(s) for s in bottom_shapes], [Blob() for _ in range(ntop)]
    layer.setup(bottom, top)
    return layer, bottom, top


def rec(type_, text, *bottom_shapes, **kw):
    return setup(type_, "recurrent_param { %s }" % text, *bottom_shapes, **kw)


T, N, H = 3, 2, 4


@pytest.mark.parametrize("x, static, params", [
    ((T, N, 5), None, [(4 * H, 5), (4 * H,), (4 * H, H)]),
    ((T, N, 2, 3), None, [(4 * H, 6), (4 * H,), (4 * H, H)]),
    ((T, N, 5), (N, 7), [(4 * H, 5), (4 * H,), (4 * H, 7), (4 * H, H)]),
    ((T, N, 5), (N, 2, 3), [(4 * H, 5), (4 * H,), (4 * H, 6), (4 * H, H)]),
])
def test_lstm_shapes(x, static, params):
    bottoms = [x, (T, N)] + ([static] if static else [])
    layer, _, top = rec("LSTM", "num_output: %d" % H, *bottoms)
    assert top[0].shape == (T, N, H)
    assert [b.shape for b in layer.blobs] == params


@pytest.mark.parametrize("x, static, params", [
    ((T, N, 5), None, [(H, 5), (H,), (H, H), (H, H), (H,)]),
    ((T, N, 5), (N, 7), [(H, 5), (H,), (H, 7), (H, H), (H, H), (H,)]),
])
def test_rnn_shapes(x, static, params):
    bottoms = [x, (T, N)] + ([static] if static else [])
    layer, _, top = rec("RNN", "num_output: %d" % H, *bottoms)
    assert top[0].shape == (T, N, H)
    assert [b.shape for b in layer.blobs] == params


def test_expose_hidden():
    state = (1, N, H)
    # LSTM: bottoms x, cont, [x_static], h_0, c_0; tops h, h_T, c_T
    layer, _, top = rec("LSTM", "num_output: %d expose_hidden: true" % H, (T, N, 5), (T, N), state, state, ntop=3)
    assert [t.shape for t in top] == [(T, N, H), state, state] and not layer.static_input
    layer, _, top = rec("LSTM", "num_output: %d expose_hidden: true" % H, (T, N, 5), (T, N), (N, 6), state, state,
                        ntop=3)
    assert layer.static_input and [b.shape for b in layer.blobs][2] == (4 * H, 6)
    layer, _, top = rec("RNN", "num_output: %d expose_hidden: true" % H, (T, N, 5), (T, N), state, ntop=2)
    assert [t.shape for t in top] == [(T, N, H), state]
    with pytest.raises(NetError, match="takes at least 4 bottom"):
        rec("LSTM", "num_output: %d expose_hidden: true" % H, (T, N, 5), (T, N), state, ntop=3)
    with pytest.raises(NetError, match="takes exactly 3 top"):
        rec("LSTM", "num_output: %d expose_hidden: true" % H, (T, N, 5), (T, N), state, state, ntop=1)
    with pytest.raises(NetError, match=r"shape mismatch - recur_input_blobs_\[1\] \(c_0\)"):
        rec("LSTM", "num_output: %d expose_hidden: true" % H, (T, N, 5), (T, N), state, (1, N, H + 1), ntop=3)


def test_blob_counts_without_expose_hidden():
    with pytest.raises(NetError, match="takes at most 3 bottom"):
        rec("RNN", "num_output: 4", (T, N, 5), (T, N), (N, 2), (N, 2))
    with pytest.raises(NetError, match="takes exactly 1 top"):
        rec("RNN", "num_output: 4", (T, N, 5), (T, N), ntop=2)


def test_fillers_and_embedded_weights():
    layer, _, _ = rec("LSTM", 'num_output: 2 weight_filler { type: "constant" value: 0.5 } '
                      'bias_filler { type: "constant" value: 0.25 }', (T, N, 3), (T, N))
    assert [float(b.data.flat[0]) for b in layer.blobs] == [0.5, 0.25, 0.5]
    assert all(np.all(b.data == b.data.flat[0]) for b in layer.blobs)
    layer, _, _ = rec("RNN", "num_output: 2", (T, N, 3), (T, N), blobs=[(2, 3), (2,), (2, 2), (2, 2), (2,)])
    assert [b.shape for b in layer.blobs] == [(2, 3), (2,), (2, 2), (2, 2), (2,)]
    with pytest.raises(NetError, match="Incorrect shape of param blob 2"):
        rec("RNN", "num_output: 2", (T, N, 3), (T, N), blobs=[(2, 3), (2,), (2, 3), (2, 2), (2,)])


def test_reshape_new_batch_but_not_new_time():
    layer, bottom, top = rec("LSTM", "num_output: %d" % H, (T, N, 5), (T, N))
    bottom[0].reshape((T, 6, 5))
    bottom[1].reshape((T, 6))
    layer.reshape(bottom, top)
    assert top[0].shape == (T, 6, H)
    bottom[0].reshape((T + 1, 6, 5))
    bottom[1].reshape((T + 1, 6))
    with pytest.raises(NetError, match="input number of timesteps changed"):
        layer.reshape(bottom, top)


@pytest.mark.parametrize("text, bottoms, message", [
    ("num_output: 4", [(T,), (T, N)], "bottom\\[0\\] must have at least 2 axes"),
    ("num_output: 4", [(T, N, 5), (T, N, 1)], "bottom\\[1\\] must have exactly 2 axes"),
    ("num_output: 4", [(T, N, 5), (T, N + 1)], "cont"),
    ("num_output: 4", [(T, N), (T, N)], "needs a feature axis"),
    ("", [(T, N, 5), (T, N)], "num_output must be positive"),
    ("num_output: 4", [(T, N, 5), (T, N), (N + 1, 3)], "x_static"),
])
def test_recurrent_errors(text, bottoms, message):
    for type_ in ("LSTM", "RNN"):
        with pytest.raises(NetError, match=message):
            rec(type_, text, *bottoms)


def test_recurrent_backward_rules_and_flops():
    layer, bottom, top = rec("RNN", "num_output: 4", (T, N, 5), (T, N))
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    assert layer.flops(bottom, top) > 2 * T * N * H * (5 + 2 * H)


def test_lstm_unit():
    layer, _, top = setup("LSTMUnit", "", (1, N, H), (1, N, 4 * H), (1, N), ntop=2)
    assert [t.shape for t in top] == [(1, N, H)] * 2 and layer.blobs == []
    assert not layer.allow_force_backward(2) and layer.allow_force_backward(1)
    with pytest.raises(NetError, match="4 \\* 4 = 16 features"):
        setup("LSTMUnit", "", (1, N, H), (1, N, 3 * H), (1, N), ntop=2)
    with pytest.raises(NetError, match="bottom\\[2\\] must have 2 axes"):
        setup("LSTMUnit", "", (1, N, H), (1, N, 4 * H), (1, N, 1), ntop=2)
    with pytest.raises(NetError, match="bottom\\[1\\] must be \\(1, #streams"):
        setup("LSTMUnit", "", (1, N, H), (1, N + 1, 4 * H), (1, N), ntop=2)
    with pytest.raises(NetError, match="takes exactly 2 top"):
        setup("LSTMUnit", "", (1, N, H), (1, N, 4 * H), (1, N), ntop=1)
