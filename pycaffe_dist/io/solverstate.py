"""A solver's state as Caffe writes and reads it: a .solverstate (SolverState: iter, learned_net, current_step,
history blobs) or a .solverstate.h5 (SGDSolver::SnapshotSolverStateToHDF5: iter and current_step as (1,) int32
datasets, the string learned_net and history/<i>).

Loading is stricter than Caffe in one way: a history blob of the wrong shape is an error naming the file (Caffe
reshapes binary history blobs silently). A damaged HDF5 state is a ModelFileError naming the file and the object
(data/hdf5.py).
"""
import os

import numpy as np

from ..blob.blob import Blob
from ..data import hdf5
from ..errors import ModelFileError, NetError, SolverError
from ..proto import caffe_pb2
from ..proto.binary import read_binary, write_binary


def write_state(path, iteration, learned_net, current_step, history, hdf5=False):
    if hdf5:
        _write_state_hdf5(path, iteration, learned_net, current_step, history)
        return
    state = caffe_pb2.SolverState()
    state.iter = iteration
    state.learned_net = learned_net
    state.current_step = current_step
    for array in history:
        blob = Blob(array.shape)
        blob.data[...] = array
        blob.to_proto(proto=state.history.add())
    write_binary(path, state)


def _write_state_hdf5(path, iteration, learned_net, current_step, history):
    import h5py
    with h5py.File(path, "w") as f:
        # hdf5_save_int (H5LTmake_dataset_int, rank 1): a (1,) int32 dataset, as are current_step's
        f.create_dataset("iter", data=np.array([iteration], np.int32))
        # H5LTmake_dataset_string: a scalar, fixed-length, NUL-terminated C string.
        raw = learned_net.encode() + b"\0"
        string_type = h5py.h5t.C_S1.copy()
        string_type.set_size(len(raw))
        string_type.set_strpad(h5py.h5t.STR_NULLTERM)
        space = h5py.h5s.create(h5py.h5s.SCALAR)
        h5py.h5d.create(f.id, b"learned_net", string_type, space).write(space, space, np.array(raw, dtype="S"))
        f.create_dataset("current_step", data=np.array([current_step], np.int32))
        group = f.create_group("history")
        for i, array in enumerate(history):
            group.create_dataset(str(i), data=np.asarray(array, dtype=np.float32))


def read_state(path):
    """A solver state as a dict: iter, learned_net (None if absent), current_step, history (float32 arrays)."""
    path = os.fsdecode(path)
    if path.endswith(".h5"):
        return _read_state_hdf5(path)
    state = read_binary(path, caffe_pb2.SolverState())
    history = []
    for i, proto in enumerate(state.history):
        try:
            history.append(Blob.from_proto_new(proto, what="history blob %d" % i).data)
        except NetError as exc:
            raise ModelFileError("%s: %s" % (path, exc)) from None
    return {"iter": state.iter, "learned_net": state.learned_net if state.HasField("learned_net") else None,
            "current_step": state.current_step, "history": history}


def _read_state_hdf5(path):
    E = ModelFileError
    with hdf5.open_file(path, E) as f:
        found = {key: hdf5.get(f, key, path, E) for key in ("iter", "current_step", "history", "learned_net")}
        for key in ("iter", "current_step", "history"):
            if found[key] is None:
                raise E("%s: is not a Caffe HDF5 solver state: it has no '%s'" % (path, key))
        learned = found["learned_net"]
        if learned is not None:
            learned = hdf5.read_string(learned, path, "'learned_net'", E)
        group = found["history"]
        if not hdf5.is_group(group):
            raise E("%s: 'history' is a dataset, expected a group" % path)
        with hdf5.reading(path, "'history'", E):
            count = len(group)
        history = []
        for i in range(count):
            dataset = hdf5.get(group, str(i), path, E)
            if dataset is None:
                raise E("%s: history datasets must be named 0..%d; %d is missing" % (path, count - 1, i))
            history.append(hdf5.read_array(dataset, path, "history/%d" % i, E, np.float32))
        return {"iter": _hdf5_int(path, found["iter"], "iter"), "learned_net": learned,
                "current_step": _hdf5_int(path, found["current_step"], "current_step"), "history": history}


def _hdf5_int(path, dataset, key):
    """Caffe's hdf5_load_int: one integer, stored as a (1,) dataset (or, by our older snapshots, a scalar)."""
    values = hdf5.read_array(dataset, path, "'%s'" % key, ModelFileError).reshape(-1)
    if values.size != 1:
        raise ModelFileError("%s: '%s' must hold one integer, got %d values" % (path, key, values.size))
    if values.dtype.kind == "f" and not float(values[0]).is_integer():
        raise ModelFileError("%s: '%s' must hold an integer, got %r" % (path, key, float(values[0])))
    return int(values[0])


def check_history(path, history, expected_shapes):
    """Caffe's CHECK_EQ on the number of history blobs, and (ours) their shapes; returns the arrays in the
    parameters' shapes. Old states describe blobs as num/channels/height/width: leading 1s are dropped."""
    if len(history) != len(expected_shapes):
        raise SolverError("%s: incorrect length of history blobs: the state has %d, this solver needs %d"
                          % (path, len(history), len(expected_shapes)))
    out = []
    for i, (array, shape) in enumerate(zip(history, expected_shapes)):
        shape = tuple(shape)
        legacy = len(array.shape) == 4 and len(shape) <= 4 and array.shape == (1,) * (4 - len(shape)) + shape
        if tuple(array.shape) != shape and not legacy:
            raise SolverError("%s: history blob %d has shape %s, the parameter has %s"
                              % (path, i, tuple(array.shape), shape))
        out.append(array.reshape(shape))
    return out
