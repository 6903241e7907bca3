"""Solver states (io/solverstate.py): binary and HDF5, and damaged files refused with the file named."""
import h5py
import numpy as np
import pytest

from pycaffe_dist.errors import ModelFileError
from pycaffe_dist.io.solverstate import read_state, write_state


@pytest.mark.parametrize("hdf5", [False, True])
def test_round_trip(tmp_path, hdf5):
    path = tmp_path / ("s.solverstate" + (".h5" if hdf5 else ""))
    write_state(path, 7, "net.caffemodel", 2, [np.arange(6, dtype=np.float32).reshape(2, 3)], hdf5=hdf5)
    state = read_state(path)
    assert (state["iter"], state["learned_net"], state["current_step"]) == (7, "net.caffemodel", 2)
    assert state["history"][0].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_damaged_hdf5_states_name_the_file_and_the_object(tmp_path):
    path = tmp_path / "s.solverstate.h5"
    path.write_bytes(bytes.fromhex("894844460d0a1a0a2000"))
    with pytest.raises(ModelFileError, match=r"s.solverstate.h5: is not a readable HDF5 file"):
        read_state(path)

    def state(**datasets):
        with h5py.File(path, "w") as f:
            f.create_group("history")
            f["iter"], f["current_step"] = np.array([1], np.int32), np.array([0], np.int32)
            for name, value in datasets.items():
                if name in f:
                    del f[name]
                f[name] = value
        return path

    with pytest.raises(ModelFileError, match=r"'learned_net': is not UTF-8 \(byte 0xfc at position 1\)"):
        read_state(state(learned_net=np.array(b"n\xfc")))    # decode() raised UnicodeDecodeError
    with pytest.raises(ModelFileError, match=r"'learned_net': expected one string"):
        read_state(state(learned_net=np.zeros(3)))
    with pytest.raises(ModelFileError, match=r"'iter': has datatype \|S1; expected numbers"):
        read_state(state(iter=np.array([b"x"])))
    with pytest.raises(ModelFileError, match=r"'iter' must hold an integer, got nan"):
        read_state(state(iter=np.array([np.nan])))
    with pytest.raises(ModelFileError, match=r"'history' is a dataset, expected a group"):
        read_state(state(history=np.zeros(2)))
