"""`dist_caffe extract-features`: Caffe's tools/extract_features. A net with its own data layers (a train_test
net in its TEST phase) runs `batches` forward passes; after each, every image's values of each named blob are
written out:

- lmdb / leveldb (Caffe's formats) and datumfile: one Datum per image, key "%010d" (the image's number, counted per
  blob from 0), channels / height / width the blob's legacy C/H/W (1 for missing axes), the values in float_data,
  no label: what Caffe's tool writes, so its readers read ours;
- hdf5: one float32 dataset [N, ...] per blob, named after the blob (several blobs may share a file);
- npy: one float32 array [N, ...] per blob.

N = batches x the blob's batch size. Outputs that exist are refused, unless overwrite is asked.
"""
import contextlib
import os

import numpy as np

from ..data import sources
from ..errors import NetError, PycaffeDistError
from ..proto import caffe_pb2
from . import Progress

FORMATS = ("lmdb", "leveldb", "datumfile", "hdf5", "npy")
_SUFFIX = {"lmdb": "_lmdb", "leveldb": "_leveldb", "datumfile": ".datumfile", "hdf5": ".h5", "npy": ".npy"}


class FeatureError(PycaffeDistError):
    """Blob names, outputs or a net that extract-features cannot use."""


def check_blobs(net, blob_names, model):
    """Every name must be a blob of the net (Caffe: "Unknown feature blob name ... in the network ...")."""
    if not blob_names or any(not name for name in blob_names):
        raise FeatureError("--blobs needs blob names separated by commas, got %r" % ",".join(blob_names))
    known = net.blobs
    for name in blob_names:
        if name not in known:
            raise FeatureError("%s: the net (TEST phase) has no blob named '%s'; its blobs: %s"
                               % (model, name, ", ".join(known)))
    if len(set(blob_names)) != len(blob_names):
        raise FeatureError("--blobs names a blob twice: %s" % ",".join(blob_names))
    if net.inputs:
        raise FeatureError("%s: the net takes input blobs (%s) that nothing would fill; extract-features runs a net "
                           "with data layers, such as a train_test net (for image files use `dist_caffe classify`)"
                           % (model, ", ".join(net.inputs)))


def output_paths(blob_names, output, fmt):
    """{blob: output path}. `output` is one path per blob, comma-separated (Caffe's), or one directory that
    exists, where each blob's output is named after it (fc7 -> fc7.npy, fc7_lmdb, ...); for hdf5, one file may
    also take every blob."""
    if fmt not in FORMATS:
        raise FeatureError("--format must be one of %s, got %r" % (", ".join(FORMATS), fmt))
    paths = output.split(",")
    if len(paths) == 1 and os.path.isdir(paths[0]) and not _is_store(paths[0]):
        return {name: os.path.join(paths[0], name.replace("/", "_") + _SUFFIX[fmt]) for name in blob_names}
    if len(paths) == 1 and fmt == "hdf5":
        return {name: paths[0] for name in blob_names}
    if len(paths) != len(blob_names):
        raise FeatureError("%d blob names but %d outputs (--output takes one path per blob, comma-separated, or an "
                           "existing directory)" % (len(blob_names), len(paths)))
    if fmt != "hdf5" and len(set(paths)) != len(paths):
        raise FeatureError("--output names one path for two blobs: %s" % output)
    return dict(zip(blob_names, paths))


def _is_store(path):
    """Whether a directory is an LMDB or LevelDB store (an output to overwrite), not a directory to write in."""
    return any(os.path.isfile(os.path.join(path, f)) for f in ("data.mdb", "CURRENT"))


class _RecordSink:
    """Caffe's Datum per image into a record store."""

    def __init__(self, path, fmt, overwrite):
        self.writer = sources.open_writer(path, fmt, overwrite)
        self.path, self.count = path, 0

    def write(self, name, blob):
        try:
            num, channels, height, width = blob.num, blob.channels, blob.height, blob.width
        except NetError:
            raise FeatureError("blob '%s' is %s: a Datum holds at most 4 axes (use --format hdf5 or npy)"
                               % (name, "x".join(map(str, blob.shape)))) from None
        rows = np.asarray(blob.data, dtype=np.float32).reshape(num, -1)
        for row in rows:
            datum = caffe_pb2.Datum(channels=channels, height=height, width=width)
            datum.float_data.extend(row.tolist())
            self.writer.put(b"%010d" % self.count, datum.SerializeToString())
            self.count += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.writer.__exit__(*exc)     # commits the last records only when no error ends the run


class _ArraySink:
    """[N, ...] float32 for a blob: a .npy file written in place (np.lib.format.open_memmap), or a dataset of an
    HDF5 file; made at the first batch, once the blob's shape is known."""

    def __init__(self, path, fmt, total_batches, h5_files):
        self.path, self.fmt, self.total_batches, self.h5_files = path, fmt, total_batches, h5_files
        self.array, self.shape, self.count = None, None, 0

    def write(self, name, blob):
        data = np.asarray(blob.data, dtype=np.float32)
        data = data.reshape((1,)) if data.ndim == 0 else data
        if self.array is None:
            self.shape = data.shape
            total = (self.total_batches * data.shape[0],) + data.shape[1:]
            try:
                if self.fmt == "npy":
                    self.array = np.lib.format.open_memmap(self.path, mode="w+", dtype=np.float32, shape=total)
                else:
                    self.array = self.h5_files[self.path].create_dataset(name, shape=total, dtype=np.float32)
            except (OSError, ValueError) as exc:        # no room, no permission; h5py: a clashing name
                raise FeatureError("%s: cannot write blob '%s' there: %s" % (self.path, name, exc)) from None
        elif data.shape != self.shape:
            raise FeatureError("blob '%s' changed shape from %s to %s between batches; its values cannot be stacked"
                               % (name, self.shape, data.shape))
        self.array[self.count:self.count + len(data)] = data
        self.count += len(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.fmt == "npy" and self.array is not None:
            self.array.flush()
        self.array = None


def _check_free(paths, fmt, overwrite):
    for path in sorted(set(paths)):
        if os.path.lexists(path) and not overwrite and fmt in ("hdf5", "npy"):
            raise FeatureError("%s: already exists; refusing to overwrite it (--overwrite replaces it)" % path)
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise FeatureError("%s: no directory %s to write it in" % (path, parent))


def extract_features(net, blob_names, batches, outputs, fmt, overwrite=False, stream=None):
    """Run `batches` forward passes of `net` and write each named blob's values to outputs[blob] in format `fmt`.
    Returns {blob: number of images written}."""
    if batches < 1:
        raise FeatureError("--batches must be at least 1, got %d" % batches)
    _check_free(outputs.values(), fmt, overwrite)
    first = net.blobs[blob_names[0]].data
    per_batch = first.shape[0] if first.ndim else 1
    progress = Progress("extract-features", batches * per_batch, stream)
    sinks = {}
    try:
        with contextlib.ExitStack() as stack:
            h5_files = {}
            if fmt == "hdf5":
                import h5py
                for path in sorted(set(outputs.values())):
                    try:
                        h5_files[path] = stack.enter_context(h5py.File(path, "w"))
                    except OSError as exc:
                        raise FeatureError("%s: cannot create the HDF5 file: %s" % (path, exc)) from None
            for name in blob_names:
                sink = _ArraySink(outputs[name], fmt, batches, h5_files) if fmt in ("hdf5", "npy") else \
                    _RecordSink(outputs[name], fmt, overwrite)
                sinks[name] = stack.enter_context(sink)
            for _ in range(batches):
                net.forward_from_to()
                for name in blob_names:
                    sinks[name].write(name, net.blobs[name])
                progress.step(per_batch)
    finally:
        progress.close()
    return {name: sink.count for name, sink in sinks.items()}
