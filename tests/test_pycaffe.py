"""The pycaffe interface: a pycaffe script runs unchanged, `import caffe` and all; Net's constructor forms,
dictionaries, copy_from errors and save/load round trips."""
import subprocess
import sys
import time

import numpy as np
import pytest

import pycaffe_dist as caffe
from pycaffe_dist.errors import ModelFileError, NetError
from pycaffe_dist.io.prototxt import parse_text
from tests.conftest import GOLDEN, REPO, ZOO, load_npz

LENET_DEPLOY = ZOO / "bvlc" / "examples" / "mnist" / "lenet.prototxt"
LENET_WEIGHTS = GOLDEN / "nets" / "lenet" / "weights.caffemodel"


def test_net_surgery_script_runs_unchanged(tmp_path):
    script = REPO / "tests" / "scripts" / "net_surgery_lenet.py"
    run = subprocess.run([sys.executable, str(script), str(LENET_DEPLOY), str(LENET_WEIGHTS), str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr
    assert "ip1 weights are (500, 800) dimensional and biases are (500,) dimensional" in run.stdout
    assert "ip-conv1 weights are (500, 50, 4, 4) dimensional" in run.stdout
    assert "output shape (1, 10, 4, 4)" in run.stdout and "surgery ok" in run.stdout
    assert (tmp_path / "lenet_full_conv.caffemodel").stat().st_size > 4 * 430000


@pytest.mark.parametrize("make", [
    lambda: caffe.Net(str(LENET_DEPLOY), caffe.TEST),
    lambda: caffe.Net(str(LENET_DEPLOY), caffe.TEST, weights=str(LENET_WEIGHTS)),
    lambda: caffe.Net(str(LENET_DEPLOY), str(LENET_WEIGHTS), caffe.TEST),
    lambda: caffe.Net(network_file=str(LENET_DEPLOY), phase=caffe.TEST),
    lambda: caffe.Net(LENET_DEPLOY, phase=caffe.TEST, weights=LENET_WEIGHTS),
])
def test_constructor_forms(make):
    net = make()
    assert list(net.params) == ["conv1", "conv2", "ip1", "ip2"]
    assert net.inputs == ["data"] and net.outputs == ["prob"]
    assert net.blobs["data"].data.shape == (64, 1, 28, 28)


def test_weights_load_exactly_and_save_round_trips(tmp_path):
    net = caffe.Net(str(LENET_DEPLOY), str(LENET_WEIGHTS), caffe.TEST)
    params = load_npz(GOLDEN / "nets" / "lenet" / "params.npz")
    np.testing.assert_array_equal(net.params["ip1"][0].data, params["param/ip1/0"])
    net.save(str(tmp_path / "copy.caffemodel"))
    again = caffe.Net(str(LENET_DEPLOY), caffe.TEST, weights=str(tmp_path / "copy.caffemodel"))
    for name in net.params:
        for a, b in zip(net.params[name], again.params[name]):
            np.testing.assert_array_equal(a.data, b.data)


def test_copy_from_shape_mismatch_names_layer_and_shapes(tmp_path):
    text = LENET_DEPLOY.read_text().replace("num_output: 500", "num_output: 300")
    (tmp_path / "lenet300.prototxt").write_text(text)
    net = caffe.Net(str(tmp_path / "lenet300.prototxt"), caffe.TEST)
    with pytest.raises(NetError, match=r"layer 'ip1'; shape mismatch. Source param shape is \(500, 800\); "
                                       r"target param shape is \(300, 800\)"):
        net.copy_from(str(LENET_WEIGHTS))


def test_copy_from_bad_files(tmp_path):
    net = caffe.Net(str(LENET_DEPLOY), caffe.TEST)
    truncated = tmp_path / "cut.caffemodel"
    truncated.write_bytes(LENET_WEIGHTS.read_bytes()[:5000])
    with pytest.raises(ModelFileError, match="cut.caffemodel: is not a Caffe model .* or is truncated"):
        net.copy_from(str(truncated))
    with pytest.raises(ModelFileError, match="missing.caffemodel: no such file"):
        net.copy_from(str(tmp_path / "missing.caffemodel"))


def test_copy_from_reads_hdf5_models_and_fills_the_first_layer_of_a_name(tmp_path):
    from pycaffe_dist.io.caffemodel import write_model
    net = caffe.Net(str(LENET_DEPLOY), caffe.TEST, weights=str(LENET_WEIGHTS))
    write_model(net, str(tmp_path / "lenet.caffemodel.h5"), hdf5=True)
    back = caffe.Net(str(LENET_DEPLOY), caffe.TEST, weights=str(tmp_path / "lenet.caffemodel.h5"))
    np.testing.assert_array_equal(back.params["conv1"][0].data, net.params["conv1"][0].data)
    # two layers named ip1: CopyTrainedLayersFrom searches from the front, so the first gets the weights
    text = LENET_DEPLOY.read_text() + ('layer { name: "ip1" type: "InnerProduct" bottom: "prob" top: "again" '
                                       'inner_product_param { num_output: 500 } }')
    (tmp_path / "twice.prototxt").write_text(text)
    twice = caffe.Net(str(tmp_path / "twice.prototxt"), caffe.TEST, weights=str(LENET_WEIGHTS))
    first = twice.layers[list(twice._layer_names).index("ip1")]
    np.testing.assert_array_equal(first.blobs[0].data, net.params["ip1"][0].data)


def test_blob_reshape_then_net_reshape():
    net = caffe.Net(str(LENET_DEPLOY), caffe.TEST)
    net.blobs["data"].reshape(3, 1, 28, 28)
    net.reshape()
    assert net.blobs["prob"].data.shape == (3, 10)
    assert (net.blobs["data"].num, net.blobs["data"].channels, net.blobs["data"].count) == (3, 1, 3 * 28 * 28)


def test_forward_checks_inputs():
    net = caffe.Net(str(LENET_DEPLOY), caffe.TEST)
    with pytest.raises(NetError, match="do not match net inputs"):
        net.forward(image=np.zeros((64, 1, 28, 28), np.float32))
    with pytest.raises(NetError, match="not batch sized"):
        net.forward(data=np.zeros((2, 1, 28, 28), np.float32))


def test_share_with_shares_the_other_nets_data_not_its_diffs():
    """Caffe's ShareTrainedLayersWith: ShareData only, so a backward in one net leaves the other's diffs alone."""
    trained = caffe.Net(str(LENET_DEPLOY), str(LENET_WEIGHTS), caffe.TEST)
    fresh = caffe.Net(str(LENET_DEPLOY), caffe.TEST)
    fresh.share_with(trained)
    for mine, theirs in zip(fresh.param_blobs, trained.param_blobs):
        assert np.shares_memory(mine.data, theirs.data) and not np.shares_memory(mine.diff, theirs.diff)
    trained.params["ip1"][0].data[0, 0] = 7.0                  # later changes show through
    assert fresh.params["ip1"][0].data[0, 0] == 7.0
    fresh.params["ip1"][0].diff[...] = 1.0
    assert not trained.params["ip1"][0].diff.any()
    text = LENET_DEPLOY.read_text().replace("num_output: 500", "num_output: 300")
    other = caffe.Net(parse_text(text, caffe.caffe_pb2.NetParameter()), caffe.TEST)
    with pytest.raises(NetError, match=r"cannot share param 0 of layer 'ip1': shape \(500, 800\) vs. \(300, 800\)"):
        other.share_with(trained)


def test_layer_type_list_is_the_registry_sorted_as_caffes_map():
    types = caffe.layer_type_list()
    assert types == sorted(types) and len(types) == len(set(types))
    assert {"Convolution", "InnerProduct", "Python", "SoftmaxWithLoss", "Data"} <= set(types)
    assert types.index("BNLL") < types.index("BatchNorm")      # byte order, as std::map<string> sorts


def test_a_build_without_nccl_answers_as_caffes_and_says_what_to_use():
    assert caffe.has_nccl() is False
    nccl = caffe.NCCL(None, "uid")                      # constructed, as a Caffe built without USE_NCCL allows
    with pytest.raises(AttributeError, match=r"NCCL.bcast: this build has no NCCL .*dist_caffe train --workers N"):
        nccl.bcast()
    assert not hasattr(caffe.NCCL, "new_uid")           # Caffe's test of new_uid runs only where has_nccl()


def test_timer_counts_whole_milliseconds_on_the_cpu_and_reading_stops_it():
    import logging

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    timer, lines = caffe.Timer(), Lines()
    logging.getLogger("pycaffe_dist").addHandler(lines)
    try:
        assert timer.ms == 0.0
    finally:
        logging.getLogger("pycaffe_dist").removeHandler(lines)
    assert lines.lines == ["Timer has never been run before reading time."]
    timer.start()
    time.sleep(0.1)
    first = timer.ms                                    # stops the timer
    time.sleep(0.01)
    assert first == timer.ms and first >= 100 and first == int(first)
    timer.start()
    timer.start()                                       # a second start while running changes nothing
    time.sleep(0.005)
    timer.stop()
    assert 5 <= timer.ms < first


def test_init_log_and_log_write_glog_lines_to_stderr():
    script = ("import pycaffe_dist as caffe\n"
              "caffe.log('not shown before init_log')\n"
              "caffe.init_log()\ncaffe.log('hello from pycaffe')\n"
              "caffe.init_log(1)\ncaffe.log('below the level')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("I") and lines[0].endswith("] hello from pycaffe"), lines
