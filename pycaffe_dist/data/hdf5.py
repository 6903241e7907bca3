"""HDF5 files as our readers open them (HDF5Data sources, .caffemodel.h5 weights, .solverstate.h5 states): every
failure of h5py or the HDF5 library on a damaged file becomes one of our errors, naming the file and the object.

h5py reports a file that is not HDF5 as OSError, and a damaged object inside one as OSError, KeyError,
RuntimeError, ValueError or TypeError (a datatype numpy lacks), depending on where the damage is (found by
tests/fuzz). H5_ERRORS lists them; `reading` catches them around h5py's calls only, never around our own code.

A dataset is checked from its header before it is read (`read_array`):
- its datatype is numeric (integers, unsigned, floats, bool);
- it holds at most MAX_VALUES values: Caffe counts a blob's values in an int;
- it asks for at most MAX_EXPANSION times the bytes it takes in the file, plus 1 MiB: HDF5 returns the fill value
  for chunks that were never written, so a few damaged header bytes could otherwise make a tiny file allocate
  gigabytes. Caffe's writers store every value, and compression (h5py's gzip, as in Caffe's hdf5_classification
  example) stays far below 1024x on real data.
"""
import contextlib

import numpy as np

from ..blob.blob import INT_MAX
from ..errors import DataError

H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)
MAX_VALUES = INT_MAX
MAX_EXPANSION = 1024
_SLACK_BYTES = 1 << 20


@contextlib.contextmanager
def reading(path, what="", error=DataError):
    """Turn h5py's errors in the block into `error` naming the file and `what` was being read."""
    try:
        yield
    except H5_ERRORS as exc:
        raise error("%s: %scannot be read (damaged HDF5?): %s: %s"
                    % (path, what + ": " if what else "", type(exc).__name__, exc)) from None


def open_file(path, error=DataError):
    """The HDF5 file at `path`, open for reading."""
    import h5py
    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise error("%s: no such file" % path) from None
    except H5_ERRORS as exc:
        raise error("%s: is not a readable HDF5 file: %s" % (path, exc)) from None


def is_dataset(item):
    import h5py
    return isinstance(item, h5py.Dataset)


def is_group(item):
    import h5py
    return isinstance(item, h5py.Group)


def get(group, name, path, error=DataError):
    """group[name], or None where there is no such object (a dangling link counts as none)."""
    with reading(path, "'%s'" % name, error):
        if name not in group:
            return None
        return group[name]


def read_array(dataset, path, what, error=DataError, dtype=None):
    """The dataset's values as a numpy array (converted to `dtype` if given), after the checks of the module
    docstring; `what` names it in messages."""
    with reading(path, what, error):
        if not is_dataset(dataset):
            raise error("%s: %s: is a group, expected a dataset" % (path, what))
        kind, shape = dataset.dtype.kind, dataset.shape
        if shape is None:           # a null dataspace: no values at all
            raise error("%s: %s: is an empty (null) dataset" % (path, what))
        count = int(np.prod(shape, dtype=object))
        stored = dataset.id.get_storage_size()
        wanted = count * dataset.dtype.itemsize
    if kind not in "biuf":
        raise error("%s: %s: has datatype %s; expected numbers" % (path, what, dataset.dtype))
    if count > MAX_VALUES:
        raise error("%s: %s: has shape %s, %d values: more than a Caffe blob holds (%d)"
                    % (path, what, shape, count, MAX_VALUES))
    if wanted > MAX_EXPANSION * stored + _SLACK_BYTES:
        raise error("%s: %s: declares shape %s (%d bytes) but takes only %d bytes in the file; damaged or hostile"
                    % (path, what, shape, wanted, stored))
    with reading(path, what, error):
        array = dataset[()]
    return np.asarray(array, dtype=dtype) if dtype is not None else np.asarray(array)


def read_string(dataset, path, what, error=DataError):
    """A scalar string dataset (H5LTmake_dataset_string) as str, NUL padding removed."""
    with reading(path, what, error):
        if not is_dataset(dataset) or dataset.dtype.kind not in "SO" or dataset.shape not in ((), (1,)):
            raise error("%s: %s: expected one string" % (path, what))
        value = dataset[()]
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0]
    if isinstance(value, str):
        return value
    if not isinstance(value, bytes):
        raise error("%s: %s: expected one string" % (path, what))
    try:
        return value.rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error("%s: %s: is not UTF-8 (byte 0x%02x at position %d)"
                    % (path, what, value[exc.start], exc.start)) from None


def layer_groups(group, path, error=DataError):
    """Names of the groups under `group` that hold datasets or nothing (a .caffemodel.h5's layers, nested where a
    layer name holds '/'), each group once: hard links can make a group its own descendant."""
    names, seen = [], set()

    def walk(group, prefix):
        with reading(path, "group '%s'" % (prefix or "/"), error):
            items = [(key, group[key]) for key in group]
        for key, item in items:
            # h5py gives a name that is not UTF-8 as bytes: no layer can have it (Caffe would skip it too)
            if not isinstance(key, str) or not is_group(item) or item.id in seen:
                continue
            seen.add(item.id)
            full = prefix + key
            with reading(path, "group '%s'" % full, error):
                has_data = not len(item) or any(is_dataset(v) for v in item.values())
            if has_data:
                names.append(full)
            walk(item, full + "/")

    walk(group, "")
    return names
