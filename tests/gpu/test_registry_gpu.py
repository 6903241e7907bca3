"""Which registered layer types (pycaffe_dist/layers/registry.py) have GPU code. The Net runs a layer's forward_gpu /
backward_gpu where its class defines them (layers/base.py), else its CPU code on the blobs' host copies, as Caffe's
Layer::Forward_gpu falls back to Forward_cpu; here is the list of the types that fall back, and why."""
import pytest

from pycaffe_dist.layers import create_layer, layer_types
from tests.layers.gradient_checker import layer_param

# Types that ran their CPU code on host copies on a real GPU (an H200 run listed them) and have GPU code as Caffe's
# *.cu since.
NOW_ON_THE_DEVICE = ["BatchReindex", "ContrastiveLoss", "Filter", "Flatten", "HDF5Data", "LSTM", "LSTMUnit", "RNN",
                     "Reduction", "Reshape"]

# The types whose CPU code runs on the GPU path. Caffe has no GPU code for them either, but for HDF5Output
# (hdf5_output_layer.cu copies the blobs to the host and writes them: what our CPU code on the host copies does) and
# WindowData (a prefetching layer: base_data_layer.cu's Forward_gpu copies the prefetched batch to the device).
CPU_ONLY = {
    "ArgMax": "argmax_layer has no .cu",
    "DummyData": "dummy_data_layer has no .cu: its fillers run on the host",
    "HDF5Output": "writes the host copies to a file",
    "HingeLoss": "hinge_loss_layer has no .cu",
    "InfogainLoss": "infogain_loss_layer has no .cu",
    "Input": "no computation: the net's inputs",
    "MemoryData": "memory_data_layer has no .cu: it points its tops at host arrays",
    "MultinomialLogisticLoss": "multinomial_logistic_loss_layer has no .cu",
    "Parameter": "no computation: its top shares the parameter blob",
    "Python": "user code, on the host as in Caffe",
    "WindowData": "its forward is not supported (docs/differences.md)",
}


def layer_class(type_name):
    return type(create_layer(layer_param('type: "%s"' % type_name)))


def has_gpu_code(cls):
    # a layer without a backward pass (data layers, ArgMax) needs only forward_gpu
    return cls.forward_gpu is not None and (cls.backward_gpu is not None or not cls.has_backward)


@pytest.mark.parametrize("type_name", NOW_ON_THE_DEVICE)
def test_the_type_has_gpu_code(type_name):
    assert has_gpu_code(layer_class(type_name)), type_name


def test_only_the_listed_types_fall_back_to_their_cpu_code():
    falling_back = {t for t in layer_types() if not has_gpu_code(layer_class(t))}
    assert falling_back == set(CPU_ONLY)
