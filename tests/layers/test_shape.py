"""Forward and backward of the layers of pycaffe_dist/layers/shape.py: Caffe's gradient checks (settings of
Caffe's test_*_layer.cpp on smaller blobs), numpy references where the golden cases do not reach, memory sharing
and errors. test_arithmetic.py and test_reduction.py use its helpers (gaussian, run, backward)."""
import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from tests.layers.gradient_checker import GradientChecker, check_layer, layer_param


def gaussian(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def run(text, bottoms, num_tops=1, dtype=np.float64):
    """Set up the layer on copies of `bottoms` and run reshape + forward; returns (layer, bottom, top)."""
    layer, bottom, top = GradientChecker.make(layer_param(text), bottoms, num_tops=num_tops, dtype=dtype)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


def backward(layer, top, bottom, top_diffs, propagate_down=None):
    for t, d in zip(top, top_diffs):
        t.diff[...] = d
    layer.backward(top, propagate_down or [True] * len(bottom), bottom)


# --- Split, Concat, Slice --------------------------------------------------------------------------------------

def test_split_gradient():
    check_layer('type: "Split"', [gaussian(2, 3, 2)], mode="eltwise", num_tops=3)


def test_split_shares_data_and_sums_diffs():
    layer, bottom, top = run('type: "Split"', [gaussian(2, 3)], num_tops=3)
    bottom[0].data[0, 0] = 7.0
    assert all(t.data[0, 0] == 7.0 for t in top)          # ShareData: no copy
    diffs = [gaussian(2, 3, seed=i) for i in range(3)]
    backward(layer, top, bottom, diffs)
    np.testing.assert_allclose(bottom[0].diff, diffs[0] + diffs[1] + diffs[2])
    layer, bottom, top = run('type: "Split"', [gaussian(2, 3)], num_tops=1)
    backward(layer, top, bottom, [diffs[0]])
    np.testing.assert_array_equal(bottom[0].diff, diffs[0])


@pytest.mark.parametrize("param,shapes", [
    ("concat_param { axis: 0 }", [(2, 3, 2), (1, 3, 2)]),
    ("", [(2, 3, 2), (2, 1, 2), (2, 2, 2)]),
    ("concat_param { concat_dim: 2 }", [(2, 1, 2), (2, 1, 3)]),
    ("concat_param { axis: -1 }", [(2, 2), (2, 3)]),
])
def test_concat_gradient(param, shapes):
    check_layer('type: "Concat" ' + param, [gaussian(*s, seed=i) for i, s in enumerate(shapes)], mode="exhaustive")


def test_concat_gradient_of_one_bottom_only():
    # Caffe's TestGradientChannelBottomOneOnly
    check_layer('type: "Concat"', [gaussian(2, 3, 2), gaussian(2, 2, 2, seed=1)], check_bottom=1)


def test_concat_forward_backward_reference():
    xs = [gaussian(2, 1, 3), gaussian(2, 2, 3, seed=1)]
    layer, bottom, top = run('type: "Concat"', xs)
    np.testing.assert_array_equal(top[0].data, np.concatenate(xs, axis=1))
    d = gaussian(2, 3, 3, seed=2)
    bottom[0].diff[...] = 5      # skipped bottoms keep their diff
    backward(layer, top, bottom, [d], [False, True])
    np.testing.assert_array_equal(bottom[0].diff, 5)
    np.testing.assert_array_equal(bottom[1].diff, d[:, 1:])


def test_concat_and_slice_of_one_blob_share_memory():
    for text in ('type: "Concat"', 'type: "Slice"'):
        layer, bottom, top = run(text, [gaussian(2, 3)])
        top[0].data[1, 2] = 9.0
        top[0].diff[0, 1] = 4.0
        assert bottom[0].data[1, 2] == 9.0 and bottom[0].diff[0, 1] == 4.0
        layer.backward(top, [True], bottom)
        assert bottom[0].diff[0, 1] == 4.0


@pytest.mark.parametrize("param,shape,ntop", [
    ("slice_param { axis: 0 }", (4, 3, 2), 2),                                  # TestGradientAcrossNum
    ("slice_param { slice_point: 1 slice_point: 3 }", (2, 4, 2), 3),            # TestGradientAcrossChannels
    ("slice_param { slice_dim: 2 slice_point: 1 }", (2, 2, 3), 2),
    ("slice_param { axis: -1 }", (2, 2, 4), 2),
])
def test_slice_gradient(param, shape, ntop):
    check_layer('type: "Slice" ' + param, [gaussian(*shape)], mode="exhaustive", num_tops=ntop)


def test_slice_forward_backward_reference():
    x = gaussian(2, 6, 2)
    layer, bottom, top = run('type: "Slice" slice_param { slice_point: 1 slice_point: 4 }', [x], num_tops=3)
    for t, part in zip(top, np.split(x, [1, 4], axis=1)):
        np.testing.assert_array_equal(t.data, part)
    diffs = [gaussian(*t.shape, seed=i) for i, t in enumerate(top)]
    backward(layer, top, bottom, diffs)
    np.testing.assert_array_equal(bottom[0].diff, np.concatenate(diffs, axis=1))
    bottom[0].diff[...] = 3
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 3)


# --- Flatten, Reshape ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    'type: "Flatten"',
    'type: "Flatten" flatten_param { axis: 2 }',
    'type: "Reshape" reshape_param { shape { dim: 0 dim: -1 } }',
    'type: "Reshape" reshape_param { shape { dim: 2 dim: 2 } axis: 1 num_axes: 1 }',
])
def test_flatten_reshape_gradient(text):
    check_layer(text, [gaussian(2, 4, 3)], mode="eltwise")


@pytest.mark.parametrize("text", ['type: "Flatten"', 'type: "Reshape" reshape_param { shape { dim: -1 dim: 2 } }'])
def test_flatten_reshape_share_memory(text):
    layer, bottom, top = run(text, [gaussian(2, 3, 2)], dtype=np.float32)
    assert top[0].dtype == np.float32 and top[0].count == 12 and top[0].shape != bottom[0].shape
    top[0].data.reshape(-1)[5] = 11.0
    assert bottom[0].data.reshape(-1)[5] == 11.0
    bottom[0].data.reshape(-1)[7] = -3.0
    assert top[0].data.reshape(-1)[7] == -3.0
    d = gaussian(*top[0].shape, seed=1)
    top[0].diff[...] = d                 # what the next layer's backward does
    np.testing.assert_array_equal(bottom[0].diff.reshape(-1), d.reshape(-1).astype(np.float32))
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff.reshape(-1), d.reshape(-1).astype(np.float32))
    # a new batch size: the bottom gets new memory, the next forward shares it again
    bottom[0].reshape(4, 3, 2)
    bottom[0].data[...] = 1.5
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    assert top[0].count == 24 and np.all(top[0].data == 1.5)
    top[0].diff[...] = 2.0
    assert np.all(bottom[0].diff == 2.0)


def test_reshape_top_keeps_its_loss_weight():
    # Caffe shares the diff before SetLossWeights writes the weight into it: the bottom's producer sees it.
    text = 'type: "Flatten" loss_weight: 0.5'
    layer, bottom, top = run(text, [gaussian(2, 3, 2)])
    assert np.all(top[0].diff == 0.5) and np.all(bottom[0].diff == 0.5)


# --- Crop, Tile ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("param,shapes", [
    ("crop_param { axis: 0 offset: 1 offset: 0 offset: 1 offset: 2 }", [(3, 2, 3, 4), (2, 2, 2, 2)]),  # all axes
    ("crop_param { axis: 2 offset: 1 }", [(2, 2, 4, 3), (1, 1, 2, 2)]),
    ("crop_param { axis: 1 offset: 0 offset: 1 offset: 0 offset: 2 }", [(1, 2, 3, 2, 4), (1, 2, 2, 2, 2)]),  # 5-D
])
def test_crop_gradient(param, shapes):
    check_layer('type: "Crop" ' + param, [gaussian(*s, seed=i) for i, s in enumerate(shapes)],
                mode="exhaustive", check_bottom=0)


def test_crop_forward_backward_reference():
    x = gaussian(2, 3, 5, 6)
    layer, bottom, top = run('type: "Crop" crop_param { axis: 2 offset: 1 offset: 2 }', [x, np.zeros((1, 1, 3, 3))])
    np.testing.assert_array_equal(top[0].data, x[:, :, 1:4, 2:5])
    bottom[0].diff[...] = 7       # backward zero-fills outside the window
    d = gaussian(2, 3, 3, 3, seed=1)
    backward(layer, top, bottom, [d])
    expect = np.zeros_like(x)
    expect[:, :, 1:4, 2:5] = d
    np.testing.assert_array_equal(bottom[0].diff, expect)
    assert np.all(bottom[1].diff == 0)


@pytest.mark.parametrize("param,shape", [
    ("tile_param { axis: 0 tiles: 3 }", (2, 2, 2)),       # TestGradientNum
    ("tile_param { axis: 1 tiles: 3 }", (2, 2, 2)),       # TestGradientChannels
    ("tile_param { axis: -1 tiles: 2 }", (2, 3)),
])
def test_tile_gradient(param, shape):
    check_layer('type: "Tile" ' + param, [gaussian(*shape)], mode="exhaustive")


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_tile_forward_backward_reference(axis):
    x = gaussian(2, 3, 4)
    layer, bottom, top = run('type: "Tile" tile_param { axis: %d tiles: 3 }' % axis, [x])
    # Caffe repeats the whole block of axes [axis, end) `tiles` times
    outer = int(np.prod(x.shape[:axis]))
    expect = np.tile(x.reshape(outer, -1), (1, 3)).reshape(top[0].shape)
    np.testing.assert_array_equal(top[0].data, expect)
    d = gaussian(*top[0].shape, seed=1)
    backward(layer, top, bottom, [d])
    np.testing.assert_allclose(bottom[0].diff, d.reshape(outer, 3, -1).sum(axis=1).reshape(x.shape))


# --- Silence, BatchReindex, Filter ---------------------------------------------------------------------------------

def test_silence_zeroes_the_diffs_it_is_asked_for():
    layer, bottom, top = run('type: "Silence"', [gaussian(2, 3), gaussian(4)], num_tops=0)
    for b in bottom:
        b.diff[...] = 5
    layer.backward(top, [True, False], bottom)
    assert np.all(bottom[0].diff == 0) and np.all(bottom[1].diff == 5)


def test_batch_reindex_gradient():
    # Caffe's TestGradient: indices repeat and skip rows
    check_layer('type: "BatchReindex"', [gaussian(5, 2, 2), np.array([2, 0, 1, 2, 0, 4])], mode="exhaustive",
                check_bottom=0)


def test_batch_reindex_forward_backward_reference():
    x = gaussian(4, 3)
    index = np.array([3.0, 0.0, 3.0, 1.7])          # 1.7 truncates to 1
    layer, bottom, top = run('type: "BatchReindex"', [x, index])
    np.testing.assert_array_equal(top[0].data, x[[3, 0, 3, 1]])
    d = gaussian(4, 3, seed=1)
    bottom[0].diff[...] = 9
    backward(layer, top, bottom, [d], [True, False])
    expect = np.zeros_like(x)
    expect[3] = d[0] + d[2]
    expect[0] = d[1]
    expect[1] = d[3]
    np.testing.assert_allclose(bottom[0].diff, expect)
    with pytest.raises(NetError, match="Cannot backprop to index"):
        layer.backward(top, [True, True], bottom)


@pytest.mark.parametrize("index,match", [([0.0, -1.0], "negative"), ([0.0, 4.0], "greater than batch size")])
def test_batch_reindex_index_errors(index, match):
    with pytest.raises(NetError, match=match):
        run('type: "BatchReindex"', [gaussian(4, 3), np.array(index)])


def filter_bottoms():
    return [gaussian(4, 3, 2), gaussian(4, 1, 1, seed=1), np.array([0.0, 1.0, 1.0, 0.0]).reshape(4, 1, 1, 1)]


def test_filter_gradient():
    # Caffe's TestGradient: exhaustive on the data bottom, selector 0 1 1 0
    check_layer('type: "Filter"', filter_bottoms(), mode="exhaustive", num_tops=2, check_bottom=0)


def test_filter_forward_backward_reference():
    x, labels, selector = filter_bottoms()
    layer, bottom, top = run('type: "Filter"', [x, labels, selector], num_tops=2)
    assert [t.shape for t in top] == [(2, 3, 2), (2, 1, 1)]
    np.testing.assert_array_equal(top[0].data, x[1:3])
    np.testing.assert_array_equal(top[1].data, labels[1:3])
    d = gaussian(2, 3, 2, seed=2)
    bottom[0].diff[...] = 7
    bottom[1].diff[...] = 7
    backward(layer, top, bottom, [d, np.zeros((2, 1, 1))], [True, False, False])
    np.testing.assert_array_equal(bottom[0].diff, np.concatenate([np.zeros((1, 3, 2)), d, np.zeros((1, 3, 2))]))
    assert np.all(bottom[1].diff == 7)
    with pytest.raises(NetError, match="cannot backpropagate to filter index inputs"):
        layer.backward(top, [True, False, True], bottom)


def test_filter_with_no_item_selected():
    x, labels, selector = filter_bottoms()
    layer, bottom, top = run('type: "Filter"', [x, labels, np.zeros_like(selector)], num_tops=2)
    assert [t.shape for t in top] == [(0, 3, 2), (0, 1, 1)]      # Caffe forwards empty tops ...
    with pytest.raises(NetError, match="no item passed the selector"):
        layer.backward(top, [True, False, False], bottom)        # ... and dies dividing by 0 in Backward


def test_filter_shape_mismatch_on_a_later_reshape():
    x, labels, selector = filter_bottoms()
    layer, bottom, top = run('type: "Filter"', [x, labels, selector], num_tops=2)
    bottom[1].reshape(3, 1, 1)
    with pytest.raises(NetError, match="same 0th dimension as the selector"):
        layer.reshape(bottom, top)


# --- Parameter -------------------------------------------------------------------------------------------------

def test_parameter_gradient_and_sharing():
    gc = GradientChecker()
    layer, bottom, top = gc.make(layer_param('type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }'), [])
    layer.blobs[0].data[...] = gaussian(2, 3)
    gc.check(layer, bottom, top)
    layer.forward(bottom, top)
    top[0].data[1, 1] = 5.0
    top[0].diff[0, 2] = -4.0
    assert layer.blobs[0].data[1, 1] == 5.0 and layer.blobs[0].diff[0, 2] == -4.0
