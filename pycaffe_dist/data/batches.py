"""Batch makers for the data layers: read the next `batch_size` records, decode, stack, transform.

Each returns a `make_batch()` closure for the prefetch thread. The closures hold the cursor, the transformer and
plain values, never the layer, so that a dropped net lets its prefetch thread end.
"""
import os
import time

import numpy as np

from ..errors import DataError
from .._kernels import datum as _datum
from . import images, sources


def _transform_stack(transformer, arrays, names, where):
    """The transformed (N, C, H, W) batch. Records of different sizes are cropped one by one to crop_size, as
    Caffe's DataTransformer does per record; without crop_size they must all have the first one's shape."""
    first = arrays[0].shape
    if all(array.shape == first for array in arrays):
        return transformer.transform(np.stack(arrays))
    crop = transformer.param.crop_size
    # a crop makes heights and widths agree, never channels (Caffe's DataTransformer CHECKs them per record)
    odd = [(n, a) for n, a in zip(names, arrays) if a.shape[0] != first[0] or (not crop and a.shape != first)]
    if not odd:
        return np.concatenate([transformer.transform(array[None]) for array in arrays])
    name, array = odd[0]
    raise DataError("%s: record %s has shape %s but the batch started with %s; %s"
                    % (where, name, "x".join(map(str, array.shape)), "x".join(map(str, first)),
                       "all records need the same number of channels" if crop else
                       "records of different sizes need crop_size (or resizing when the database is made)"))


def datum_image(datum, transform_param, where):
    """A Datum's record as (C, H, W): raw uint8/float, or decoded with force_color/force_gray as Caffe does."""
    if datum.encoded and (transform_param.force_color or transform_param.force_gray):
        return images.decode_image(datum.data, bool(transform_param.force_color), where)
    return images.datum_array(datum, where)


def record_batches(source, batch_size, transformer, where, skip=0, shard=0, num_shards=1):
    """Batches of (data, label) from a RecordSource, read in store order with wrap-around (Caffe's DataLayer)."""
    reader = source.batches(batch_size, skip, shard, num_shards)
    transform_param = transformer.param

    def make_batch():
        records = next(reader)
        keys, values = [key for key, _ in records], [value for _, value in records]
        raw = _raw_batch(values, where, keys[0])
        if raw is not None:
            return transformer.transform(raw[0]), raw[1]
        # encoded or float records, or a bad one: each parsed by protobuf, which names what is wrong
        arrays, labels = [], np.empty(batch_size, np.float32)
        for i, (key, value) in enumerate(zip(keys, values)):
            record_where = "%s: record %r" % (where, key)
            datum = sources.parse_datum(value, record_where)
            arrays.append(datum_image(datum, transform_param, record_where))
            labels[i] = datum.label
        return _transform_stack(transformer, arrays, [repr(key) for key in keys], where), labels
    return make_batch


def _raw_batch(values, where, first_key):
    """(pixels (N, C, H, W) uint8, labels) where every record is a raw uint8 Datum of the first one's shape,
    decoded in C without the GIL (csrc/datum.pyx); else None."""
    first = sources.parse_datum(values[0], "%s: record %r" % (where, first_key))
    if first.encoded or not first.data or first.float_data:
        return None
    shape = (first.channels, first.height, first.width)
    if min(shape) < 1 or len(first.data) != shape[0] * shape[1] * shape[2]:
        return None
    pixels = np.empty((len(values), len(first.data)), np.uint8)
    labels = np.empty(len(values), np.float32)
    if _datum.decode_raw(values, pixels, labels, *shape) < len(values):
        return None
    return pixels.reshape((len(values),) + shape), labels


def image_list_batches(entries, param, transformer, rng, where, skip=0):
    """Batches of (data, label) from the (name, label) entries of an image list (Caffe's ImageDataLayer): images
    read from root_folder, resized if new_height/new_width are set; with `shuffle` the list is shuffled at the
    start and at every pass."""
    entries = list(entries)
    order = rng.permutation(len(entries)) if param.shuffle else np.arange(len(entries))
    state = {"pos": skip % len(entries), "order": order}

    def make_batch():
        arrays, names = [], []
        labels = np.empty(param.batch_size, np.float32)
        for i in range(param.batch_size):
            name, label = entries[state["order"][state["pos"]]]
            path = os.path.join(param.root_folder, name)
            arrays.append(images.load_image(path, param.is_color, param.new_height, param.new_width))
            names.append(name)
            labels[i] = label
            state["pos"] += 1
            if state["pos"] == len(entries):
                state["pos"] = 0
                if param.shuffle:
                    state["order"] = rng.permutation(len(entries))
            if i % sources.RECORDS_PER_GIL_RELEASE == sources.RECORDS_PER_GIL_RELEASE - 1:
                time.sleep(0)     # lets the training thread have the GIL (sources.RecordSource.batches)
        return _transform_stack(transformer, arrays, names, where), labels
    return make_batch
