"""Every golden case of the real Caffe (layers and nets) through the GPU code path: layers with GPU code run it,
the others fall back to their CPU code on the host copies, and the blobs carry the data across."""
import pytest

from tests.layers.golden_cases import layer_case_names, run_layer_case
from tests.net import test_golden_nets as golden_nets


@pytest.mark.parametrize("name", layer_case_names())
def test_golden_layer_case_on_gpu(gpu, name):
    run_layer_case(name)


@pytest.mark.parametrize("name", ["lenet", "cifar10_quick"])
def test_train_forward_and_backward_match_caffe_on_gpu(gpu, name):
    golden_nets.test_train_forward_and_backward_match_caffe(name)


@pytest.mark.parametrize("name", ["lenet", "cifar10_quick"])
def test_test_phase_outputs_match_caffe_on_gpu(gpu, name):
    golden_nets.test_test_phase_outputs_match_caffe(name)


@pytest.mark.parametrize("name", ["squeezenet_v1.1", "resnet50_kaiminghe"])
def test_zoo_deploy_forward_matches_caffe_on_gpu(gpu, name):
    golden_nets.test_zoo_deploy_forward_matches_caffe(name)
