"""Setup and shapes of the layers of pycaffe_dist/layers/shape.py against Caffe. test_arithmetic_shapes.py,
test_reduction_shapes.py and test_softmax_shapes.py use its helpers (make, tops, fails)."""
import numpy as np
import pytest

from pycaffe_dist.errors import NetError
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.layers import create_layer
from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.proto import caffe_pb2
from tests.layers.golden_shapes import cases_of, check_case_shapes

SHAPE_TYPES = ["Split", "Concat", "Slice", "Flatten", "Reshape", "Crop", "Tile", "Silence", "BatchReindex", "Filter",
               "Parameter"]


def make(text, *bottom_shapes, ntop=1):
    lp = parse_text('name: "l" ' + text, caffe_pb2.LayerParameter())
    lp.bottom.extend("b%d" % i for i in range(len(bottom_shapes)))
    bottom = [Blob(s) for s in bottom_shapes]
    top = [Blob() for _ in range(ntop)]
    layer = create_layer(lp, caffe_pb2.TRAIN)
    layer.setup(bottom, top)
    return layer, bottom, top


def tops(text, *bottom_shapes, ntop=1):
    return [t.shape for t in make(text, *bottom_shapes, ntop=ntop)[2]]


def fails(match, text, *bottom_shapes, ntop=1):
    with pytest.raises(NetError, match=match):
        make(text, *bottom_shapes, ntop=ntop)


@pytest.mark.parametrize("name", cases_of(*SHAPE_TYPES))
def test_golden_shapes(name):
    check_case_shapes(name)


def test_no_params_and_no_flops_for_data_movement():
    for text, shapes, ntop in [('type: "Split"', [(2, 3)], 3), ('type: "Concat"', [(2, 3), (2, 4)], 1),
                               ('type: "Slice"', [(2, 4)], 2), ('type: "Flatten"', [(2, 3, 4)], 1),
                               ('type: "Reshape" reshape_param { shape { dim: -1 } }', [(2, 3)], 1),
                               ('type: "Tile" tile_param { tiles: 2 }', [(2, 3)], 1)]:
        layer, bottom, top = make(text, *shapes, ntop=ntop)
        assert layer.blobs == [] and layer.flops(bottom, top) == 0 and not layer.is_loss


# --- Split -------------------------------------------------------------------------------------------------

def test_split():
    assert tops('type: "Split"', (2, 3, 4), ntop=3) == [(2, 3, 4)] * 3
    lp = parse_text('name: "l" type: "Split"', caffe_pb2.LayerParameter())
    blob = Blob((2, 3))
    with pytest.raises(NetError, match="in-place"):
        create_layer(lp).setup([blob], [Blob(), blob])


# --- Concat ------------------------------------------------------------------------------------------------

def test_concat_axes():
    assert tops('type: "Concat"', (2, 3, 4), (2, 5, 4)) == [(2, 8, 4)]
    assert tops('type: "Concat" concat_param { axis: -1 }', (2, 3, 4), (2, 3, 1), (2, 3, 2)) == [(2, 3, 7)]
    assert tops('type: "Concat" concat_param { concat_dim: 0 }', (2, 3), (5, 3)) == [(7, 3)]
    assert tops('type: "Concat"', (2, 3, 4)) == [(2, 3, 4)]       # one bottom: a copy


def test_concat_errors():
    fails("same shape, except at concat_axis", 'type: "Concat"', (2, 3, 4), (2, 5, 5))
    fails("same #axes", 'type: "Concat"', (2, 3, 4), (2, 3))
    fails("not both", 'type: "Concat" concat_param { axis: 1 concat_dim: 1 }', (2, 3), (2, 3))
    fails("concat_dim out of range", 'type: "Concat" concat_param { concat_dim: 2 }', (2, 3), (2, 3))
    fails("out of range", 'type: "Concat" concat_param { axis: 2 }', (2, 3), (2, 3))


# --- Slice -------------------------------------------------------------------------------------------------

def test_slice_points_and_even():
    assert tops('type: "Slice" slice_param { slice_point: 1 slice_point: 4 }', (2, 6, 3), ntop=3) == \
        [(2, 1, 3), (2, 3, 3), (2, 2, 3)]
    # a last point at the end of the axis: Caffe gives an empty last top (Blob::Reshape allows a 0 dim)
    assert tops('type: "Slice" slice_param { slice_point: 1 slice_point: 4 }', (2, 4, 3), ntop=3) == \
        [(2, 1, 3), (2, 3, 3), (2, 0, 3)]
    assert tops('type: "Slice" slice_param { axis: 0 }', (6, 2), ntop=3) == [(2, 2)] * 3
    assert tops('type: "Slice" slice_param { slice_dim: 0 slice_point: 2 }', (6, 2), ntop=2) == [(2, 2), (4, 2)]
    assert tops('type: "Slice" slice_param { axis: -1 }', (2, 6), ntop=2) == [(2, 3), (2, 3)]


def test_slice_errors():
    fails("evenly divide", 'type: "Slice"', (2, 5), ntop=2)
    fails("once per top", 'type: "Slice" slice_param { slice_point: 1 slice_point: 2 }', (2, 6), ntop=2)
    fails("strictly increasing", 'type: "Slice" slice_param { slice_point: 3 slice_point: 2 }', (2, 6), ntop=3)
    fails("strictly increasing", 'type: "Slice" slice_param { slice_point: 0 }', (2, 6), ntop=2)
    fails("past the end", 'type: "Slice" slice_param { slice_point: 7 }', (2, 6), ntop=2)
    fails("past the end", 'type: "Slice" slice_param { slice_point: 9 }', (2, 6), ntop=2)
    fails("more tops", 'type: "Slice" slice_param { slice_point: 1 slice_point: 2 }', (2, 2), ntop=3)
    fails("not both", 'type: "Slice" slice_param { axis: 1 slice_dim: 1 }', (2, 6), ntop=2)
    fails("slice_dim out of range", 'type: "Slice" slice_param { slice_dim: 2 }', (2, 6), ntop=2)


def test_axis_errors_name_the_layer():
    fails(r"layer 'l' \(ArgMax\): argmax axis 5 out of range for a blob with 2 axes",
          'type: "ArgMax" argmax_param { axis: 5 }', (2, 3))
    fails(r"layer 'l' \(Concat\): concat axis -3 out of range", 'type: "Concat" concat_param { axis: -3 }', (2, 3))
    fails(r"layer 'l' \(Scale\): scale axis 2 out of range", 'type: "Scale" scale_param { axis: 2 }', (2, 3))


# --- Flatten -----------------------------------------------------------------------------------------------

def test_flatten():
    assert tops('type: "Flatten"', (2, 3, 4, 5)) == [(2, 60)]
    assert tops('type: "Flatten" flatten_param { axis: 1 end_axis: 2 }', (2, 3, 4, 5)) == [(2, 12, 5)]
    assert tops('type: "Flatten" flatten_param { axis: 0 }', (2, 3)) == [(6,)]
    assert tops('type: "Flatten" flatten_param { axis: 2 end_axis: 2 }', (2, 3, 4)) == [(2, 3, 4)]
    # end_axis = axis - 1 flattens nothing: Caffe's count(2, 2) = 1 inserts an axis of size 1
    assert tops('type: "Flatten" flatten_param { axis: 2 end_axis: 1 }', (2, 3, 4)) == [(2, 3, 1, 4)]
    fails("must not come before", 'type: "Flatten" flatten_param { axis: 2 end_axis: 0 }', (2, 3, 4))
    fails("out of range", 'type: "Flatten" flatten_param { axis: 3 }', (2, 3, 4))


# --- Reshape -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("param,bottom,expect", [
    ("shape { dim: 0 dim: -1 }", (2, 3, 4, 5), (2, 60)),
    ("shape { dim: -1 dim: 0 }", (2, 3, 4, 5), (40, 3)),
    ("shape { dim: 0 dim: 0 dim: -1 dim: 5 }", (2, 3, 4, 5), (2, 3, 4, 5)),
    ("shape { dim: 6 dim: -1 }", (2, 3, 4, 5), (6, 20)),
    ("shape { dim: -1 }", (2, 3, 4, 5), (120,)),
    ("shape { dim: 0 dim: 3 dim: 20 }", (2, 3, 4, 5), (2, 3, 20)),
    ("shape { dim: -1 } axis: 1 num_axes: 2", (2, 3, 4, 5), (2, 12, 5)),
    ("shape { dim: 1 dim: 1 } axis: 1 num_axes: 0", (2, 3), (2, 1, 1, 3)),       # insert axes
    ("shape { dim: 1 } axis: -1 num_axes: 0", (2, 3), (2, 3, 1)),                # append an axis
    ("shape { dim: 1 } axis: 0 num_axes: 0", (2, 3), (1, 2, 3)),
    ("shape { dim: 0 dim: -1 } axis: 1", (2, 3, 4, 5), (2, 3, 20)),              # 0 copies bottom axis 1
    ("shape { } axis: 1 num_axes: 1", (2, 1, 3), (2, 3)),                        # drop a unit axis
    ("shape { dim: -1 dim: 0 } axis: -3 num_axes: 2", (2, 3, 4, 5), (2, 3, 4, 5)),
])
def test_reshape_rules(param, bottom, expect):
    assert tops('type: "Reshape" reshape_param { %s }' % param, bottom) == [expect]


@pytest.mark.parametrize("param,bottom,match", [
    ("shape { dim: -1 dim: -1 }", (2, 3), "only one dimension can be inferred"),
    ("shape { dim: 0 dim: 0 dim: 0 }", (2, 3), "no corresponding bottom axis to copy"),
    ("shape { dim: 0 dim: 0 } axis: 1", (2, 3), "no corresponding bottom axis to copy"),
    ("shape { dim: 7 dim: -1 }", (2, 3, 4), "must be divisible"),
    ("shape { dim: 5 dim: 5 }", (2, 3, 4), "output count must match input count"),
    ("shape { dim: 0 dim: 5 }", (2, 3, 4), "output count must match input count"),
    ("shape { dim: -1 } axis: 4", (2, 3, 4), "out of range"),
    ("shape { dim: -1 } axis: -5", (2, 3, 4), "out of range"),
    ("shape { dim: -1 } axis: 1 num_axes: 3", (2, 3, 4), "end_axis = axis \\+ num_axes is out of range"),
    ("shape { dim: -1 } num_axes: -2", (2, 3, 4), "num_axes must be >= 0, or -1"),
    ("shape { dim: -2 dim: 12 }", (2, 3, 4), "negative dimension"),
    ("shape { dim: 0 dim: -1 }", (0, 3), "divisible"),
])
def test_reshape_errors(param, bottom, match):
    fails(match, 'type: "Reshape" reshape_param { %s }' % param, bottom)


def test_reshape_refuses_in_place():
    lp = parse_text('name: "l" type: "Reshape" reshape_param { shape { dim: -1 } }', caffe_pb2.LayerParameter())
    blob = Blob((2, 3))
    with pytest.raises(NetError, match="in-place"):
        create_layer(lp).setup([blob], [blob])


# --- Crop --------------------------------------------------------------------------------------------------

def test_crop():
    assert tops('type: "Crop"', (2, 3, 8, 8), (1, 1, 5, 6)) == [(2, 3, 5, 6)]
    layer, _, top = make('type: "Crop" crop_param { axis: 1 offset: 1 offset: 2 offset: 3 }',
                         (2, 3, 8, 8), (2, 2, 4, 5))
    assert top[0].shape == (2, 2, 4, 5) and layer.offsets == [0, 1, 2, 3]
    layer, _, top = make('type: "Crop" crop_param { axis: -2 offset: 3 }', (2, 3, 8, 8), (1, 1, 5, 5))
    assert top[0].shape == (2, 3, 5, 5) and layer.offsets == [0, 0, 3, 3]


def test_crop_errors():
    fails("out-of-bounds", 'type: "Crop" crop_param { offset: 4 }', (2, 3, 8, 8), (1, 1, 5, 5))
    fails("out-of-bounds", 'type: "Crop"', (2, 3, 8, 8), (1, 1, 9, 5))
    fails("out-of-bounds", 'type: "Crop" crop_param { offset: 0 offset: 4 }', (2, 3, 8, 8), (1, 1, 5, 5))
    fails("number of crop values", 'type: "Crop" crop_param { offset: 1 offset: 1 offset: 1 }',
          (2, 3, 8, 8), (1, 1, 5, 5))
    fails("out of range", 'type: "Crop" crop_param { axis: 4 }', (2, 3, 8, 8), (1, 1, 5, 5))
    fails("fewer axes", 'type: "Crop"', (2, 3, 8, 8), (5, 5))
    fails("exactly 2 bottom", 'type: "Crop"', (2, 3, 8, 8))


# --- Tile --------------------------------------------------------------------------------------------------

def test_tile():
    assert tops('type: "Tile" tile_param { tiles: 3 }', (2, 3, 4)) == [(2, 9, 4)]
    assert tops('type: "Tile" tile_param { axis: -1 tiles: 2 }', (2, 3, 4)) == [(2, 3, 8)]
    fails("must be specified", 'type: "Tile"', (2, 3))
    fails("must be positive", 'type: "Tile" tile_param { tiles: 0 }', (2, 3))
    fails("out of range", 'type: "Tile" tile_param { axis: 2 tiles: 2 }', (2, 3))


# --- Silence, BatchReindex, Filter ---------------------------------------------------------------------------

def test_silence():
    layer, _, top = make('type: "Silence"', (2, 3), (4,), ntop=0)
    assert top == [] and layer.has_backward
    fails("exactly 0 top", 'type: "Silence"', (2, 3), ntop=1)
    fails("at least 1 bottom", 'type: "Silence"', ntop=0)


def test_batch_reindex():
    layer, _, top = make('type: "BatchReindex"', (5, 3, 4), (7,))
    assert top[0].shape == (7, 3, 4)
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    fails("1 axis", 'type: "BatchReindex"', (5, 3, 4), (7, 1))


def test_filter():
    layer, bottom, top = make('type: "Filter"', (4, 3, 2), (4, 5), (4, 1, 1), ntop=2)
    assert [t.shape for t in top] == [(4, 3, 2), (4, 5)]          # the first reshape keeps the whole batch
    assert layer.allow_force_backward(0) and layer.allow_force_backward(1) and not layer.allow_force_backward(2)
    bottom[2].data[...] = np.array([1, 0, 1, 1], np.float32).reshape(4, 1, 1)
    layer.reshape(bottom, top)                                     # later reshapes read the selector
    assert [t.shape for t in top] == [(3, 3, 2), (3, 5)]


def test_filter_errors():
    fails("bottom.size\\(\\) - 1", 'type: "Filter"', (4, 3), (4,), ntop=2)
    fails("singletons", 'type: "Filter"', (4, 3), (4, 2))
    fails("same 0th dimension", 'type: "Filter"', (4, 3), (3, 1))


# --- Parameter ---------------------------------------------------------------------------------------------

def test_parameter():
    layer, bottom, top = make('type: "Parameter" parameter_param { shape { dim: 3 dim: 4 } }', ntop=1)
    assert top[0].shape == (3, 4) and [b.shape for b in layer.blobs] == [(3, 4)]
    assert np.all(layer.blobs[0].data == 0)
    fails("exactly 0 bottom", 'type: "Parameter" parameter_param { shape { dim: 3 } }', (3,))
