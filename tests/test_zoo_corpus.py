"""Every prototxt of tests/fixtures/zoo parses, upgrades and builds (nets), or fails as Caffe would, cleanly."""
import json
import os

import pytest

from pycaffe_dist.errors import DataError, NetError, PrototxtError, SolverError
from pycaffe_dist.io.load import read_net, read_solver
from pycaffe_dist.net.net import Net
from pycaffe_dist.net.state import filter_net, make_state
from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.solver.lr_policy import check_policy
from tests.conftest import GOLDEN, ZOO

MANIFEST = json.loads((GOLDEN / "upgrade" / "manifest.json").read_text())["files"]
SOURCE_LAYERS = {"Data": "data_param", "ImageData": "image_data_param", "WindowData": "window_data_param",
                 "HDF5Data": "hdf5_data_param"}


def missing_sources(kept):
    """Data sources the kept layers read that do not exist here (the zoo ships no databases)."""
    return [getattr(l, SOURCE_LAYERS[l.type]).source for l in kept.layer
            if l.type in SOURCE_LAYERS and not os.path.exists(getattr(l, SOURCE_LAYERS[l.type]).source)]


def states(param):
    """Each phase alone, and with each stage the net's rules name (solvers pick them via test_state)."""
    stages = sorted({s for l in param.layer for r in list(l.include) + list(l.exclude)
                     for s in list(r.stage) + list(r.not_stage)})
    return [(phase, ()) for phase in (caffe_pb2.TRAIN, caffe_pb2.TEST)] + \
        [(phase, (s,)) for phase in (caffe_pb2.TRAIN, caffe_pb2.TEST) for s in stages]


def expected_failure(param, phase, stages):
    """The error Caffe would stop with for this state, as (our exception type, message pattern), or None."""
    kept = filter_net(param, make_state(phase, stages=stages))
    produced = set()
    for layer in kept.layer:
        if layer.type == "Python":
            return NetError, "cannot import module '%s'" % layer.python_param.module
        lost = [b for b in layer.bottom if b not in produced]
        if lost:   # e.g. a stage-only data layer: "Unknown bottom blob"
            return NetError, "unknown bottom blob '%s'" % lost[0]
        produced.update(layer.top)
    missing = missing_sources(kept)
    if missing:    # Caffe aborts opening the database; we name layer and source
        return DataError, "cannot open data source '%s'" % missing[0]
    return None


@pytest.mark.parametrize("rel", sorted(MANIFEST))
def test_zoo_file(rel):
    entry, path = MANIFEST[rel], ZOO / rel
    if entry["status"] == "parse_failed":
        with pytest.raises(PrototxtError) as info:
            (read_solver if entry["kind"] == "solver" else read_net)(path)
        assert str(path) in str(info.value) and ":18:" in str(info.value)
        return
    if entry["kind"] == "solver":
        solver = read_solver(path)
        assert not solver.HasField("solver_type")
        for net in [solver.net_param] * solver.HasField("net_param") + list(solver.test_net_param):
            assert not len(net.layers), "nested nets are upgraded on load"
        if solver.HasField("lr_policy"):
            check_policy(solver, str(path))
        return
    param = read_net(path)
    assert not len(param.layers) and not len(param.input), "upgraded on load to V2"
    built = 0
    for phase, stages in states(param):
        failure = expected_failure(param, phase, stages)
        if failure:
            with pytest.raises(failure[0], match=failure[1]):
                Net(param, phase=phase, stages=stages, fill_params=False)
        else:
            net = Net(param, phase=phase, stages=stages, fill_params=False)
            assert all(all(d >= 0 for d in b.shape) for b in net.blob_list)
            built += 1
    if not any(l.type in SOURCE_LAYERS or l.type == "Python" for l in param.layer):
        assert built, "a net without data sources must build in some state"


def test_unknown_lr_policy_is_refused_like_caffe():
    solver = caffe_pb2.SolverParameter(lr_policy="stepearly", base_lr=0.01)
    with pytest.raises(SolverError, match="unknown learning rate policy: 'stepearly'"):
        check_policy(solver)
