"""Caffe's DataTransformer (src/caffe/data_transformer.cpp) over whole batches.

Per element Caffe computes, in float:
    out[c, h, w'] = (x[c, h_off + h, w_off + w] - mean) * scale,   w' = width - 1 - w if mirrored else w
where mean is mean_file[c, h_off + h, w_off + w] (the mean of the uncropped image), mean_value[c], or absent.
Crop offsets are random in TRAIN (uniform over every valid offset) and centred in TEST; mirror is a coin flip per
image. We do the same on a (N, C, H, W) batch at once, so no Python loop runs over images or pixels.

Random draws come from a generator seeded from the global one at construction (Caffe seeds its transformer's RNG
from caffe_rng_rand() the same way), so seeded runs are reproducible; the draws are numpy's, not boost's.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..blob.binaryproto import read_blob_file
from ..errors import DataError
from ..proto import caffe_pb2
from .. import common


class DataTransformer:
    """Transforms batches of records as Caffe's DataTransformer does for the layer `where` (used in messages)."""

    def __init__(self, param, phase, where="data layer"):
        self.param, self.phase, self.where = param, phase, where
        self.scale = np.float32(param.scale)
        self.crop = int(param.crop_size)
        if param.HasField("mean_file") and len(param.mean_value):
            raise DataError("%s: cannot specify mean_file and mean_value at the same time" % where)
        self.mean_image = self.mean_values = None
        if param.HasField("mean_file"):
            mean = read_blob_file(param.mean_file)
            if mean.size == 0:
                raise DataError("%s: mean file %s holds no values (shape %s)"
                                % (where, param.mean_file, "x".join(map(str, mean.shape))))
            # Caffe indexes the mean blob by (c, h, w) of one image: a blob of num > 1 gives its first image
            self.mean_image = mean.reshape((-1,) + mean.shape[-3:])[0] if mean.ndim > 3 else mean
        elif len(param.mean_value):
            self.mean_values = np.asarray(param.mean_value, dtype=np.float32).reshape(-1, 1, 1)
        if param.force_color and param.force_gray:
            raise DataError("%s: force_color and force_gray cannot both be set" % where)
        needs_rand = param.mirror or (phase == caffe_pb2.TRAIN and self.crop)
        self.rng = np.random.default_rng(common.rng().integers(2 ** 63)) if needs_rand else None

    def output_shape(self, channels, height, width):
        """Shape of one transformed record (crop_size squares it), checking the record can be cropped."""
        if self.crop and (height < self.crop or width < self.crop):
            raise DataError("%s: crop_size %d is larger than the %dx%d records" % (self.where, self.crop, height, width))
        return (channels, self.crop, self.crop) if self.crop else (channels, height, width)

    def check_mean(self, channels, height, width):
        """The mean must fit the records (Caffe CHECKs this per datum); both shapes go into the message."""
        if self.mean_image is not None and self.mean_image.shape != (channels, height, width):
            raise DataError("%s: mean file %s has shape %s but the records are %s"
                            % (self.where, self.param.mean_file, "x".join(map(str, self.mean_image.shape)),
                               "x".join(map(str, (channels, height, width)))))
        if self.mean_values is not None and len(self.mean_values) not in (1, channels):
            raise DataError("%s: %d mean_value entries for records of %d channels: give one, or one per channel"
                            % (self.where, len(self.mean_values), channels))

    def transform(self, batch):
        """(N, C, H, W) uint8 or float32 records -> float32 (N, C, h, w) transformed batch."""
        n, channels, height, width = batch.shape
        self.check_mean(channels, height, width)
        crop = self.crop
        mean = self.mean_values if self.mean_image is None else self.mean_image
        if crop:
            self.output_shape(channels, height, width)
            if self.phase == caffe_pb2.TRAIN:
                h_off = self.rng.integers(0, height - crop + 1, n)
                w_off = self.rng.integers(0, width - crop + 1, n)
            else:
                h_off = np.full(n, (height - crop) // 2)
                w_off = np.full(n, (width - crop) // 2)
            batch = self._crop(batch, h_off, w_off)
            if self.mean_image is not None:     # the mean is of the uncropped image: crop it alike
                mean = self._crop(np.broadcast_to(mean, (n,) + mean.shape), h_off, w_off)
        out = batch.astype(np.float32)
        if mean is not None:
            out -= mean
        if self.scale != 1:
            out *= self.scale
        if self.param.mirror:
            flip = self.rng.integers(0, 2, n).astype(bool)
            out[flip] = out[flip, :, :, ::-1]
        return out

    def _crop(self, batch, h_off, w_off):
        """The crop x crop window at (h_off[i], w_off[i]) of every image i, gathered in one indexing step."""
        windows = sliding_window_view(batch, (self.crop, self.crop), axis=(2, 3))   # (N, C, H', W', crop, crop)
        return windows[np.arange(batch.shape[0]), :, h_off, w_off]
