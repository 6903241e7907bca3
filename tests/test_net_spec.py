"""NetSpec (pycaffe's net_spec.py): Caffe's LeNet as examples/01-learning-lenet writes it, naming rules, the
<type>_param lookup, repeated fields, and errors."""
import pytest
from google.protobuf import text_format

import pycaffe_dist as caffe
from pycaffe_dist import layers as L
from pycaffe_dist import params as P
from pycaffe_dist.proto import caffe_pb2


def lenet(lmdb, batch_size):
    # examples/01-learning-lenet.ipynb, unchanged but for the import
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=batch_size, backend=P.Data.LMDB, source=lmdb,
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type='xavier'))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, weight_filler=dict(type='xavier'))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type='xavier'))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type='xavier'))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n.to_proto()


# The notebook's lenet_auto_train.prototxt (what the real pycaffe writes), fields in Caffe's text order.
LENET_AUTO_TRAIN = """
layer { name: "data" type: "Data" top: "data" top: "label"
  transform_param { scale: 0.00392156862745 }
  data_param { source: "mnist/mnist_train_lmdb" batch_size: 64 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc1" type: "InnerProduct" bottom: "pool2" top: "fc1"
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "fc1" top: "fc1" }
layer { name: "score" type: "InnerProduct" bottom: "fc1" top: "score"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }
"""


def parse_net(text):
    return text_format.Parse(text, caffe_pb2.NetParameter())


def test_lenet_matches_caffes_generated_prototxt():
    assert lenet("mnist/mnist_train_lmdb", 64) == parse_net(LENET_AUTO_TRAIN)
    test_net = parse_net(LENET_AUTO_TRAIN.replace("mnist_train_lmdb", "mnist_test_lmdb")
                         .replace("batch_size: 64", "batch_size: 100"))
    assert lenet("mnist/mnist_test_lmdb", 100) == test_net


def test_str_of_proto_is_a_prototxt_our_net_reads(tmp_path):
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 1, 28, 28]))
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type='xavier'))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool1, num_output=10, weight_filler=dict(type='xavier'))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.prob = L.Softmax(n.relu1)
    path = tmp_path / "net.prototxt"
    path.write_text(str(n.to_proto()))     # how pycaffe scripts save a NetSpec
    net = caffe.Net(str(path), caffe.TEST)
    assert list(net.blobs) == ["data", "conv1", "pool1", "ip1", "prob"]
    assert net.blobs["prob"].data.shape == (2, 10)
    assert [p[0].data.shape for p in net.params.values()] == [(20, 1, 5, 5), (10, 2880)]


def test_unassigned_tops_and_layers_are_named_type_and_count():
    data = L.Input(shape=dict(dim=[2, 3]))
    ip = L.InnerProduct(L.ReLU(L.ReLU(data)), num_output=4)
    net = ip.to_proto()   # Top.to_proto == to_proto(top)
    assert [(l.name, list(l.bottom), list(l.top)) for l in net.layer] == [
        ("Input1", [], ["Input1"]),
        ("ReLU1", ["Input1"], ["ReLU1"]),
        ("ReLU2", ["ReLU1"], ["ReLU2"]),
        ("InnerProduct1", ["ReLU2"], ["InnerProduct1"]),
    ]
    assert caffe.to_proto(ip) == net


def test_to_proto_of_several_tops_shares_layers_and_counts():
    data = L.Input(shape=dict(dim=[2, 3]))
    a, b = L.ReLU(data), L.Sigmoid(data)
    net = caffe.to_proto(a, b)
    assert [l.name for l in net.layer] == ["Input1", "ReLU1", "Sigmoid1"]
    assert [list(l.bottom) for l in net.layer] == [[], ["Input1"], ["Input1"]]


def test_multiple_tops_and_partly_named():
    n = caffe.NetSpec()
    n.data, label = L.Data(source="x", batch_size=4, ntop=2)   # second top not assigned: auto-named
    n.a, n.b = L.Slice(n.data, slice_point=[1], ntop=2)
    n.silence = L.Silence(n.b, ntop=0)                         # ntop=0: the Function itself, named by attribute
    L.Silence(label, ntop=0)                                   # not reachable from the NetSpec: not in the net
    net = n.to_proto()
    assert [(l.name, list(l.bottom), list(l.top)) for l in net.layer] == [
        ("data", [], ["data", "Data1"]),
        ("a", ["data"], ["a", "b"]),
        ("silence", ["b"], []),
    ]
    assert list(net.layer[1].slice_param.slice_point) == [1]


def test_ntop0_layer_is_named_by_attribute_and_delitem_drops_it():
    fn = L.Silence(L.Input(shape=dict(dim=[1])), ntop=0)
    assert isinstance(fn, caffe.net_spec.Function) and fn.tops == ()
    n = caffe.NetSpec()
    n.data = fn.inputs[0]
    n.s1 = fn
    n.s2 = L.Silence(n.data, ntop=0)
    del n["s2"]
    assert [(l.name, list(l.bottom), list(l.top)) for l in n.to_proto().layer] == [
        ("data", [], ["data"]), ("s1", ["data"], [])]


def test_keywords_go_to_type_param_or_layer():
    n = caffe.NetSpec()
    n.data, n.label = L.Data(source="db", batch_size=8, include=dict(phase=caffe.TRAIN), ntop=2)
    n.conv = L.Convolution(n.data, num_output=8, kernel_size=[3, 5], pad=1, name="convA",
                           param=[dict(lr_mult=1), dict(lr_mult=2, decay_mult=0)],
                           weight_filler=dict(type="gaussian", std=0.01), bias_filler=dict(type="constant"))
    n.deconv = L.Deconvolution(n.conv, convolution_param=dict(num_output=3, kernel_size=2, stride=2))
    n.relu = L.ReLU(n.deconv, negative_slope=0.1, in_place=True)
    n.lrn = L.LRN(n.relu, local_size=5, alpha=1e-4)
    n.h5 = L.HDF5Data(source="list.txt", batch_size=2)
    n.loss = L.SoftmaxWithLoss(n.lrn, n.label, loss_weight=0.5, loss_param=dict(ignore_label=255),
                               propagate_down=[True, False])
    expected = parse_net("""
      layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TRAIN }
              data_param { source: "db" batch_size: 8 } }
      layer { name: "convA" type: "Convolution" bottom: "data" top: "conv"
              param { lr_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
              convolution_param { num_output: 8 pad: 1 kernel_size: 3 kernel_size: 5
                                  weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" } } }
      layer { name: "deconv" type: "Deconvolution" bottom: "conv" top: "deconv"
              convolution_param { num_output: 3 kernel_size: 2 stride: 2 } }
      layer { name: "relu" type: "ReLU" bottom: "deconv" top: "deconv" relu_param { negative_slope: 0.1 } }
      layer { name: "lrn" type: "LRN" bottom: "deconv" top: "lrn" lrn_param { local_size: 5 alpha: 0.0001 } }
      layer { name: "h5" type: "HDF5Data" top: "h5" hdf5_data_param { source: "list.txt" batch_size: 2 } }
      layer { name: "loss" type: "SoftmaxWithLoss" bottom: "lrn" bottom: "label" top: "loss"
              loss_weight: 0.5 propagate_down: true propagate_down: false loss_param { ignore_label: 255 } }
    """)
    assert n.to_proto() == expected


def test_deconvolution_bare_keywords_reach_convolution_param():
    # pycaffe has no table entry for Deconvolution (its bare keywords fail there); here they work.
    net = caffe.to_proto(L.Deconvolution(L.Input(shape=dict(dim=[1, 1, 2, 2])), num_output=2, kernel_size=2))
    assert net.layer[1].convolution_param.num_output == 2


def test_messages_and_tuples_are_accepted():
    filler = caffe_pb2.FillerParameter(type="xavier")
    net = caffe.to_proto(L.Convolution(L.Input(shape=dict(dim=[1, 1, 4, 4])), num_output=1, kernel_size=(2, 3),
                                       weight_filler=filler))
    assert list(net.layer[1].convolution_param.kernel_size) == [2, 3]
    assert net.layer[1].convolution_param.weight_filler == filler


def test_update_changes_params_before_to_proto():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3]))
    n.ip = L.InnerProduct(n.data, num_output=4)
    n.update("ip", dict(num_output=7))
    assert n.keys() == ["data", "ip"] and n.vals() == [n.data, n["ip"]]
    assert n.to_proto().layer[1].inner_product_param.num_output == 7


def test_params_gives_enum_values():
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX
    assert P.Pooling.AVE == caffe_pb2.PoolingParameter.AVE
    assert P.Data.LMDB == caffe_pb2.DataParameter.LMDB
    assert P.Eltwise.SUM == caffe_pb2.EltwiseParameter.SUM
    with pytest.raises(AttributeError):
        P.NoSuchLayer.X
    with pytest.raises(AttributeError):
        P.Pooling.NO_SUCH_VALUE


def test_unknown_fields_are_errors():
    data = L.Input(shape=dict(dim=[1, 3]))
    with pytest.raises(AttributeError, match=r"'InnerProduct1' \(InnerProduct\): unknown parameter 'num_outputs'"
                                             r".*inner_product_param nor of LayerParameter"):
        caffe.to_proto(L.InnerProduct(data, num_outputs=4))
    with pytest.raises(AttributeError, match="unknown parameter 'kernel'.*LayerParameter"):
        caffe.to_proto(L.SoftmaxWithLoss(data, data, kernel=3))
    with pytest.raises(AttributeError, match="FillerParameter has no field 'typo'"):
        caffe.to_proto(L.InnerProduct(data, num_output=4, weight_filler=dict(typo="xavier")))
    with pytest.raises(AttributeError, match="ConvolutionParameter has no field 'foo'"):
        caffe.to_proto(L.Convolution(data, convolution_param=dict(foo=1)))
    with pytest.raises(TypeError):
        caffe.to_proto(L.InnerProduct(data, num_output="four"))


def test_inputs_must_be_tops():
    n = caffe.NetSpec()
    with pytest.raises(TypeError, match="ReLU input 0 is not a Top"):
        L.ReLU("data")
    with pytest.raises(AttributeError):
        n.missing
    with pytest.raises(KeyError):
        n["missing"]


def test_layers_attribute_keeps_the_layer_subpackage_reachable():
    import pycaffe_dist.layers as layers_attr
    from pycaffe_dist.layers import create_layer
    assert layers_attr is caffe.layers
    assert layers_attr.create_layer is create_layer
    assert callable(caffe.layers.Convolution)
