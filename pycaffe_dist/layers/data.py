"""Input, DummyData and the data-source layers (Data, ImageData, WindowData, HDF5Data, HDF5Output, MemoryData).

The source-reading layers learn their top shapes from the first record of their source, as Caffe's
DataLayerSetUp does; a source that cannot be opened is a DataError naming the layer and the path (Caffe
would abort the same way). Reading batches is pycaffe_dist.data's job.
"""
import os

from ..errors import DataError
from ..net.filler import fill
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

    def backward(self, top, propagate_down, bottom):
        pass


class _RecordLayer(_SourceLayer):
    """Layers whose tops are a batch of records of one shape, (batch,) + record_shape, and optionally labels."""

    def reshape(self, bottom, top):
        batch = getattr(self.param, self.param_field).batch_size
        top[0].reshape((batch,) + self.record_shape)
        if len(top) > 1:
            top[1].reshape((batch,))


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
        legacy = [p.num, p.channels, p.height, p.width]
        num_legacy = sum(len(f) for f in legacy)
        self.check(not (len(p.shape) and num_legacy), "both shape and legacy fields were specified")
        self.check(len(p.shape) in (0, 1, n), "number of shape fields must be 0, 1 or equal to the number of tops: "
                   "%d tops vs. %d shapes" % (n, len(p.shape)))
        for f in legacy:
            self.check(len(f) in (0, 1, n), "legacy num/channels/height/width must be given 0, 1 or %d times" % n)
        self.shapes = []
        for i in range(n):
            if len(p.shape):
                self.shapes.append(_shape_list(p.shape[0 if len(p.shape) == 1 else i]))
            else:
                self.shapes.append(tuple(int(f[0 if len(f) == 1 else i]) if len(f) else 0 for f in legacy))
        constant = caffe_pb2.FillerParameter()
        constant.type = "constant"
        self.fillers = [p.data_filler[0 if len(p.data_filler) == 1 else i] if len(p.data_filler) else constant
                        for i in range(n)]
        self.refill = [f.type != "constant" for f in self.fillers]
        for blob, shape, filler in zip(top, self.shapes, self.fillers):
            blob.reshape(shape)
            fill(filler, blob)

    def reshape(self, bottom, top):
        for blob, shape in zip(top, self.shapes):
            blob.reshape(shape)

    def forward(self, bottom, top):
        for blob, filler, refill in zip(top, self.fillers, self.refill):
            if refill:
                fill(filler, blob)

    def backward(self, top, propagate_down, bottom):
        pass


def transformed_shape(transform_param, channels, height, width):
    """Shape of one record after Caffe's DataTransformer (crop_size squares it)."""
    crop = transform_param.crop_size
    return (channels, crop, crop) if crop else (channels, height, width)


@register("Data")
class DataLayer(_RecordLayer):
    """Records from a database (LMDB, LevelDB or datumfile); tops: data (batch, C, H, W) [, label (batch,)]."""
    min_top, max_top = 1, 2
    param_field = "data_param"

    def layer_setup(self, bottom, top):
        from ..data import sources
        p = self.param.data_param
        self.check(p.batch_size > 0, "data_param.batch_size must be positive")
        source = self.source_path(p.source)
        try:
            datum = sources.first_datum(source, p.backend)
        except DataError as exc:
            raise DataError("layer '%s' (Data): %s" % (self.name, exc)) from None
        self.record_shape = transformed_shape(self.param.transform_param, datum.channels, datum.height, datum.width)


@register("MemoryData")
class MemoryDataLayer(_SourceLayer):
    """Batches handed over from Python (net.set_input_arrays); tops data (N, C, H, W) and label (N,)."""
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.memory_data_param
        self.check(p.batch_size > 0 and p.channels > 0 and p.height > 0 and p.width > 0,
                   "batch_size, channels, height and width must be specified and positive")
        self.shape = (p.batch_size, p.channels, p.height, p.width)

    def reshape(self, bottom, top):
        top[0].reshape(self.shape)
        top[1].reshape(self.shape[:1])


@register("ImageData")
class ImageDataLayer(_RecordLayer):
    """Images named in a list file ("path label" per line); shape from the first image."""
    exact_num_top = 2
    param_field = "image_data_param"

    def layer_setup(self, bottom, top):
        from ..data import sources
        p = self.param.image_data_param
        self.check(p.HasField("new_height") == p.HasField("new_width") or (not p.new_height and not p.new_width),
                   "current implementation requires new_height and new_width to be set at the same time")
        listing = self.source_path(p.source)
        channels, height, width = sources.first_image_shape(listing, p.root_folder, p.is_color,
                                                            p.new_height, p.new_width)
        self.record_shape = transformed_shape(self.param.transform_param, channels, height, width)


@register("WindowData")
class WindowDataLayer(_RecordLayer):
    """R-CNN style windows from a window file; tops (batch, 3, crop, crop) and label (batch,)."""
    exact_num_top = 2
    param_field = "window_data_param"

    def layer_setup(self, bottom, top):
        p = self.param.window_data_param
        self.source_path(p.source)
        crop = self.param.transform_param.crop_size or p.crop_size
        self.check(crop > 0, "crop_size must be set")
        self.record_shape = (3, crop, crop)


@register("HDF5Data")
class HDF5DataLayer(_SourceLayer):
    """Datasets named like the tops, from the HDF5 files listed in `source`."""
    min_top = 1
    param_field = "hdf5_data_param"

    def layer_setup(self, bottom, top):
        from ..data import sources
        p = self.param.hdf5_data_param
        listing = self.source_path(p.source)
        shapes = sources.hdf5_dataset_shapes(listing, list(self.param.top))
        self.shapes = [(p.batch_size,) + tuple(s[1:]) for s in shapes]

    def reshape(self, bottom, top):
        for blob, shape in zip(top, self.shapes):
            blob.reshape(shape)


@register("HDF5Output")
class HDF5OutputLayer(Layer):
    """Writes its two bottoms (data, label) to hdf5_output_param.file_name at each forward."""
    exact_num_bottom = 2
    exact_num_top = 0
    has_backward = False

    def layer_setup(self, bottom, top):
        self.check(bool(self.param.hdf5_output_param.file_name), "hdf5_output_param.file_name must be set")

    def reshape(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass
