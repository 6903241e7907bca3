"""export/onnx_graph.py: each layer type's ONNX form computes what our forward computes (onnxruntime against our
TEST-phase net, within 1e-4 of the output's largest magnitude), on the golden layer cases (and against the real
Caffe's outputs there, where the phase does not matter), on hand-made nets for what the golden cases lack, and on
a sweep of pooling geometries; the value names; and the refusals: one line naming the layer, no file left."""
import json
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from pycaffe_dist.errors import ExportError, PycaffeDistError  # noqa: E402
from pycaffe_dist.export import build_model, compare, load_net, to_onnx  # noqa: E402
from pycaffe_dist.export.onnx_check import relative_difference, run_onnx  # noqa: E402
from pycaffe_dist.export.onnx_graph import MIN_OPSET, REFUSED, value_names  # noqa: E402
from pycaffe_dist.io.prototxt import parse_text  # noqa: E402
from pycaffe_dist.layers import layer_types  # noqa: E402
from pycaffe_dist.net.net import Net  # noqa: E402
from pycaffe_dist.proto import caffe_pb2  # noqa: E402
from tests.conftest import load_npz  # noqa: E402
from tests.export.onnx_cases import TOLERANCE, assert_agrees, export_and_compare, randomize  # noqa: E402
from tests.layers.golden_cases import LAYER_CASES, layer_case_names  # noqa: E402


def net_from_text(text, phase=caffe_pb2.TEST):
    return Net(parse_text(text, caffe_pb2.NetParameter()), phase=phase)


def input_layer(*shapes, tops=("data",)):
    dims = " ".join("shape { %s }" % " ".join("dim: %d" % d for d in s) for s in shapes)
    return 'layer { name: "input" type: "Input" %s input_param { %s } }\n' % (
        " ".join('top: "%s"' % t for t in tops), dims)


# --- the golden layer cases ----------------------------------------------------------------------------------

# Types whose forward differs between the phases: the case's Caffe outputs (mostly TRAIN) are not the TEST ones.
PHASE_DEPENDENT = {"BatchNorm", "Dropout"}


@pytest.mark.parametrize("name", layer_case_names())
def test_golden_layer_case(name, tmp_path, monkeypatch):
    case = LAYER_CASES / name
    meta = json.loads((case / "case.json").read_text())
    monkeypatch.chdir(case)
    weights = case / "weights.caffemodel"
    net = load_net(case / "net.prototxt", weights if weights.exists() else None)
    inputs = load_npz(case / "inputs.npz")
    out = tmp_path / "layer.onnx"
    if meta["layer_type"] in REFUSED:
        with pytest.raises(ExportError) as info:
            to_onnx(net, out)
        message = str(info.value)
        assert "\n" not in message and "layer 'layer' (%s)" % meta["layer_type"] in message
        assert "cannot be exported to ONNX" in message
        assert list(tmp_path.iterdir()) == []
        return
    assert_agrees(export_and_compare(net, out, inputs=inputs), name)
    if meta["layer_type"] in PHASE_DEPENDENT and meta["phase"] != "TEST":
        return
    model = onnx.load(str(out))
    caffe = load_npz(case / "outputs.npz")
    for value, y in zip(model.graph.output, run_onnx(model, inputs)):
        assert relative_difference(caffe[value.name], y) <= TOLERANCE, "%s: %s against Caffe" % (name, value.name)


def test_every_registered_layer_type_exports_or_is_refused_with_a_reason():
    from pycaffe_dist.export.onnx_graph import EMITTERS
    assert set(EMITTERS) & set(REFUSED) == set()
    assert set(layer_types()) - {"Input"} <= set(EMITTERS) | set(REFUSED)


# --- what the golden cases lack ------------------------------------------------------------------------------

def _positive(rng, shape):
    return rng.uniform(0.1, 2.0, shape).astype(np.float32)


def _indices(high):
    return lambda rng, shape: rng.integers(0, high, shape).astype(np.float32)


def _normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


# name: (net text after the Input layer, {input: (shape, generator)})
EXTRA = {
    "stochastic_pool_test": ('layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
                             'pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 } }',
                             {"data": ((2, 3, 8, 7), _positive)}),
    "stochastic_pool_zero_windows": ('layer { name: "r" type: "ReLU" bottom: "data" top: "r" }'
                                     'layer { name: "p" type: "Pooling" bottom: "r" top: "p" '
                                     'pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 } }',
                                     {"data": ((1, 2, 6, 6), _normal)}),
    "ave_pool_ceil_pad_rect": ('layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { '
                               'pool: AVE kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 1 } }',
                               {"data": ((2, 3, 10, 11), _normal)}),
    "global_max_with_mask": ('layer { name: "p" type: "Pooling" bottom: "data" top: "p" top: "mask" '
                             'pooling_param { pool: MAX global_pooling: true } }',
                             {"data": ((2, 3, 5, 4), _normal)}),
    "lstm_unit": ('layer { name: "u" type: "LSTMUnit" bottom: "c" bottom: "x" bottom: "cont" top: "c1" top: "h1" }',
                  {"c": ((1, 3, 4), _normal), "x": ((1, 3, 16), _normal), "cont": ((1, 3), _indices(2))}),
    "batch_reindex": ('layer { name: "r" type: "BatchReindex" bottom: "data" bottom: "index" top: "r" }',
                      {"data": ((4, 3, 2), _normal), "index": ((6,), _indices(4))}),
    "parameter_and_silence": ('layer { name: "w" type: "Parameter" top: "w" '
                              'parameter_param { shape { dim: 2 dim: 3 } } }'
                              'layer { name: "s" type: "Eltwise" bottom: "data" bottom: "w" top: "s" }'
                              'layer { name: "quiet" type: "Silence" bottom: "extra" }',
                              {"data": ((2, 3), _normal), "extra": ((2,), _normal)}),
    "mvn_2d_legacy_top": ('layer { name: "m" type: "MVN" bottom: "data" top: "m" mvn_param { across_channels: true } }',
                          {"data": ((3, 7), _normal)}),
    "batchnorm_batch_stats_at_test": ('layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" '
                                      'batch_norm_param { use_global_stats: false eps: 0.001 } }',
                                      {"data": ((4, 3, 2, 5), _normal)}),
    "batchnorm_in_place_then_scale": ('layer { name: "bn" type: "BatchNorm" bottom: "data" top: "data2" }'
                                      'layer { name: "sc" type: "Scale" bottom: "data2" top: "data2" '
                                      'scale_param { bias_term: true } }',
                                      {"data": ((2, 3, 4), _normal)}),
    "scale_scalar": ('layer { name: "sc" type: "Scale" bottom: "data" top: "sc" scale_param { num_axes: 0 } }',
                     {"data": ((2, 3, 4), _normal)}),
    "scale_axis2_two_axes_bias": ('layer { name: "sc" type: "Scale" bottom: "data" top: "sc" '
                                  'scale_param { axis: 2 num_axes: 2 bias_term: true } }',
                                  {"data": ((2, 3, 4, 5, 2), _normal)}),
    "bias_axis_negative": ('layer { name: "b" type: "Bias" bottom: "data" top: "b" bias_param { axis: -1 } }',
                           {"data": ((2, 3, 4), _normal)}),
    "conv_channel_axis2": ('layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { '
                           'axis: 2 num_output: 4 kernel_size: 3 pad: 1 stride: 2 '
                           'weight_filler { type: "gaussian" std: 0.3 } } }',
                           {"data": ((2, 2, 3, 7, 6), _normal)}),
    "conv_no_spatial_axis": ('layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { '
                             'axis: 1 num_output: 4 group: 2 kernel_size: 1 } }',
                             {"data": ((5, 6), _normal)}),
    "conv_two_bottoms_shared_weights": ('layer { name: "c" type: "Convolution" bottom: "data" bottom: "d2" top: "c1" '
                                        'top: "c2" convolution_param { num_output: 3 kernel_size: 2 dilation: 2 } }',
                                        {"data": ((1, 2, 6, 6), _normal), "d2": ((1, 2, 6, 6), _normal)}),
    "deconv_dilation_rect": ('layer { name: "d" type: "Deconvolution" bottom: "data" top: "d" convolution_param { '
                             'num_output: 4 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 dilation: 2 '
                             'group: 2 } }',
                             {"data": ((2, 4, 5, 6), _normal)}),
    "im2col_pad_stride": ('layer { name: "i" type: "Im2col" bottom: "data" top: "i" convolution_param { '
                          'kernel_h: 2 kernel_w: 3 stride: 2 pad: 1 dilation: 1 } }',
                          {"data": ((2, 3, 7, 6), _normal)}),
    "argmax_ties_and_axis_top3": ('layer { name: "a" type: "ArgMax" bottom: "data" top: "a" '
                                  'argmax_param { axis: 1 top_k: 3 } }',
                                  {"data": ((2, 6, 3), _indices(3))}),
    "argmax_ties_flat_max_val": ('layer { name: "a" type: "ArgMax" bottom: "data" top: "a" '
                                 'argmax_param { top_k: 2 out_max_val: true } }',
                                 {"data": ((3, 2, 4), _indices(3))}),
    "softmax_last_axis_3d": ('layer { name: "s" type: "Softmax" bottom: "data" top: "s" softmax_param { axis: -1 } }',
                             {"data": ((2, 3, 5), _normal)}),
    "in_place_chain": ('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "h" '
                       'inner_product_param { num_output: 5 axis: 1 } }'
                       'layer { name: "r" type: "ReLU" bottom: "h" top: "h" relu_param { negative_slope: 0.2 } }'
                       'layer { name: "p" type: "Power" bottom: "h" top: "h" power_param { power: 2 shift: 1 } }'
                       'layer { name: "d" type: "Dropout" bottom: "h" top: "h" }',
                       {"data": ((3, 2, 4), _normal)}),
    "neurons_other_params": ('layer { name: "e" type: "Exp" bottom: "data" top: "e" exp_param { scale: 0.5 } }'
                             'layer { name: "l" type: "Log" bottom: "e" top: "l" '
                             'log_param { base: 2 shift: 1 } }'
                             'layer { name: "p0" type: "Power" bottom: "data" top: "p0" power_param { power: 0 } }'
                             'layer { name: "t" type: "Threshold" bottom: "data" top: "t" '
                             'threshold_param { threshold: 0.3 } }'
                             'layer { name: "b" type: "BNLL" bottom: "data" top: "b" }',
                             {"data": ((2, 3, 4), lambda rng, shape: (30 * rng.standard_normal(shape)).astype(
                                 np.float32))}),
    "lrn_within_channel_even_image": ('layer { name: "l" type: "LRN" bottom: "data" top: "l" lrn_param { '
                                      'norm_region: WITHIN_CHANNEL local_size: 5 alpha: 0.5 beta: 0.6 k: 3 } }',
                                      {"data": ((2, 3, 6, 4), _normal)}),
    "reduction_axis0_scalar": ('layer { name: "r" type: "Reduction" bottom: "data" top: "r" '
                               'reduction_param { operation: MEAN axis: 0 coeff: 3 } }',
                               {"data": ((2, 3, 4), _normal)}),
    "embed_3d_indices": ('layer { name: "e" type: "Embed" bottom: "data" top: "e" '
                         'embed_param { num_output: 4 input_dim: 7 } }',
                         {"data": ((2, 3), _indices(7))}),
    "tile_axis0_crop_all_axes": ('layer { name: "t" type: "Tile" bottom: "data" top: "t" '
                                 'tile_param { axis: 0 tiles: 3 } }'
                                 'layer { name: "c" type: "Crop" bottom: "t" bottom: "ref" top: "c" '
                                 'crop_param { axis: 0 offset: 1 offset: 0 offset: 2 } }',
                                 {"data": ((2, 3, 5), _normal), "ref": ((4, 3, 2), _normal)}),
    "spp_single_level": ('layer { name: "s" type: "SPP" bottom: "data" top: "s" '
                         'spp_param { pyramid_height: 1 pool: AVE } }',
                         {"data": ((2, 3, 5, 7), _normal)}),
    "clip_swish_eltwise_max3": ('layer { name: "c" type: "Clip" bottom: "data" top: "c" '
                                'clip_param { min: -0.5 max: 0.7 } }'
                                'layer { name: "s" type: "Swish" bottom: "data" top: "s" }'
                                'layer { name: "m" type: "Eltwise" bottom: "c" bottom: "s" bottom: "data" top: "m" '
                                'eltwise_param { operation: MAX } }',
                                {"data": ((2, 3, 4), _normal)}),
}


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_layer_configuration(name, tmp_path):
    body, inputs = EXTRA[name]
    rng = np.random.default_rng(7)
    tops = tuple(inputs)
    net = net_from_text(input_layer(*(shape for shape, _ in inputs.values()), tops=tops) + body)
    randomize(net, seed=3)
    feeds = {top: make(rng, shape) for top, (shape, make) in inputs.items()}
    assert_agrees(export_and_compare(net, tmp_path / "net.onnx", inputs=feeds), name)


# --- pooling: Caffe's rounding, clipping and divisors over many geometries -------------------------------------

def pooling_geometries():
    """(size, kernel, stride, pad, round_mode): every kernel/stride/pad up to 3 (pad < kernel, Caffe's rule), on an
    odd and an even size, ceil and floor."""
    for size in (5, 6):
        for kernel in (1, 2, 3):
            for stride in (1, 2, 3):
                for pad in range(kernel):
                    for mode in ("CEIL", "FLOOR"):
                        yield size, kernel, stride, pad, mode


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_pooling_geometries_agree_or_are_refused(pool, tmp_path):
    rng = np.random.default_rng(11)
    exported = refused = 0
    for size, kernel, stride, pad, mode in pooling_geometries():
        text = input_layer((2, 2, size, size + 1)) + (
            'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: %s kernel_size: %d '
            'stride: %d pad: %d round_mode: %s } }' % (pool, kernel, stride, pad, mode))
        net = net_from_text(text)
        what = "%s size %d kernel %d stride %d pad %d %s" % (pool, size, kernel, stride, pad, mode)
        feeds = {"data": rng.standard_normal((2, 2, size, size + 1)).astype(np.float32)}
        try:
            model = build_model(net)
        except ExportError as exc:
            # only a last window that lies wholly past the input (no pad, stride > kernel)
            assert "wholly outside the input" in str(exc) and pad == 0 and stride > kernel, what
            refused += 1
            continue
        assert_agrees(compare(net, model, inputs=feeds), what)
        exported += 1
    assert exported >= 60 and refused > 0


# --- names ---------------------------------------------------------------------------------------------------

IN_PLACE = input_layer((2, 3, 6, 6)) + """
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool1" top: "fc" inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
layer { name: "side" type: "Sigmoid" bottom: "conv1" top: "side" }
"""


def test_in_place_writes_become_distinct_values_and_the_net_names_stay(tmp_path):
    net = net_from_text(IN_PLACE)
    randomize(net)
    model = to_onnx(net, tmp_path / "net.onnx")
    graph = model.graph
    produced = [o for node in graph.node for o in node.output]
    assert len(produced) == len(set(produced)), "every value written once"
    assert [v.name for v in graph.input] == ["data"]
    assert sorted(v.name for v in graph.output) == sorted(net.outputs) == ["prob", "side"]
    # conv1 is written three times: the last write keeps the name, the earlier ones carry their writer's
    assert {"conv1/conv1", "conv1/relu1", "conv1"} <= set(produced)
    names = value_names(net)
    assert names[(net.layer_names.index("bn1"), 0)] == "conv1"
    assert [tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in graph.output] == \
        [net.blob_by_name(v.name).shape for v in graph.output]
    assert_agrees(compare(net, model), "in-place net")


def test_an_input_written_in_place_keeps_its_name_as_the_graph_input(tmp_path):
    net = net_from_text(input_layer((2, 3)) + 'layer { name: "r" type: "ReLU" bottom: "data" top: "data" }'
                        'layer { name: "s" type: "TanH" bottom: "data" top: "t" }')
    model = to_onnx(net, tmp_path / "net.onnx")
    assert [v.name for v in model.graph.input] == ["data"]
    assert [v.name for v in model.graph.output] == ["t"]
    assert_agrees(compare(net, model), "in-place input")


def test_weights_are_the_nets_and_a_shared_blob_is_stored_once(tmp_path):
    text = input_layer((2, 4), (2, 4), tops=("a", "b")) + """
layer { name: "ip_a" type: "InnerProduct" bottom: "a" top: "ya" param { name: "w" } param { name: "bias" }
        inner_product_param { num_output: 3 } }
layer { name: "ip_b" type: "InnerProduct" bottom: "b" top: "yb" param { name: "w" } param { name: "bias" }
        inner_product_param { num_output: 3 } }
"""
    net = net_from_text(text)
    randomize(net)
    model = to_onnx(net, tmp_path / "net.onnx")
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    assert len(weights) == 2
    stored = sorted(weights.values(), key=lambda a: a.ndim)
    np.testing.assert_array_equal(stored[1], net.layers[1].blobs[0].data)
    np.testing.assert_array_equal(stored[0], net.layers[1].blobs[1].data)
    assert_agrees(compare(net, model), "shared weights")


# --- options -------------------------------------------------------------------------------------------------

REDUCING = input_layer((2, 3, 4, 5)) + """
layer { name: "mvn" type: "MVN" bottom: "data" top: "mvn" }
layer { name: "bn" type: "BatchNorm" bottom: "mvn" top: "bn" batch_norm_param { use_global_stats: false } }
layer { name: "r" type: "Reduction" bottom: "bn" top: "r" reduction_param { operation: SUMSQ axis: 1 } }
layer { name: "a" type: "Reduction" bottom: "bn" top: "a" reduction_param { operation: ASUM axis: 2 } }
"""


@pytest.mark.parametrize("opset", [MIN_OPSET, 17, 18, 21])
def test_opsets_before_and_after_reductions_took_their_axes_as_inputs(opset, tmp_path):
    net = net_from_text(REDUCING)
    model = to_onnx(net, tmp_path / "net.onnx", opset=opset)
    assert model.opset_import[0].version == opset
    assert_agrees(compare(net, model), "opset %d" % opset)


def test_input_shapes_reshape_the_net_before_export(tmp_path):
    net = net_from_text(IN_PLACE)
    model = to_onnx(net, tmp_path / "net.onnx", input_shapes={"data": (5, 3, 6, 6)})
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [5, 3, 6, 6] and net.blob_by_name("prob").shape == (5, 3)
    assert_agrees(compare(net, model), "reshaped")


# --- refusals ------------------------------------------------------------------------------------------------

LOSS_NET = input_layer((2, 3), (2,), tops=("data", "label")) + """
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 4 } }
layer { name: "the_loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def test_an_unsupported_layer_names_itself_in_one_line_and_leaves_no_file(tmp_path):
    out = tmp_path / "model.onnx"
    with pytest.raises(ExportError) as info:
        to_onnx(net_from_text(LOSS_NET), out)
    assert isinstance(info.value, PycaffeDistError)
    assert str(info.value) == ("layer 'the_loss' (SoftmaxWithLoss): cannot be exported to ONNX: a loss layer needs "
                               "labels: export a deploy net (Softmax for the probabilities)")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_export_leaves_an_existing_file_as_it_was(tmp_path):
    out = tmp_path / "model.onnx"
    to_onnx(net_from_text(IN_PLACE), out)
    before = out.read_bytes()
    with pytest.raises(ExportError):
        to_onnx(net_from_text(LOSS_NET), out)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_a_failure_while_writing_removes_the_temporary_file(tmp_path, monkeypatch):
    import os

    def broken(fd):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="disk full"):
        to_onnx(net_from_text(IN_PLACE), tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_data_layers_are_refused_with_the_way_out(tmp_path):
    text = ('layer { name: "gen" type: "DummyData" top: "data" dummy_data_param { shape { dim: 2 dim: 3 } } }'
            'layer { name: "s" type: "Sigmoid" bottom: "data" top: "s" }')
    with pytest.raises(ExportError, match=r"^layer 'gen' \(DummyData\): cannot be exported to ONNX: .*Input layer"):
        to_onnx(net_from_text(text), tmp_path / "m.onnx")


def test_stochastic_spp_is_refused():
    text = input_layer((1, 2, 4, 4)) + ('layer { name: "spp" type: "SPP" bottom: "data" top: "s" '
                                        'spp_param { pyramid_height: 2 pool: STOCHASTIC } }')
    with pytest.raises(ExportError, match=r"layer 'spp' \(SPP\): .*samples at random"):
        build_model(net_from_text(text))


def test_a_train_phase_net_is_refused():
    with pytest.raises(ExportError, match="TEST phase"):
        build_model(net_from_text(IN_PLACE, phase=caffe_pb2.TRAIN))


@pytest.mark.parametrize("opset", [MIN_OPSET - 1, 1000])
def test_an_opset_out_of_range_is_refused(opset):
    with pytest.raises(ExportError, match="opset %d is not supported: choose one from %d" % (opset, MIN_OPSET)):
        build_model(net_from_text(IN_PLACE), opset=opset)


def test_an_unknown_input_name_is_refused(tmp_path):
    with pytest.raises(ExportError, match="has no input blob 'image' \\(its inputs: data\\)"):
        to_onnx(net_from_text(IN_PLACE), tmp_path / "m.onnx", input_shapes={"image": (1, 3, 6, 6)})
    assert list(tmp_path.iterdir()) == []


def test_without_the_onnx_package_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)      # import onnx now raises ImportError
    with pytest.raises(ExportError, match=r"needs the onnx package: pip install 'pycaffe-dist\[onnx\]'"):
        to_onnx(net_from_text(IN_PLACE), tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_weights_past_the_protobuf_limit_are_refused_before_writing(tmp_path, monkeypatch):
    from pycaffe_dist.export import onnx_graph
    monkeypatch.setattr(onnx_graph, "PROTOBUF_LIMIT", 100)
    with pytest.raises(ExportError, match="past the 2 GB a single ONNX file can hold"):
        to_onnx(net_from_text(IN_PLACE), tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_an_input_nothing_reads_is_also_an_output(tmp_path):
    net = net_from_text(input_layer((2, 3), (2,), tops=("data", "extra")) +
                        'layer { name: "s" type: "TanH" bottom: "data" top: "t" }')
    model = to_onnx(net, tmp_path / "m.onnx")
    assert [v.name for v in model.graph.output] == ["extra", "t"]
    assert_agrees(compare(net, model), "pass-through input")


def test_batchnorm_with_a_zero_factor_has_zero_statistics_as_caffe(tmp_path):
    net = net_from_text(input_layer((2, 3, 4)) + 'layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" '
                        'batch_norm_param { eps: 0.25 } }')
    bn = net.layers[1]
    bn.blobs[0].data[...] = [1.0, 2.0, 3.0]
    bn.blobs[1].data[...] = [4.0, 5.0, 6.0]
    bn.blobs[2].data[...] = 0.0
    model = to_onnx(net, tmp_path / "bn.onnx")
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = run_onnx(model, {"data": x})
    np.testing.assert_allclose(y, x / np.sqrt(np.float32(0.25)), rtol=1e-6)
    assert_agrees(compare(net, model, inputs={"data": x}), "zero factor")
