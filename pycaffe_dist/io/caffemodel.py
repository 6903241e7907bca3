"""A net's weights as Caffe writes and reads them: a .caffemodel (Net::ToProto, a NetParameter with every layer's
blobs) or a .caffemodel.h5 (Net::ToHDF5: data/<layer>/<blob index> for parameters that own themselves, and
diff/... for all with snapshot_diff, a group per layer). Loading is Caffe's CopyTrainedLayersFrom, by content
(binary of any format version, upgraded on the fly, or HDF5), into the first layer of each name.

An HDF5 parameter of the wrong shape is an error naming the file, checked before it is read; a damaged HDF5 file
is a ModelFileError naming the file and the object (data/hdf5.py).
"""
import os

from ..data import hdf5
from ..errors import ModelFileError, ModelFileNotFound
from ..proto.binary import write_binary
from .load import read_net_binary

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def is_hdf5(path):
    try:
        with open(path, "rb") as f:
            return f.read(8) == HDF5_MAGIC
    except FileNotFoundError:
        raise ModelFileNotFound("%s: no such file" % path) from None
    except OSError as exc:
        raise ModelFileError("%s: cannot read: %s" % (path, exc.strerror)) from None
    except ValueError as exc:      # a name with a NUL byte (a solver state's learned_net may hold one)
        raise ModelFileError("%r: cannot read: %s" % (str(path), exc)) from None


def write_model(net, path, hdf5=False, write_diff=False):
    if hdf5:
        _write_model_hdf5(net, path, write_diff)
    else:
        write_binary(path, net.to_proto(write_diff))


def _write_model_hdf5(net, path, write_diff):
    import h5py
    with h5py.File(path, "w") as f:
        groups = [f.create_group("data")] + ([f.create_group("diff")] if write_diff else [])
        for layer_id, (name, layer) in enumerate(zip(net.layer_names, net.layers)):
            # A layer name may hold '/': h5py then nests groups, and reading walks the same path.
            layer_groups = [g.require_group(name) for g in groups]
            for j, blob in enumerate(layer.blobs):
                # Net::ToHDF5: data only for params that own themselves, diffs "regardless of weight-sharing"
                if net.param_owner[_net_param_id(net, layer_id, j)] < 0:
                    layer_groups[0].create_dataset(str(j), data=blob.data)
                if write_diff:
                    layer_groups[1].create_dataset(str(j), data=blob.diff)


def _net_param_id(net, layer_id, blob_id):
    return net.param_layer_index.index((layer_id, blob_id))


def load_weights(net, path):
    """Caffe's Net::CopyTrainedLayersFrom(file): binary (any format version) or HDF5, by content."""
    path = os.fsdecode(path)
    if is_hdf5(path):
        _load_weights_hdf5(net, path)
    else:
        net.copy_trained_layers_from(read_net_binary(path), path)


def _load_weights_hdf5(net, path):
    index = {name: i for i, name in enumerate(net.layer_names)}
    with hdf5.open_file(path, ModelFileError) as f:
        data = hdf5.get(f, "data", path, ModelFileError)
        if data is None or not hdf5.is_group(data):
            raise ModelFileError("%s: is not a Caffe HDF5 model: it has no 'data' group" % path)
        for name in hdf5.layer_groups(data, path, ModelFileError):
            layer_id = index.get(name)
            if layer_id is None:
                continue
            group, target = hdf5.get(data, name, path, ModelFileError), net.layers[layer_id].blobs
            with hdf5.reading(path, "layer '%s'" % name, ModelFileError):
                count = len(group)
            if count > len(target):
                raise ModelFileError("%s: incompatible number of blobs for layer '%s': the file has %d, the net %d"
                                     % (path, name, count, len(target)))
            for j, blob in enumerate(target):
                dataset = hdf5.get(group, str(j), path, ModelFileError)
                if dataset is None:
                    if net.param_owner[_net_param_id(net, layer_id, j)] >= 0:
                        continue    # shared in the net: its owner brings the values
                    raise ModelFileError("%s: incompatible number of blobs for layer '%s': blob %d is missing"
                                         % (path, name, j))
                what = "layer '%s' blob %d" % (name, j)
                if not hdf5.is_dataset(dataset):
                    raise ModelFileError("%s: %s: is a group, expected a dataset" % (path, what))
                with hdf5.reading(path, what, ModelFileError):
                    shape = dataset.shape
                # checked before reading: a damaged file may declare any shape
                if shape != blob.shape:
                    raise ModelFileError("%s: cannot load blob %d of layer '%s': shape mismatch. Source shape is "
                                         "%s; target shape is %s" % (path, j, name, shape, blob.shape))
                blob.data[...] = hdf5.read_array(dataset, path, what, ModelFileError)
