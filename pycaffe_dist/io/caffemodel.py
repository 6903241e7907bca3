"""A net's weights as Caffe writes and reads them: a .caffemodel (Net::ToProto, a NetParameter with every layer's
blobs) or a .caffemodel.h5 (Net::ToHDF5: data/<layer>/<blob index> for parameters that own themselves, and
diff/... for all with snapshot_diff, a group per layer). Loading is Caffe's CopyTrainedLayersFrom, by content
(binary of any format version, upgraded on the fly, or HDF5), into the first layer of each name.

An HDF5 parameter of the wrong shape is an error naming the file.
"""
import os

from ..errors import ModelFileError
from ..proto.binary import write_binary
from .load import read_net_binary

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def is_hdf5(path):
    try:
        with open(path, "rb") as f:
            return f.read(8) == HDF5_MAGIC
    except OSError as exc:
        raise ModelFileError("%s: cannot read: %s" % (path, exc.strerror)) from None


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
    import h5py
    index = {name: i for i, name in enumerate(net.layer_names)}
    with h5py.File(path, "r") as f:
        if "data" not in f:
            raise ModelFileError("%s: is not a Caffe HDF5 model: it has no 'data' group" % path)
        for name in _layer_groups(f["data"]):
            layer_id = index.get(name)
            if layer_id is None:
                continue
            group, target = f["data"][name], net.layers[layer_id].blobs
            if len(group) > len(target):
                raise ModelFileError("%s: incompatible number of blobs for layer '%s': the file has %d, the net %d"
                                     % (path, name, len(group), len(target)))
            for j, blob in enumerate(target):
                if str(j) not in group:
                    if net.param_owner[_net_param_id(net, layer_id, j)] >= 0:
                        continue    # shared in the net: its owner brings the values
                    raise ModelFileError("%s: incompatible number of blobs for layer '%s': blob %d is missing"
                                         % (path, name, j))
                array = group[str(j)][()]
                if tuple(array.shape) != blob.shape:
                    raise ModelFileError("%s: cannot load blob %d of layer '%s': shape mismatch. Source shape is "
                                         "%s; target shape is %s" % (path, j, name, array.shape, blob.shape))
                blob.data[...] = array


def _layer_groups(group, prefix=""):
    """Names of the groups holding datasets (layer names, with '/' where h5py nested them)."""
    import h5py
    names = []
    for key, item in group.items():
        if isinstance(item, h5py.Group):
            full = prefix + key
            if not len(item) or any(isinstance(v, h5py.Dataset) for v in item.values()):
                names.append(full)
            names.extend(_layer_groups(item, full + "/"))
    return names
