"""Input, DummyData and the data-source layers (Data, ImageData, WindowData, HDF5Data, HDF5Output, MemoryData).

The source-reading layers learn their top shapes from the first record of their source, as Caffe's
DataLayerSetUp does; a source that cannot be opened is a DataError naming the layer and the path (Caffe
would abort the same way). Reading batches is pycaffe_dist.data's job.
"""
import os

import numpy as np

from .. import common
from ..backend import select
from ..errors import DataError
from ..blob.filler import fill
from ..proto import caffe_pb2
from .base import Layer
from .registry import register


def _shape_list(shape_proto):
    return tuple(int(d) for d in shape_proto.dim)


class _SourceLayer(Layer):
    """Common checks of layers that read a file or database named by their param's `source`."""
    exact_num_bottom = 0
    has_backward = False

    def source_path(self, source):
        self.check(bool(source), "no data source given (set %s.source)" % self.param_field)
        if not os.path.exists(source):
            raise DataError("layer '%s' (%s): cannot open data source '%s': no such file or directory"
                            % (self.name, self.param.type, source))
        return source

    def where(self):
        return "layer '%s' (%s)" % (self.name, self.param.type)

    def backward(self, top, propagate_down, bottom):
        pass


class _PrefetchingLayer(_SourceLayer):
    """Caffe's BasePrefetchingDataLayer: batches of (data, label) made `prefetch` deep by a background thread;
    tops: data (batch, C, H, W) [, label (batch,)]. `prefetcher.wait_s` is the time forward waited for data."""

    def start_prefetch(self, make_batch, depth):
        from ..data.prefetch import DeviceStager, Prefetcher
        stage = DeviceStager()

        def make_staged_batch():
            data, labels = make_batch()
            return data, labels, stage([data] if labels is None else [data, labels])
        self.prefetcher = Prefetcher(make_staged_batch, depth, owner=self, name="prefetch-" + self.name)

    def reshape(self, bottom, top):
        batch = getattr(self.param, self.param_field).batch_size
        top[0].reshape((batch,) + self.record_shape)
        if len(top) > 1:
            top[1].reshape((batch,))

    def forward(self, bottom, top):
        data, labels, _ = self.prefetcher.next()
        top[0].reshape(data.shape)           # records of another size in this batch (Caffe reshapes per batch)
        top[0].data[...] = data
        if len(top) > 1:
            top[1].data[...] = labels

    def forward_gpu(self, bottom, top):
        data, labels, staged = self.prefetcher.next()
        if staged is None:                   # made before GPU mode was switched on
            top[0].reshape(data.shape)
            top[0].data[...] = data
            if len(top) > 1:
                top[1].data[...] = labels
            return
        dev = select.current()
        top[0].reshape(data.shape)
        dev.copy(top[0].mutable_gpu_data, staged[0])
        if len(top) > 1:
            dev.copy(top[1].mutable_gpu_data, staged[1])

    def shard(self):
        """(index, count) of the records this layer reads: the process's data shard in TRAIN, all in TEST."""
        return common.data_shard() if self.phase == caffe_pb2.TRAIN else (0, 1)


@register("Input")
class InputLayer(Layer):
    """Tops are the net's inputs; shapes from input_param.shape (once, or once per top). Reshape keeps what the
    user set, so `net.blobs['data'].reshape(...)` then `net.reshape()` works as in Caffe."""
    exact_num_bottom = 0
    min_top = 1
    has_backward = False

    def layer_setup(self, bottom, top):
        shapes = self.param.input_param.shape
        self.check(len(shapes) in (0, 1, len(top)), "must specify 'shape' once, once per top blob, or not at all: "
                   "%d tops vs. %d shapes" % (len(top), len(shapes)))
        for i, blob in enumerate(top):
            if len(shapes):
                blob.reshape(_shape_list(shapes[0 if len(shapes) == 1 else i]))

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass


@register("DummyData")
class DummyDataLayer(Layer):
    """Tops of given shapes filled by fillers; refilled each forward unless every filler is constant."""
    exact_num_bottom = 0
    min_top = 1
    has_backward = False

    def layer_setup(self, bottom, top):
        p, n = self.param.dummy_data_param, len(top)
        self.check(len(p.data_filler) in (0, 1, n), "number of data fillers must be 0, 1 or equal to the number "
                   "of tops: %d tops vs. %d fillers" % (n, len(p.data_filler)))
        # dummy_data_layer.cpp: shapes come from `shape` or from all four legacy fields, each given once or once
        # per top
        legacy = [("num", p.num), ("channels", p.channels), ("height", p.height), ("width", p.width)]
        if any(len(values) for _, values in legacy):
            self.check(not len(p.shape), "both shape and legacy fields were specified")
            for name, values in legacy:
                self.check(len(values) in (1, n), "must specify '%s' once, or once per top blob (%d); specified %d"
                           % (name, n, len(values)))
            shapes = [tuple(int(values[0 if len(values) == 1 else i]) for _, values in legacy) for i in range(n)]
        else:
            self.check(len(p.shape) in (1, n), "must specify 'shape' once, or once per top blob (%d); specified %d"
                       % (n, len(p.shape)))
            shapes = [_shape_list(p.shape[0 if len(p.shape) == 1 else i]) for i in range(n)]
        constant = caffe_pb2.FillerParameter()
        constant.type = "constant"
        self.fillers = [p.data_filler[0 if len(p.data_filler) == 1 else i] if len(p.data_filler) else constant
                        for i in range(n)]
        self.refill = [f.type != "constant" for f in self.fillers]
        # Caffe fills the constant tops once, here; the others at every forward (and not before).
        for blob, shape, filler, refill in zip(top, shapes, self.fillers, self.refill):
            blob.reshape(shape)
            if not refill:
                fill(filler, blob)

    def reshape(self, bottom, top):
        pass     # dummy_data_layer.hpp: a data layer has no bottoms, so a top keeps the shape it was given

    def forward(self, bottom, top):
        for blob, filler, refill in zip(top, self.fillers, self.refill):
            if refill:
                fill(filler, blob)

    def backward(self, top, propagate_down, bottom):
        pass


@register("Data")
class DataLayer(_PrefetchingLayer):
    """Records from a database (LMDB, LevelDB or datumfile), read in store order with wrap-around; the TRAIN
    phase reads only this process's shard (common.set_data_shard). rand_skip skips a random number of records
    in [0, rand_skip) at the start, as Caffe's DataReader did."""
    min_top, max_top = 1, 2
    param_field = "data_param"

    def layer_setup(self, bottom, top):
        from ..data import sources
        from ..data.batches import datum_image, record_batches
        from ..data.transform import DataTransformer
        p = self.param.data_param
        self.check(p.batch_size > 0, "data_param.batch_size must be positive")
        path = self.source_path(p.source)
        transformer = DataTransformer(self.param.transform_param, self.phase, self.where())
        try:
            source = sources.open_records(path, p.backend)
            datum = sources.first_datum(source)
            record = datum_image(datum, self.param.transform_param, "%s: %s" % (self.where(), path))
        except DataError as exc:
            raise DataError("%s: %s" % (self.where(), exc)) from None
        transformer.check_mean(*record.shape)
        self.record_shape = transformer.output_shape(*record.shape)
        skip = int(self.rng.integers(p.rand_skip)) if p.rand_skip else 0
        index, count = self.shard()
        self.start_prefetch(record_batches(source, p.batch_size, transformer, self.where(), skip, index, count),
                            p.prefetch)


@register("MemoryData")
class MemoryDataLayer(_SourceLayer):
    """Batches handed over from Python (`net.set_input_arrays(data, labels)`, Caffe's MemoryDataLayer::Reset);
    tops data (batch, C, H, W) and label (batch,), (batch, 1, 1, 1) once a forward ran. Each forward takes the
    next batch_size rows, wrapping around. Like Caffe's Reset path, the arrays are used as given (no
    transform_param)."""
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.memory_data_param
        self.check(p.batch_size > 0 and p.channels > 0 and p.height > 0 and p.width > 0,
                   "batch_size, channels, height and width must be specified and positive")
        self.shape = (p.batch_size, p.channels, p.height, p.width)
        # Caffe's label top is (batch,) after setup and (batch, 1, 1, 1) from the first forward on
        self.label_shape = self.shape[:1]
        self.data = self.labels = None
        self.pos = 0

    def reset(self, data, labels):
        data = np.ascontiguousarray(data, dtype=np.float32)
        labels = np.ascontiguousarray(labels, dtype=np.float32).reshape(-1)
        batch = self.shape[0]
        self.check(data.ndim == 4 and data.shape[1:] == self.shape[1:],
                   "data must have shape (N, %d, %d, %d), got %s" % (self.shape[1:] + (data.shape,)))
        self.check(len(labels) == len(data), "%d labels for %d images" % (len(labels), len(data)))
        self.check(len(data) > 0 and len(data) % batch == 0,
                   "the number of images (%d) must be a positive multiple of batch_size (%d)" % (len(data), batch))
        self.data, self.labels, self.pos = data, labels, 0

    def reshape(self, bottom, top):
        top[0].reshape(self.shape)
        top[1].reshape(self.label_shape)

    def forward(self, bottom, top):
        self.check(self.data is not None, "no input arrays: call net.set_input_arrays(data, labels) first")
        batch = self.shape[0]
        self.label_shape = (batch, 1, 1, 1)
        top[1].reshape(self.label_shape)
        top[0].data[...] = self.data[self.pos:self.pos + batch]
        top[1].data.reshape(-1)[...] = self.labels[self.pos:self.pos + batch]
        self.pos = (self.pos + batch) % len(self.data)


@register("ImageData")
class ImageDataLayer(_PrefetchingLayer):
    """Images named in a list file ("path label" per line) under root_folder, resized to new_height x new_width
    if set, shuffled at every pass if `shuffle`. We join root_folder and the name as paths where Caffe
    concatenates strings (a root_folder without a trailing slash works here and fails in Caffe)."""
    exact_num_top = 2
    param_field = "image_data_param"

    def layer_setup(self, bottom, top):
        from ..data import images
        from ..data.batches import image_list_batches
        from ..data.convert import read_image_list
        from ..data.transform import DataTransformer
        p = self.param.image_data_param
        self.check((p.new_height == 0 and p.new_width == 0) or (p.new_height > 0 and p.new_width > 0),
                   "current implementation requires new_height and new_width to be set at the same time")
        self.check(p.batch_size > 0, "image_data_param.batch_size must be positive")
        listing = self.source_path(p.source)
        entries = [(name, label) for _, name, label in read_image_list(listing)]
        if not entries:
            raise DataError("%s: the image list %s is empty" % (self.where(), listing))
        index, count = self.shard()
        entries = entries[index::count]
        if not entries:
            raise DataError("%s: shard %d of %d of %s holds no images" % (self.where(), index, count, listing))
        transformer = DataTransformer(self.param.transform_param, self.phase, self.where())
        rng = np.random.default_rng(self.rng.integers(2 ** 63))
        first = os.path.join(p.root_folder, entries[0][0])
        try:
            shape = images.load_image(first, p.is_color, p.new_height, p.new_width).shape
        except DataError as exc:
            raise DataError("%s: %s" % (self.where(), exc)) from None
        transformer.check_mean(*shape)
        self.record_shape = transformer.output_shape(*shape)
        skip = int(self.rng.integers(p.rand_skip)) if p.rand_skip else 0
        # Caffe's BasePrefetchingDataLayer takes its depth from data_param.prefetch for every prefetching layer.
        self.start_prefetch(image_list_batches(entries, p, transformer, rng, self.where(), skip),
                            self.param.data_param.prefetch)


@register("WindowData")
class WindowDataLayer(_SourceLayer):
    """R-CNN style windows from a window file; tops (batch, 3, crop, crop) and label (batch,). The net builds
    (shapes are known), but reading windows is not supported: forward says so."""
    exact_num_top = 2
    param_field = "window_data_param"

    def layer_setup(self, bottom, top):
        p = self.param.window_data_param
        self.source_path(p.source)
        crop = self.param.transform_param.crop_size or p.crop_size
        self.check(crop > 0, "crop_size must be set")
        self.record_shape = (3, crop, crop)

    def reshape(self, bottom, top):
        top[0].reshape((self.param.window_data_param.batch_size,) + self.record_shape)
        top[1].reshape((self.param.window_data_param.batch_size,))

    def forward(self, bottom, top):
        raise DataError("%s: reading R-CNN window files is not supported; convert the windows to an image list "
                        "(ImageData) or a database (Data)" % self.where())


@register("HDF5Data")
class HDF5DataLayer(_SourceLayer):
    """Datasets named like the tops, from the HDF5 files listed in `source` (Caffe's HDF5DataLayer): each file is
    loaded whole, batch_size rows per forward, wrapping over rows and then files. With `shuffle` the file order
    is shuffled once and the rows of each file at each load, as Caffe does. No transform_param (Caffe has none).
    In TRAIN a data shard (i, n) keeps the rows read at running positions p with p % n == i, as Caffe's
    HDF5DataLayer::Skip does for solver rank i of n."""
    min_top = 1
    param_field = "hdf5_data_param"
    shard = _PrefetchingLayer.shard

    def layer_setup(self, bottom, top):
        p = self.param.hdf5_data_param
        self.check(p.batch_size > 0, "hdf5_data_param.batch_size must be positive")
        self.check(not self.param.HasField("transform_param"), "HDF5Data does not transform data.")
        listing = self.source_path(p.source)
        try:
            with open(listing, "rb") as f:
                text = f.read().decode("utf-8")
        except OSError as exc:
            raise DataError("%s: cannot read the HDF5 file list %s: %s" % (self.where(), listing, exc.strerror)) \
                from None
        except UnicodeDecodeError as exc:
            raise DataError("%s: the HDF5 file list %s is not UTF-8 text (byte %d)"
                            % (self.where(), listing, exc.start)) from None
        self.files = text.split()     # Caffe reads the list with `>>`: names split at any whitespace
        if not self.files:
            raise DataError("%s: the HDF5 file list %s is empty" % (self.where(), listing))
        self.shapes = None         # (batch_size, *row shape) per top, from the first file loaded
        self.file_order = np.arange(len(self.files))
        if p.shuffle:
            self.file_order = self.rng.permutation(len(self.files))
        self.file_pos = 0
        self.offset = 0            # rows passed so far, kept or skipped: the running position of the shard rule
        self.load_file(self.file_order[0])

    def load_file(self, index):
        from ..data import hdf5
        path = self.files[index]
        try:
            with hdf5.open_file(path) as h5:
                datasets = [(name, hdf5.get(h5, name, path)) for name in self.param.top]
                missing = [name for name, dataset in datasets if dataset is None]
                if missing:
                    raise DataError("cannot read datasets %s from %s: it has no dataset '%s'"
                                    % (", ".join(self.param.top), path, missing[0]))
                self.arrays = [hdf5.read_array(dataset, path, "dataset '%s'" % name, dtype=np.float32)
                               for name, dataset in datasets]
        except DataError as exc:
            raise DataError("%s: %s" % (self.where(), exc)) from None
        scalars = [name for name, array in zip(self.param.top, self.arrays) if array.ndim == 0]
        if scalars:     # Caffe's hdf5_load_nd_dataset: at least one axis, the rows
            raise DataError("%s: %s: dataset '%s' is a scalar; expected rows" % (self.where(), path, scalars[0]))
        rows = {len(a) for a in self.arrays}
        if len(rows) != 1 or 0 in rows:
            raise DataError("%s: %s: the datasets %s must have the same, non-zero number of rows, got %s"
                            % (self.where(), path, ", ".join(self.param.top), [len(a) for a in self.arrays]))
        if self.shapes is None:
            self.shapes = [(self.param.hdf5_data_param.batch_size,) + a.shape[1:] for a in self.arrays]
        for array, shape in zip(self.arrays, self.shapes):
            if array.shape[1:] != shape[1:]:
                raise DataError("%s: %s: dataset rows of shape %s, expected %s as in the first file"
                                % (self.where(), path, array.shape[1:], shape[1:]))
        self.rows = np.arange(len(self.arrays[0]))
        if self.param.hdf5_data_param.shuffle:
            self.rows = self.rng.permutation(len(self.rows))
        self.row_pos = 0

    def reshape(self, bottom, top):
        for blob, shape in zip(top, self.shapes):
            blob.reshape(shape)

    def forward(self, bottom, top):
        self.next_batch([blob.data for blob in top])

    def forward_gpu(self, bottom, top):
        # hdf5_data_layer.cu: the rows are read on the host and copied into the tops' device memory (Caffe copies
        # row by row; the batch is gathered on the host first and goes in one upload per top)
        batches = [self.buffer("batch %d" % i, blob.shape) for i, blob in enumerate(top)]
        self.next_batch(batches)
        dev = select.current()
        for blob, batch in zip(top, batches):
            dev.upload(blob.mutable_gpu_data, batch)

    def next_batch(self, outs):
        """Fill the arrays `outs` (one per top, of the tops' shapes) with the next batch_size rows."""
        batch, filled = self.shapes[0][0], 0
        index, count = self.shard()
        while filled < batch:
            ahead = self.rows[self.row_pos:]
            keep = np.flatnonzero((self.offset + np.arange(len(ahead))) % count == index)[:batch - filled]
            for out, array in zip(outs, self.arrays):
                out[filled:filled + len(keep)] = array[ahead[keep]]
            filled += len(keep)
            passed = keep[-1] + 1 if filled == batch else len(ahead)
            self.row_pos += passed
            self.offset += passed
            if self.row_pos == len(self.rows):
                self.next_file()

    def next_file(self):
        """Caffe's wrap: the next file (the file order reshuffled after the last), rows reshuffled."""
        shuffle = self.param.hdf5_data_param.shuffle
        if len(self.files) > 1:
            self.file_pos += 1
            if self.file_pos == len(self.files):
                self.file_pos = 0
                if shuffle:
                    self.file_order = self.rng.permutation(len(self.files))
            self.load_file(self.file_order[self.file_pos])
        self.row_pos = 0
        if shuffle:
            self.rows = self.rng.permutation(len(self.rows))


@register("HDF5Output")
class HDF5OutputLayer(Layer):
    """Writes its two bottoms to hdf5_output_param.file_name as datasets "data" and "label" at each forward
    (Caffe's HDF5OutputLayer; the file is created at setup, and each forward replaces the datasets, where Caffe
    fails on the second write of the same names)."""
    exact_num_bottom = 2
    exact_num_top = 0
    has_backward = False

    def layer_setup(self, bottom, top):
        import h5py
        path = self.param.hdf5_output_param.file_name
        self.check(bool(path), "hdf5_output_param.file_name must be set")
        try:
            h5py.File(path, "w").close()
        except (OSError, ValueError) as exc:      # ValueError: a name with a NUL byte
            raise DataError("layer '%s' (HDF5Output): cannot create %s: %s" % (self.name, path, exc)) from None

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        import h5py
        self.check(bottom[0].num == bottom[1].num, "data and label must have the same num (%d vs. %d)"
                   % (bottom[0].num, bottom[1].num))
        with h5py.File(self.param.hdf5_output_param.file_name, "a") as h5:
            for name, blob in zip(("data", "label"), bottom):
                if name in h5:
                    del h5[name]
                # hdf5_output_layer.cpp writes the legacy 4-D (num, channels, height, width) blobs
                h5.create_dataset(name, data=blob.data.reshape(blob.num, blob.channels, blob.height, blob.width))

    def backward(self, top, propagate_down, bottom):
        pass
