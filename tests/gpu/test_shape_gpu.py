"""The shape layers of pycaffe_dist/layers/shape.py on the GPU code path (kernels in csrc/cuda/shape.cu and math.cu)
against their CPU code: tops and bottom diffs for each layer and its settings (Split, Concat, Slice, Crop, Tile,
Silence, BatchReindex, Filter), Flatten and Reshape viewing their bottom's device memory without any device work, and
a net of them and of the arithmetic layers (test_arithmetic_gpu.py, which uses this module's helpers inputs and run)
that keeps its blobs on the device. `device_work` and `bottoms_of` serve the other GPU tests of the layers too."""
import contextlib

import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.blob import synced_memory
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.errors import NetError
from pycaffe_dist.layers import create_layer
from pycaffe_dist.pycaffe import Net
from tests.gpu.test_activation_gpu import compare_layer, gaussian, tolerance
from tests.layers.gradient_checker import layer_param

SHAPE = (2, 3, 4, 5)


def inputs(*shapes, seed=0):
    return [gaussian(*s, seed=seed + i) for i, s in enumerate(shapes)]


def run(dev, text, shapes, top_shapes=None, **kwargs):
    """compare_layer on gaussian bottoms of `shapes` and top diffs of `top_shapes` (default: the first shape)."""
    top_shapes = [shapes[0]] if top_shapes is None else top_shapes
    kwargs.setdefault("bottom_diffs", inputs(*shapes, seed=50))
    return compare_layer(dev, text, inputs(*shapes), inputs(*top_shapes, seed=20), num_tops=len(top_shapes), **kwargs)


@contextlib.contextmanager
def device_work(dev):
    """Count the device's kernel launches, copies and transfers (by name) while the block runs."""
    counts = {}
    names = ("launch", "copy", "upload", "download", "memset", "gemm", "gemv", "dot", "asum", "axpy", "scal")
    originals = {name: getattr(dev, name) for name in names}

    def counting(name):
        def call(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return originals[name](*args, **kwargs)
        return call
    for name in names:
        setattr(dev, name, counting(name))
    try:
        yield counts
    finally:
        for name in names:
            delattr(dev, name)     # the instance attribute goes; the class's method is seen again


def bottoms_of(arrays):
    out = []
    for x in arrays:
        blob = Blob(x.shape)
        blob.data[...] = x
        out.append(blob)
    return out


# --- Split, Concat, Slice -------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_tops", [1, 2, 3, 4])
def test_split(gpu, num_tops):
    got = run(gpu, 'type: "Split"', [SHAPE], [SHAPE] * num_tops, on_device="backward")
    for i in range(num_tops):
        np.testing.assert_array_equal(got["top %d" % i], got["top 0"])       # shared data


@pytest.mark.parametrize("param,shapes,top", [
    ("concat_param { axis: 0 }", [(2, 3, 2), (1, 3, 2)], (3, 3, 2)),
    ("", [(2, 3, 2), (2, 1, 2), (2, 2, 2)], (2, 6, 2)),
    ("concat_param { concat_dim: 2 }", [(2, 1, 2), (2, 1, 3)], (2, 1, 5)),
    ("concat_param { axis: -1 }", [(2, 2), (2, 3)], (2, 5)),
    ("concat_param { axis: 1 }", [(2, 0, 3), (2, 2, 3)], (2, 2, 3)),      # an empty bottom
])
def test_concat(gpu, param, shapes, top):
    run(gpu, 'type: "Concat" ' + param, shapes, [top])


def test_concat_some_bottoms_only(gpu):
    shapes = [(2, 3, 4), (2, 2, 4), (2, 1, 4)]
    got = run(gpu, 'type: "Concat"', shapes, [(2, 6, 4)], propagate_down=[True, False, True])
    np.testing.assert_array_equal(got["bottom diff 1"], inputs(*shapes, seed=50)[1])


def test_concat_and_split_take_one_launch_over_all_their_blobs(gpu):
    """Caffe launches a copy per Concat bottom and an axpy per Split top after the second; here one kernel takes
    them all, from a table of their addresses uploaded once (again where one changes)."""
    shapes = [(2, 3, 4), (2, 2, 4), (2, 1, 4)]
    bottom, top = bottoms_of(inputs(*shapes)), [Blob()]
    concat = create_layer(layer_param('type: "Concat"'), 0)     # TRAIN
    concat.setup(bottom, top)
    concat.reshape(bottom, top)
    concat.forward_gpu(bottom, top)         # the tables' first upload
    top[0].diff[...] = inputs((2, 6, 4), seed=9)[0]
    concat.backward_gpu(top, [True, False, True], bottom)
    with device_work(gpu) as work:
        concat.forward_gpu(bottom, top)
        concat.backward_gpu(top, [True, False, True], bottom)
    assert work == {"launch": 2}
    tops = [Blob() for _ in range(4)]
    split = create_layer(layer_param('type: "Split"'), 0)     # TRAIN
    split.setup(bottom[:1], tops)
    split.reshape(bottom[:1], tops)
    for t, diff in zip(tops, inputs(*[shapes[0]] * 4, seed=30)):
        t.diff[...] = diff
    split.backward_gpu(tops, [True], bottom[:1])
    with device_work(gpu) as work:
        split.backward_gpu(tops, [True], bottom[:1])
    assert work == {"launch": 1}
    want = inputs(*[shapes[0]] * 4, seed=30)
    np.testing.assert_array_equal(bottom[0].diff, ((want[0] + want[1]) + want[2]) + want[3])


def test_concat_of_one_bottom_shares_it(gpu):
    got = run(gpu, 'type: "Concat"', [SHAPE], on_device=False)
    np.testing.assert_array_equal(got["top 0"], inputs(SHAPE)[0])


@pytest.mark.parametrize("param,shape,tops", [
    ("slice_param { axis: 0 }", (4, 3, 2), [(2, 3, 2)] * 2),
    ("slice_param { axis: 1 slice_point: 1 slice_point: 4 }", (2, 6, 3), [(2, 1, 3), (2, 3, 3), (2, 2, 3)]),
    ("slice_param { slice_dim: 2 }", (2, 3, 6), [(2, 3, 2)] * 3),
    ("slice_param { axis: -1 slice_point: 2 }", (3, 5), [(3, 2), (3, 3)]),
])
def test_slice(gpu, param, shape, tops):
    run(gpu, 'type: "Slice" ' + param, [shape], tops)


def test_slice_to_one_top_shares_it(gpu):
    run(gpu, 'type: "Slice"', [SHAPE], [SHAPE], on_device=False)


# --- Crop, Tile ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("param,shapes,top", [
    ("crop_param { axis: 1 offset: 0 offset: 2 offset: 1 }", [(2, 3, 8, 8), (2, 3, 5, 5)], (2, 3, 5, 5)),
    ("crop_param { axis: 2 offset: 1 }", [(2, 3, 8, 7), (1, 1, 5, 5)], (2, 3, 5, 5)),
    ("crop_param { axis: 0 offset: 1 offset: 0 offset: 2 offset: 3 }", [(3, 3, 6, 7), (2, 2, 4, 4)], (2, 2, 4, 4)),
    ("crop_param { axis: 3 }", [(2, 3, 4, 9), (1, 1, 1, 4)], (2, 3, 4, 4)),
])
def test_crop(gpu, param, shapes, top):
    got = run(gpu, 'type: "Crop" ' + param, shapes, [top], propagate_down=[True, False])
    # bottom 1 gives only the shape: its diff is left alone
    np.testing.assert_array_equal(got["bottom diff 1"], inputs(*shapes, seed=50)[1])


@pytest.mark.parametrize("param,shape,top", [
    ("tile_param { tiles: 3 }", SHAPE, (2, 9, 4, 5)),
    ("tile_param { axis: 0 tiles: 2 }", SHAPE, (4, 3, 4, 5)),
    ("tile_param { axis: -1 tiles: 4 }", (3, 5), (3, 20)),
    ("tile_param { axis: 2 tiles: 1 }", SHAPE, SHAPE),
])
def test_tile(gpu, param, shape, top):
    run(gpu, 'type: "Tile" ' + param, [shape], [top])


# --- Silence ---------------------------------------------------------------------------------------------------

def test_silence_zeroes_the_bottom_diffs(gpu):
    old = inputs(SHAPE, (3, 2), seed=50)
    got = compare_layer(gpu, 'type: "Silence"', inputs(SHAPE, (3, 2)), [], num_tops=0, bottom_diffs=old,
                        propagate_down=[True, False])
    assert not got["bottom diff 0"].any()
    np.testing.assert_array_equal(got["bottom diff 1"], old[1])


# --- Flatten, Reshape ------------------------------------------------------------------------------------------

VIEWS = [
    ('type: "Flatten"', (2, 3, 4, 5), (2, 60)),
    ('type: "Flatten" flatten_param { axis: 2 }', (2, 3, 4, 5), (2, 3, 20)),
    ('type: "Reshape" reshape_param { shape { dim: 0 dim: -1 } }', (2, 3, 4, 5), (2, 60)),
    ('type: "Reshape" reshape_param { axis: 1 num_axes: 2 shape { dim: 12 } }', (2, 3, 4, 5), (2, 12, 5)),
]


@pytest.mark.parametrize("text,shape,top", VIEWS)
def test_views_equal_the_cpu(gpu, text, shape, top):
    # on_device False: the top is the bottom's memory, which the test wrote on the host
    compare_layer(gpu, text, [gaussian(*shape)], [gaussian(*top, seed=3)], on_device=False)


@pytest.mark.parametrize("text,shape,top", VIEWS)
def test_views_share_the_bottoms_device_memory_and_do_no_device_work(gpu, text, shape, top):
    bottom, tops = bottoms_of([gaussian(*shape)]), [Blob()]
    layer = create_layer(layer_param(text))
    layer.setup(bottom, tops)
    bottom[0].gpu_data, bottom[0].gpu_diff       # on the device before the layer runs
    with device_work(gpu) as work:
        layer.reshape(bottom, tops)
        layer.forward_gpu(bottom, tops)
        layer.backward_gpu(tops, [True], bottom)
        assert tops[0].gpu_data.ptr == bottom[0].gpu_data.ptr
        assert tops[0].gpu_diff.ptr == bottom[0].gpu_diff.ptr
    assert work == {}, "Flatten / Reshape moved or computed something on the device: %s" % work
    assert tops[0].shape == top


def test_view_as_a_loss_top_keeps_its_weight_in_the_shared_device_diff(gpu):
    bottom, tops = bottoms_of([gaussian(2, 3, 4)]), [Blob()]
    layer = create_layer(layer_param('type: "Flatten" loss_weight: 2.5'))
    layer.setup(bottom, tops)
    layer.forward_gpu(bottom, tops)
    assert tops[0].diff_memory.head == synced_memory.DEVICE
    np.testing.assert_array_equal(bottom[0].diff, 2.5)


# --- BatchReindex ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("index", [[2, 0, 2, 4, 2, 1], [3, 1, 0, 2, 4], [4.7, 0.2], []])
def test_batch_reindex(gpu, index):
    x = gaussian(5, 3, 2)
    index = np.array(index, np.float32)
    compare_layer(gpu, 'type: "BatchReindex"', [x, index], [gaussian(len(index), 3, 2, seed=4)],
                  propagate_down=[True, False], bottom_diffs=[gaussian(5, 3, 2, seed=9), np.full(len(index), 7.0)])


def test_batch_reindex_many_picks_of_one_row_sum_in_order(gpu):
    # one bottom row picked 700 times (several blocks of threads on a GPU would race with atomics): the sum is the
    # CPU code's, in the same order
    index = np.zeros(700, np.float32)
    index[::3] = 1
    compare_layer(gpu, 'type: "BatchReindex"', [gaussian(3, 4), index], [gaussian(700, 4, seed=5)],
                  propagate_down=[True, False])


@pytest.mark.parametrize("index,message", [([0, -1], "negative"), ([0, 3], "greater than batch size")])
def test_batch_reindex_refuses_a_bad_index_on_the_gpu_too(gpu, index, message):
    bottom, tops = bottoms_of([gaussian(3, 2), np.array(index, np.float32)]), [Blob()]
    layer = create_layer(layer_param('type: "BatchReindex"'))
    layer.setup(bottom, tops)
    with pytest.raises(NetError, match=message):
        layer.forward_gpu(bottom, tops)


# --- Filter ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("selector", [[1, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1], [1] * 6, [0.5, 0, -2, 0, 3, 0]])
def test_filter(gpu, selector):
    selector = np.array(selector, np.float32).reshape(6, 1)
    n = int(np.count_nonzero(selector))
    compare_layer(gpu, 'type: "Filter"', [gaussian(6, 3, 2), gaussian(6, 4, seed=1), selector],
                  [gaussian(n, 3, 2, seed=2), gaussian(n, 4, seed=3)], num_tops=2, propagate_down=[True, True, False],
                  bottom_diffs=[gaussian(6, 3, 2, seed=7), gaussian(6, 4, seed=8), np.full((6, 1), 5.0)])


def test_filter_of_one_bottom_only(gpu):
    selector = np.array([0, 1, 1, 0], np.float32)
    compare_layer(gpu, 'type: "Filter"', [gaussian(4, 5), gaussian(4, 2, seed=1), selector],
                  [gaussian(2, 5, seed=2), gaussian(2, 2, seed=3)], num_tops=2, propagate_down=[False, True, False],
                  bottom_diffs=[gaussian(4, 5, seed=7), gaussian(4, 2, seed=8)])


def test_filter_a_new_selection_each_forward(gpu):
    layer = create_layer(layer_param('type: "Filter"'))
    x = gaussian(4, 3)
    bottom, tops = bottoms_of([x, np.array([1, 0, 0, 1], np.float32)]), [Blob()]
    layer.setup(bottom, tops)
    for selector in ([1, 0, 0, 1], [0, 1, 1, 1], [0, 0, 1, 0]):
        bottom[1].data[...] = selector
        layer.reshape(bottom, tops)
        layer.forward_gpu(bottom, tops)
        np.testing.assert_array_equal(tops[0].data, x[np.flatnonzero(selector)])
        tops[0].diff[...] = 1
        layer.backward_gpu(tops, [True, False], bottom)
        np.testing.assert_array_equal(bottom[0].diff, np.array(selector, np.float32)[:, None] * np.ones((1, 3)))


def test_filter_empty_selection_forwards_nothing_and_refuses_backward(gpu):
    layer = create_layer(layer_param('type: "Filter"'))
    bottom, tops = bottoms_of([gaussian(3, 2), np.zeros(3, np.float32)]), [Blob()]
    layer.setup(bottom, tops)
    layer.reshape(bottom, tops)
    layer.forward_gpu(bottom, tops)
    assert tops[0].shape == (0, 2)
    with pytest.raises(NetError, match="no item passed the selector"):
        layer.backward_gpu(tops, [True, False], bottom)


# --- a net of them (and of the arithmetic layers) ------------------------------------------------------------

NET = """
force_backward: true
layer { name: "in" type: "Input" top: "a" top: "b" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 5 }
                                                                 shape { dim: 2 dim: 3 dim: 6 dim: 5 } } }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" }
layer { name: "slice" type: "Slice" bottom: "cat" top: "s1" top: "s2" slice_param { slice_point: 2 } }
layer { name: "tile" type: "Tile" bottom: "s1" top: "t" tile_param { tiles: 2 } }
layer { name: "max" type: "Eltwise" bottom: "t" bottom: "s2" top: "m" eltwise_param { operation: MAX } }
layer { name: "crop" type: "Crop" bottom: "m" bottom: "a" top: "c"
        crop_param { axis: 1 offset: 1 offset: 0 offset: 0 } }
layer { name: "prod" type: "Eltwise" bottom: "c" bottom: "a" top: "p" eltwise_param { operation: PROD } }
layer { name: "scale" type: "Scale" bottom: "p" top: "p" scale_param { bias_term: true
        filler { type: "gaussian" } bias_filler { type: "gaussian" } } }
layer { name: "prelu" type: "PReLU" bottom: "p" top: "p" }
layer { name: "bias" type: "Bias" bottom: "p" bottom: "b" top: "q" bias_param { axis: 0 } }
layer { name: "drop" type: "Dropout" bottom: "q" top: "q" }
layer { name: "swish" type: "Swish" bottom: "q" top: "out" }
layer { name: "sum" type: "Eltwise" bottom: "out" bottom: "b" top: "sum" eltwise_param { coeff: 0.5 coeff: -1 } }
layer { name: "silence" type: "Silence" bottom: "sum" }
"""
# Split layers come in for "a" (4 consumers) and "b" (3); the crop's reference "a" gets no gradient.


def _net_run(path, weights, seed):
    net = Net(str(path), phase=0)       # TRAIN
    for name, blobs in net.params.items():
        for blob, value in zip(blobs, weights.get(name, [])):
            blob.data[...] = value
    net.blobs["a"].data[...] = gaussian(2, 3, 6, 5, seed=1)
    net.blobs["b"].data[...] = gaussian(2, 3, 6, 5, seed=2)
    common.set_random_seed(seed)
    net.forward()
    net.blobs["out"].diff[...] = gaussian(2, 3, 6, 5, seed=3)
    return net


def test_net_runs_on_the_device_and_equals_the_cpu(gpu, tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    common.set_mode_cpu()
    common.set_random_seed(5)
    cpu = _net_run(path, {}, seed=9)
    weights = {name: [b.data.copy() for b in blobs] for name, blobs in cpu.params.items()}
    cpu.backward()
    common.set_mode_gpu()
    ours = _net_run(path, weights, seed=9)
    assert "Split" in [layer.param.type for layer in ours.layers]
    for name in ("cat", "s1", "t", "m", "c", "p", "q", "out"):
        assert ours.blobs[name].data_memory.head in (synced_memory.DEVICE, synced_memory.SYNCED), name
    for name in ("cat", "m", "p", "out"):
        assert ours.blobs[name].data_memory.head == synced_memory.DEVICE, name
    ours.backward()     # (pycaffe's backward returns the input diffs "a" and "b" as host arrays)
    for name in ("cat", "s1", "t", "m", "c", "p", "q"):
        assert ours.blobs[name].diff_memory.head == synced_memory.DEVICE, name
    tol = tolerance(gpu)
    for name in cpu.blobs:
        np.testing.assert_allclose(ours.blobs[name].data, cpu.blobs[name].data, err_msg=name + " data", **tol)
        np.testing.assert_allclose(ours.blobs[name].diff, cpu.blobs[name].diff, err_msg=name + " diff", **tol)
    for name in cpu.params:
        for i, (g, c) in enumerate(zip(ours.params[name], cpu.params[name])):
            np.testing.assert_allclose(g.diff, c.diff, err_msg="%s/%d diff" % (name, i), **tol)
