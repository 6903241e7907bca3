"""The Solver on nets without data files (DummyData): net forms, test nets, smoothing, callbacks, snapshots,
Caffe's configuration checks. The golden comparisons with Caffe are in test_golden_solvers.py."""
import json
import logging
import os

import h5py
import numpy as np
import pytest

import pycaffe_dist as caffe
from pycaffe_dist.errors import SolverError
from pycaffe_dist.proto.binary import read_binary
from pycaffe_dist.io.prototxt import parse_text
from pycaffe_dist.blob import synced_memory
from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.solver import updates
from pycaffe_dist.pycaffe import Solver
from tests.conftest import GOLDEN

NET = """
name: "dummy"
layer { name: "data" type: "DummyData" top: "x" top: "y"
        dummy_data_param { shape { dim: 8 dim: 5 } shape { dim: 8 dim: 2 }
                           data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "extra" type: "Power" bottom: "p" top: "p2" include { stage: "extra" } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""


def net_param(text=NET):
    return parse_text(text, caffe_pb2.NetParameter())


def solver_param(tmp_path, text="", net=NET, **fields):
    p = parse_text("base_lr: 0.01 lr_policy: 'fixed' momentum: 0.9 weight_decay: 0.001 max_iter: 6 "
                   "random_seed: 7 snapshot_prefix: '%s/snap' " % tmp_path + text, caffe_pb2.SolverParameter())
    p.net_param.CopyFrom(net_param(net))
    for key, value in fields.items():
        setattr(p, key, value)
    return p


def test_generic_net_gives_one_test_net_per_test_iter_with_its_test_state(tmp_path):
    p = solver_param(tmp_path, "test_iter: 2 test_iter: 3 test_interval: 4 test_state { stage: 'extra' } "
                               "test_state { }")
    s = Solver(p)
    assert len(s.test_nets) == 2
    assert "extra" in s.test_nets[0].layer_names and "extra" not in s.test_nets[1].layer_names
    assert "extra" not in s.net.layer_names and s.net.phase == caffe_pb2.TRAIN
    assert all(n.phase == caffe_pb2.TEST for n in s.test_nets)
    s.step(5)          # tests at iterations 0 and 4
    for net in s.test_nets:
        assert np.shares_memory(net.params["ip"][0].data, s.net.params["ip"][0].data)   # the train net's weights
    assert [name for name, _ in s.test_scores[0]] == ["loss"] + ["p2"] * 16      # every output element, by name
    assert [name for name, _ in s.test_scores[1]] == ["loss"]


def test_train_net_and_test_net_files(tmp_path):
    (tmp_path / "train.prototxt").write_text(NET)
    (tmp_path / "test.prototxt").write_text(NET)
    p = solver_param(tmp_path, "train_net: '%s/train.prototxt' test_net: '%s/test.prototxt' test_iter: 1 "
                               "test_interval: 10 train_state { stage: 'extra' }" % (tmp_path, tmp_path))
    p.ClearField("net_param")
    s = Solver(p)
    assert "extra" in s.net.layer_names and len(s.test_nets) == 1


@pytest.mark.parametrize("text, message", [
    ("net: 'a.prototxt'", "must specify exactly one train net using one of these fields: net, net_param, "
                          "train_net, train_net_param (it has net, net_param)"),
    ("test_net_param { name: 't' } test_net_param { name: 't' } test_iter: 1",
     "test_iter must be specified for each test network (1 test_iter for 2 test nets)"),
    ("test_iter: 1 test_state { } test_state { }", "test_state must be unspecified or specified once per test net"),
    ("test_iter: 1", "test_interval must be positive when there are test nets"),
    ("iter_size: 0", "iter_size should be at least 1"),
])
def test_configuration_errors(tmp_path, text, message):
    with pytest.raises(SolverError, match="^solver: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        Solver(solver_param(tmp_path, text))


def test_snapshot_prefix_must_be_writable(tmp_path):
    with pytest.raises(SolverError, match="^solver: cannot write to snapshot prefix '/nonexistent/dir/snap' "
                                          r"\(No such file or directory\). Make sure that the directory exists"):
        Solver(solver_param(tmp_path, "snapshot: 5", snapshot_prefix="/nonexistent/dir/snap"))


def test_the_prefix_probe_is_the_solvers_own(tmp_path, monkeypatch):
    """Two solvers of one snapshot prefix starting at once (two jobs in one folder) each probe with a file of their
    own: Caffe's fixed prefix_iter_0.tempfile, removed by the other solver first, failed the second."""
    prefix = tmp_path / "snap"
    caffes_probe = tmp_path / "snap_iter_0.tempfile"
    caffes_probe.write_text("another solver's probe")
    removed = []
    real_remove = os.remove

    def remove(path):
        removed.append(path)
        real_remove(path)
    monkeypatch.setattr(os, "remove", remove)
    Solver(solver_param(tmp_path, "snapshot: 5", snapshot_prefix=str(prefix)))
    assert caffes_probe.read_text() == "another solver's probe"
    assert len(removed) == 1 and removed[0].startswith(str(prefix) + "_iter_0.") and \
        removed[0].endswith(".tempfile") and removed[0] != str(caffes_probe)
    assert sorted(f.name for f in tmp_path.iterdir() if f.name.startswith("snap")) == ["snap_iter_0.tempfile"]


def test_no_train_net(tmp_path):
    p = solver_param(tmp_path)
    p.ClearField("net_param")
    with pytest.raises(SolverError, match="must specify a train net using one of these fields"):
        Solver(p)


MANIFEST = json.loads((GOLDEN / "solvers" / "manifest.json").read_text())


@pytest.mark.parametrize("case", sorted(MANIFEST["rejected_by_caffe"]))
def test_configs_caffe_rejects(tmp_path, case):
    """Caffe's three rejected solvers, on our small net: the same refusal, at the same moment (constructor or the
    first update), as a SolverError."""
    entry = MANIFEST["rejected_by_caffe"][case]
    p = parse_text("\n".join(entry["solver_lines"]), caffe_pb2.SolverParameter())
    p.net_param.CopyFrom(net_param())
    caffe_says = entry["caffe_message"][0]
    if "AdaGrad" in caffe_says:
        with pytest.raises(SolverError, match="momentum cannot be used with AdaGrad"):
            Solver(p)
        return
    s = Solver(p)                       # Caffe checks the lr policy only when it computes a rate
    expected = "unknown learning rate policy: 'stepearly'" if "stepearly" in caffe_says else \
        "lr_policy sigmoid needs gamma >= 0, got -1"
    with pytest.raises(SolverError, match=expected):
        s.step(1)
    assert s.iter == 0


def test_smoothed_loss_over_average_loss_iterations(tmp_path):
    s = Solver(solver_param(tmp_path, "average_loss: 3"))
    losses, smoothed = [], []

    def hook(solver):
        losses.append(np.float32(solver.net.blobs["loss"].data))
        smoothed.append(solver.smoothed_loss)
    s.iteration_hooks.append(hook)
    s.step(6)
    for i in range(6):
        window = losses[max(0, i - 2):i + 1]
        assert smoothed[i] == pytest.approx(np.mean(window), rel=1e-5)


def test_debug_info_logs_each_layer_on_display_iterations(tmp_path, caplog):
    """Caffe's Step sets the net's debug_info to display && debug_info: per-layer mean absolute values after each
    forward and backward, then the L1 / L2 norms of all params."""
    s = Solver(solver_param(tmp_path, "debug_info: true display: 2"))
    seen = []

    def on_gradients():          # iteration 0's values, before the update rewrites the param diffs
        if not seen:
            net = s.net
            seen.append({"[Forward] Layer ip, top blob p data": np.abs(net.blobs["p"].data).mean(),
                         "[Forward] Layer ip, param blob 1 data": np.abs(net.layers[1].blobs[1].data).mean(),
                         "[Backward] Layer loss, bottom blob p diff": np.abs(net.blobs["p"].diff).mean(),
                         "[Backward] Layer ip, param blob 0 diff": np.abs(net.layers[1].blobs[0].diff).mean()})
    s.callbacks.append((lambda: None, on_gradients))
    with caplog.at_level(logging.INFO, logger="pycaffe_dist"):
        s.step(3)                                         # iterations 0, 1, 2: 0 and 2 display
    lines = [r.getMessage() for r in caplog.records if "[Forward]" in r.getMessage() or "[Backward] Layer" in
             r.getMessage()]
    assert len(lines) == 2 * 9                            # 4 tops, 2 params, 1 bottom diff, 2 param diffs
    value = {line.rsplit(":", 1)[0].strip(): float(line.rsplit(":", 1)[1]) for line in lines[:9]}
    for key, expected in seen[0].items():
        assert value[key] == pytest.approx(expected, rel=1e-5), key
    assert "[Backward] Layer ip, bottom blob x diff" not in value     # x needs no gradient
    norms = [r for r in caplog.records if "All net params (data, diff): L1 norm = (" in r.getMessage()]
    assert len(norms) == 2 and norms[0].levelno == logging.ERROR     # iterations 0 and 2 only


def test_callbacks_see_the_gradients_before_the_update(tmp_path):
    s = Solver(solver_param(tmp_path))
    events = []
    w = s.net.params["ip"][0]

    def on_start():
        events.append(("start", s.iter, float(np.abs(w.diff).sum())))

    def on_gradients():
        events.append(("gradients", s.iter, float(np.abs(w.diff).sum())))
        on_gradients.before = w.data.copy()
    s.add_callback(on_start, on_gradients)
    s.step(2)
    assert [e[:2] for e in events] == [("start", 0), ("gradients", 0), ("start", 1), ("gradients", 1)]
    assert events[0][2] == 0 and events[1][2] > 0        # diffs cleared before the pass, filled after it
    assert not np.array_equal(on_gradients.before, w.data)


def test_iter_size_accumulates_like_one_big_batch(tmp_path):
    """Constant data: two passes of batch 8 with iter_size 2 make the same update as one pass."""
    net = NET.replace('data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 }',
                      'data_filler { type: "constant" value: 0.5 } data_filler { type: "constant" value: -1 }')
    one, two = Solver(solver_param(tmp_path, net=net)), Solver(solver_param(tmp_path, "iter_size: 2", net=net))
    two.net.params["ip"][0].data[...] = one.net.params["ip"][0].data
    one.step(3)
    two.step(3)
    np.testing.assert_allclose(two.net.params["ip"][0].data, one.net.params["ip"][0].data, rtol=1e-6)


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"])
@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
def test_snapshot_restore_continues_exactly(tmp_path, kind, fmt):
    momentum = 0.0 if kind in ("AdaGrad", "RMSProp") else 0.9
    p = solver_param(tmp_path, "snapshot: 3 snapshot_format: %s type: '%s'" % (fmt, kind), momentum=momentum)
    p.net_param.layer[0].dummy_data_param.data_filler[0].type = "constant"   # same data after a restore
    p.net_param.layer[0].dummy_data_param.data_filler[1].type = "constant"
    p.net_param.layer[0].dummy_data_param.data_filler[0].value = 0.3
    whole = Solver(p)
    start = {k: [b.data.copy() for b in v] for k, v in whole.net.params.items()}
    whole.solve()
    ext = ".h5" if fmt == "HDF5" else ""
    state = tmp_path / ("snap_iter_3.solverstate" + ext)
    assert state.exists() and (tmp_path / ("snap_iter_6.caffemodel" + ext)).exists()
    resumed = Solver(p)
    for k, blobs in resumed.net.params.items():
        for blob, values in zip(blobs, start[k]):
            blob.data[...] = values + 1         # whatever the net holds, the state's learned_net replaces it
    resumed.restore(state)
    assert resumed.iter == 3 and len(resumed.history) == updates.HISTORY_SETS[kind] * 2
    resumed.solve()
    for k, blobs in whole.net.params.items():
        for a, b in zip(blobs, resumed.net.params[k]):
            np.testing.assert_array_equal(a.data, b.data)
    for a, b in zip(whole.history, resumed.history):
        np.testing.assert_array_equal(a, b)


def test_binary_snapshot_files_parse_with_the_schema(tmp_path):
    s = Solver(solver_param(tmp_path, "type: 'Adam' snapshot_diff: true"))
    s.step(2)
    model, state = s.snapshot()
    assert model == "%s/snap_iter_2.caffemodel" % tmp_path
    net = read_binary(model, caffe_pb2.NetParameter())
    assert [l.name for l in net.layer] == s.net.layer_names
    ip = next(l for l in net.layer if l.name == "ip")
    assert list(ip.blobs[0].shape.dim) == [2, 5] and len(ip.blobs[0].diff) == 10
    np.testing.assert_array_equal(np.array(ip.blobs[1].data, np.float32), s.net.params["ip"][1].data)
    st = read_binary(state, caffe_pb2.SolverState())
    assert st.iter == 2 and st.learned_net == model and st.current_step == 0 and len(st.history) == 4
    np.testing.assert_array_equal(np.array(st.history[2].data, np.float32).reshape(2, 5), s.history[2])
    back = caffe.Net(net_param(), caffe.TEST, weights=model)
    np.testing.assert_array_equal(back.params["ip"][0].data, s.net.params["ip"][0].data)


def test_hdf5_snapshot_layout_is_caffes(tmp_path):
    s = Solver(solver_param(tmp_path, "snapshot_format: HDF5"))
    s.step(1)
    model, state = s.snapshot()
    with h5py.File(model, "r") as f:
        assert set(f) == {"data"} and set(f["data"]) == set(s.net.layer_names)
        assert set(f["data/ip"]) == {"0", "1"} and not len(f["data/loss"])
        np.testing.assert_array_equal(f["data/ip/0"][()], s.net.params["ip"][0].data)
    with h5py.File(state, "r") as f:
        # hdf5_save_int: rank-1 datasets of one int32 (H5LTmake_dataset_int with dims {1})
        assert f["iter"].shape == (1,) and f["iter"][0] == 1 and f["iter"].dtype == np.int32
        assert f["current_step"].shape == (1,) and f["current_step"][0] == 0
        assert f["learned_net"][()] == model.encode() + b"\0" or f["learned_net"][()] == model.encode()
        assert f["learned_net"].id.get_type().get_strpad() == h5py.h5t.STR_NULLTERM
        assert sorted(f["history"]) == ["0", "1"]


def test_hdf5_state_restores_from_caffes_and_our_older_scalar_layout(tmp_path):
    s = Solver(solver_param(tmp_path, "snapshot_format: HDF5"))
    s.step(3)
    _, state = s.snapshot()
    for layout in (lambda v: np.array([v], np.int32), np.int32):     # Caffe's (1,), our older scalar
        with h5py.File(state, "r+") as f:
            for key, value in (("iter", 3), ("current_step", 0)):
                del f[key]
                f.create_dataset(key, data=layout(value))
        back = Solver(solver_param(tmp_path, "snapshot_format: HDF5"))
        back.restore(state)
        assert back.iter == 3
        np.testing.assert_array_equal(back.history[0], s.history[0])


def test_hdf5_model_with_diffs_keeps_the_diffs_of_shared_params(tmp_path):
    # Net::ToHDF5: data only for the owners, diffs "regardless of weight-sharing"
    from pycaffe_dist.io.caffemodel import write_model
    twin = parse_text("""
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "a" type: "InnerProduct" bottom: "x" top: "ya" param { name: "w" }
                inner_product_param { num_output: 2 bias_term: false weight_filler { type: "gaussian" } } }
        layer { name: "b" type: "InnerProduct" bottom: "x" top: "yb" param { name: "w" }
                inner_product_param { num_output: 2 bias_term: false } }
    """, caffe_pb2.NetParameter())
    net = caffe.Net(twin, caffe.TRAIN)
    net.params["a"][0].diff[...] = 1.5
    write_model(net, str(tmp_path / "m.caffemodel.h5"), hdf5=True, write_diff=True)
    with h5py.File(tmp_path / "m.caffemodel.h5", "r") as f:
        assert set(f["data/a"]) == {"0"} and not len(f["data/b"])
        assert set(f["diff/a"]) == {"0"} and set(f["diff/b"]) == {"0"}
        np.testing.assert_array_equal(f["diff/b/0"][()], 1.5)


def test_restore_refuses_a_state_of_another_solver_type(tmp_path):
    s = Solver(solver_param(tmp_path))
    s.step(1)
    _, state = s.snapshot()
    adam = Solver(solver_param(tmp_path, "type: 'Adam'"))
    with pytest.raises(SolverError, match="incorrect length of history blobs: the state has 2, this solver needs 4"):
        adam.restore(state)


def test_solver_computes_where_the_process_mode_says_not_where_solver_mode_does(tmp_path, caplog):
    """Caffe's Solver does not read solver_mode (its train command does): in CPU mode a GPU solver runs on the CPU."""
    caplog.set_level(logging.WARNING, logger="pycaffe_dist")
    s = Solver(solver_param(tmp_path, "solver_mode: GPU device_id: 1"))
    s.step(1)
    assert s.iter == 1 and not caplog.records
    assert s.net.learnable_params[0].data_memory.head == synced_memory.HOST


def test_the_solver_builds_nets_of_its_net_class(tmp_path):
    """The core Solver builds net.Net, pycaffe's solvers pycaffe's Net (with its dictionaries), train and test."""
    from pycaffe_dist.net.net import Net as CoreNet
    from pycaffe_dist.solver.solver import Solver as CoreSolver
    tests = "test_iter: 1 test_interval: 2"
    core = CoreSolver(solver_param(tmp_path, tests))
    assert type(core.net) is CoreNet and [type(n) for n in core.test_nets] == [CoreNet]
    assert not hasattr(core.net, "params")
    ours = Solver(solver_param(tmp_path, tests))
    assert type(ours.net) is caffe.Net and [type(n) for n in ours.test_nets] == [caffe.Net]


def test_pycaffe_solver_classes(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text("net: '%s/net.prototxt' base_lr: 0.01 lr_policy: 'step' gamma: 0.5 "
                                              "stepsize: 2 max_iter: 4 type: 'Nesterov' momentum: 0.9\n" % tmp_path)
    s = caffe.get_solver(str(tmp_path / "solver.prototxt"))
    assert s.type == "Nesterov" and s.max_iter == 4 and s.test_nets == []
    assert isinstance(s.net, caffe.Net) and list(s.net.params) == ["ip"]
    assert s.lr == pytest.approx(0.01)
    s.step(2)
    assert s.iter == 2 and s.lr == pytest.approx(0.005)
    adam = caffe.AdamSolver(str(tmp_path / "solver.prototxt"))
    assert adam.type == "Adam" and len(adam.history) == 4
    other = caffe.Net(net_param(), caffe.TEST)
    s.share_weights(other)
    assert np.shares_memory(other.params["ip"][0].data, s.net.params["ip"][0].data)
    s.solve()
    assert s.iter == 4 and (tmp_path / "solver_iter_4.caffemodel").exists()   # snapshot_prefix from the file name


# --- the API the distributed modes drive the Solver through ----------------------------------------------------

def constant_data(p):
    """DummyData of constant values: every batch the same, so that two solvers see the same gradients."""
    for filler in p.net_param.layer[0].dummy_data_param.data_filler:
        filler.type, filler.value = "constant", 0.3
    return p


def test_apply_gradients_is_the_update_step_makes(tmp_path):
    """compute_gradients at the weights, then apply_gradients at iteration k: the weights and history of step(1)
    from k (the rate, momentum and weight decay at that iteration); the weights do not move in between."""
    text = "gamma: 0.5 stepvalue: 2 stepvalue: 4"
    one, two = (Solver(constant_data(solver_param(tmp_path, text, lr_policy="multistep"))) for _ in range(2))
    for a, b in zip(one.weights, two.weights):
        b[...] = a
    one.step(3)
    two.set_position(0, 0)
    for iteration in range(3):
        before = [w.copy() for w in two.weights]
        gradients, loss = two.compute_gradients()
        assert all(np.array_equal(w, b) for w, b in zip(two.weights, before)) and np.isfinite(loss)
        two.apply_gradients(gradients, iteration)
    assert two.position == one.position == (3, 1)
    for a, b in zip(one.weights, two.weights):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(one.history, two.history):
        np.testing.assert_array_equal(a, b)


def test_step_from_runs_the_iterations_after_k(tmp_path):
    """step_from(k, n) from the same weights: what a solver that had made k updates would do next (the rate of
    multistep's step at k), and its position after."""
    text = "gamma: 0.5 stepvalue: 2 stepvalue: 4"
    whole, later = (Solver(constant_data(solver_param(tmp_path, text, lr_policy="multistep", momentum=0)))
                    for _ in range(2))
    whole.step(4)
    for a, b in zip(whole.weights, later.weights):
        b[...] = a
    loss = later.step_from(4, 2)
    whole.step(2)
    assert later.position == whole.position == (6, 2) and later.rate == whole.rate == np.float32(0.0025)
    assert loss == pytest.approx(float(whole.smoothed_loss), rel=1e-6)
    for a, b in zip(whole.weights, later.weights):
        np.testing.assert_array_equal(a, b)


def test_test_and_snapshot_at_an_iteration_and_restore_without_moving_data(tmp_path, caplog):
    p = solver_param(tmp_path, "test_iter: 2 test_interval: 100 type: 'Adam'")
    s = Solver(p)
    s.step(2)
    scores = s.test_at(40)
    assert [name for name, _ in scores[0]] == ["loss"] and np.isfinite(scores[0][0][1])
    model, state = s.snapshot_at(40)
    assert model.endswith("snap_iter_40.caffemodel") and state.endswith("snap_iter_40.solverstate")
    assert [len(h) for h in s.history_sets()] == [2, 2] and s.history_sets()[1][0] is s.history[2]
    other = Solver(p)
    with caplog.at_level(logging.INFO, "pycaffe_dist.solver"):
        other.restore(state, data_position=False)
    assert other.position == (40, 0) and "Resuming" not in caplog.text       # the data stayed where they were
    for a, b in zip(s.weights, other.weights):
        np.testing.assert_array_equal(a, b)
    assert other.weight_names() == ["ip/0", "ip/1"] and other.images_per_iteration == 8
