"""pycaffe's caffe.io (python/caffe/io.py): array <-> BlobProto / Datum conversions, the input Transformer,
image loading, resizing and 10-crop oversampling.

scipy (resize_image) and Pillow (load_image) are imported when first used, so `import pycaffe_dist` stays light.
"""
import importlib.util

import numpy as np

from ..errors import DataError
from ..proto import caffe_pb2
from ..proto.binary import parse_binary

# --- proto / datum / ndarray conversion ---------------------------------------------------------------------


def blobproto_to_array(blob, return_diff=False):
    """The data (or the diff) of a BlobProto as an array of the blob's shape: the legacy 4-d
    num/channels/height/width when any of them is set, else shape.dim. float32, or float64 for a blob that holds
    double_data / double_diff (read first, as Caffe's Blob::FromProto does)."""
    doubles = blob.double_diff if return_diff else blob.double_data
    if len(doubles):
        values = np.array(doubles, dtype=np.float64)
    else:
        values = np.array(blob.diff if return_diff else blob.data, dtype=np.float32)
    legacy = any(blob.HasField(f) for f in ("num", "channels", "height", "width"))
    shape = (blob.num, blob.channels, blob.height, blob.width) if legacy else tuple(blob.shape.dim)
    needed = int(np.prod(shape, dtype=object))
    if min(shape, default=0) < 0 or values.size != needed:
        # pycaffe's reshape raises ValueError; a blob read from bytes that does not fit is bad data
        raise DataError("blob holds %d values but its shape %s needs %d" % (values.size, shape, needed))
    return values.reshape(shape)


def array_to_blobproto(arr, diff=None):
    """A BlobProto with shape.dim = arr.shape, data from arr and, if given, diff (of the same shape)."""
    arr = np.asarray(arr)
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend(arr.shape)
    blob.data.extend(arr.astype(float).flat)
    if diff is not None:
        diff = np.asarray(diff)
        if diff.shape != arr.shape:
            raise ValueError("diff shape %s differs from data shape %s" % (diff.shape, arr.shape))
        blob.diff.extend(diff.astype(float).flat)
    return blob


def arraylist_to_blobprotovector_str(arraylist):
    """A list of arrays as a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend(array_to_blobproto(arr) for arr in arraylist)
    return vec.SerializeToString()


arraylist_to_blobprotovecor_str = arraylist_to_blobprotovector_str  # pycaffe's own (misspelt) name


def blobprotovector_str_to_arraylist(data):
    """A serialized BlobProtoVector as a list of arrays."""
    vec = caffe_pb2.BlobProtoVector()
    if data:   # an empty vector serializes to b""
        parse_binary(data, vec)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr, label=None):
    """A Datum from a CxHxW array: uint8 goes to `data` (bytes), any other dtype to `float_data`."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise ValueError("Incorrect array shape: a Datum holds a 3-d (channels, height, width) array, got %s"
                         % (arr.shape,))
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = arr.shape
    if arr.dtype == np.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data.extend(arr.astype(float).flat)
    if label is not None:
        datum.label = label
    return datum


def datum_to_array(datum):
    """A Datum's values as a CxHxW array: uint8 from `data`, else float64 from `float_data` (label not
    included: it is datum.label)."""
    shape = (datum.channels, datum.height, datum.width)
    if datum.encoded:
        raise DataError("datum holds an encoded image (%d bytes); decode it before datum_to_array" % len(datum.data))
    if len(datum.data):
        values = np.frombuffer(datum.data, dtype=np.uint8).copy()
    else:
        values = np.array(datum.float_data, dtype=float)
    if min(shape) < 0 or values.size != shape[0] * shape[1] * shape[2]:      # -1 x -2 x 3 is 6 too
        raise DataError("datum holds %d values, not channels x height x width = %s"
                        % (values.size, "x".join(map(str, shape))))
    return values.reshape(shape)


# --- pre-processing ------------------------------------------------------------------------------------------


class Transformer:
    """Turns HxWxK images into the K'xHxW arrays a net's inputs take, and back (deprocess).

    `inputs` maps input names to their blob shapes, e.g. {'data': net.blobs['data'].data.shape}. preprocess
    applies, in pycaffe's order: float32, resize to the input's HxW, transpose, channel swap, raw scale, mean
    subtraction, input scale. deprocess undoes them in reverse (but does not resize).
    """

    def __init__(self, inputs):
        self.inputs = inputs
        self.transpose = {}
        self.channel_swap = {}
        self.raw_scale = {}
        self.mean = {}
        self.input_scale = {}

    def _check_input(self, in_):
        if in_ not in self.inputs:
            raise DataError("{} is not one of the net inputs: {}".format(in_, self.inputs))
        return tuple(self.inputs[in_])

    def preprocess(self, in_, data):
        """(H' x W' x K) image -> (K x H x W) float32 array for input `in_`."""
        shape = self._check_input(in_)
        caffe_in = np.array(data, dtype=np.float32)   # a copy: the steps below work in place
        if caffe_in.shape[:2] != shape[2:]:
            caffe_in = resize_image(caffe_in, shape[2:])
        if in_ in self.transpose:
            caffe_in = caffe_in.transpose(self.transpose[in_])
        if in_ in self.channel_swap:
            caffe_in = caffe_in[self.channel_swap[in_], :, :]
        if in_ in self.raw_scale:
            caffe_in *= self.raw_scale[in_]
        if in_ in self.mean:
            caffe_in -= self.mean[in_]
        if in_ in self.input_scale:
            caffe_in *= self.input_scale[in_]
        return caffe_in

    def deprocess(self, in_, data):
        """Invert preprocess (all but the resize); a leading batch axis of 1 is squeezed away."""
        self._check_input(in_)
        decaf_in = data.copy().squeeze()
        if in_ in self.input_scale:
            decaf_in /= self.input_scale[in_]
        if in_ in self.mean:
            decaf_in += self.mean[in_]
        if in_ in self.raw_scale:
            decaf_in /= self.raw_scale[in_]
        if in_ in self.channel_swap:
            decaf_in = decaf_in[np.argsort(self.channel_swap[in_]), :, :]
        if in_ in self.transpose:
            decaf_in = decaf_in.transpose(np.argsort(self.transpose[in_]))
        return decaf_in

    def set_transpose(self, in_, order):
        """Axis order taking the image to the input's layout, e.g. (2, 0, 1) for HxWxK -> KxHxW."""
        shape = self._check_input(in_)
        if len(order) != len(shape) - 1:
            raise DataError("Transpose order needs to have the same number of dimensions as the input.")
        self.transpose[in_] = order

    def set_channel_swap(self, in_, order):
        """Channel order, applied after the transpose (channels first): (2, 1, 0) maps RGB to BGR."""
        shape = self._check_input(in_)
        if len(order) != shape[1]:
            raise DataError("Channel swap needs to have the same number of dimensions as the input channels.")
        self.channel_swap[in_] = order

    def set_raw_scale(self, in_, scale):
        """Scale applied before mean subtraction (255 for models trained on [0, 255] images)."""
        self._check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_, mean):
        """Mean to subtract: per channel (1-d, K values) or elementwise (KxHxW, or HxW for one channel)."""
        shape = self._check_input(in_)
        if mean.ndim == 1:
            if mean.shape[0] != shape[1]:
                raise ValueError("Mean channels incompatible with input.")
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            ms = (1,) + mean.shape if mean.ndim == 2 else mean.shape
            if len(ms) != 3:
                raise ValueError("Mean shape invalid")
            if ms != shape[1:]:
                raise ValueError("Mean shape incompatible with input shape.")
        self.mean[in_] = mean

    def set_input_scale(self, in_, scale):
        """Scale applied last, after mean subtraction."""
        self._check_input(in_)
        self.input_scale[in_] = scale


# --- images --------------------------------------------------------------------------------------------------

_GRAY_WEIGHTS = (0.2125, 0.7154, 0.0721)   # skimage's rgb2gray, which pycaffe's load_image(color=False) uses


def load_image(filename, color=True):
    """An image file as float32 in [0, 1]: HxWx3 (RGB) when color, else HxWx1 (intensity); grayscale files are
    repeated to 3 channels when color is asked, an alpha channel is dropped. Needs Pillow."""
    if importlib.util.find_spec("PIL") is None:
        raise DataError("load_image needs Pillow (pip install Pillow) to read %s" % filename)
    from ..data.images import open_image
    filename = str(filename)
    # open_image bounds the size and turns Pillow's errors into DataError (data/images.py); 3 channels whatever
    # `color` says, as this works in RGB floats. The arithmetic is in place: a float copy is 4 bytes a value.
    with open_image(filename, filename, 3) as im:
        try:
            if im.mode in ("1", "L", "I;16", "F"):
                scale = {"1": 1, "L": 255, "I;16": 65535, "F": 1}[im.mode]
                img = np.array(im, dtype=np.float32)
                img /= scale
            else:
                has_alpha = "A" in im.getbands() or "transparency" in im.info
                img = np.array(im.convert("RGBA" if has_alpha else "RGB"), dtype=np.float32)[:, :, :3]
                img /= 255
        except (OSError, ValueError) as exc:      # Pillow's conversions; the decode is done
            raise DataError("%s: cannot read image: %s" % (filename, exc)) from None
    if img.ndim == 3 and not color:
        img = img @ np.asarray(_GRAY_WEIGHTS, dtype=np.float32)
    if img.ndim == 2:
        img = img[:, :, np.newaxis]
        if color:
            img = np.tile(img, (1, 1, 3))
    return img.astype(np.float32, copy=False)


def resize_image(im, new_dims, interp_order=1):
    """Resize an HxWxK array to new_dims=(height, width), keeping K, with spline interpolation of
    `interp_order` (1: linear); returns float32.

    1 or 3 channels: as pycaffe's skimage.transform.resize path: the image is scaled to [0, 1], resampled with
    pixel-center alignment (output pixel i samples input (i + 0.5) * in/out - 0.5, edges mirrored, the mode
    skimage uses by default), clipped to [0, 1] and scaled back; a constant image stays constant. Other channel
    counts: as pycaffe's scipy.ndimage.zoom path (corner-aligned: first and last pixels map to each other).
    """
    from scipy import ndimage
    im = np.asarray(im)
    new_dims = (int(new_dims[0]), int(new_dims[1]))
    factors = (new_dims[0] / im.shape[0], new_dims[1] / im.shape[1], 1.0)
    if im.shape[-1] in (1, 3):
        im_min, im_max = im.min(), im.max()
        if im_max <= im_min:   # a constant image (and no division by zero)
            return np.full(new_dims + (im.shape[-1],), im_min, dtype=np.float32)
        im_std = (im.astype(np.float64) - im_min) / (im_max - im_min)
        resized = ndimage.zoom(im_std, factors, order=interp_order, mode="mirror", grid_mode=True)
        resized = np.clip(resized, 0.0, 1.0) * (im_max - im_min) + im_min
    else:
        resized = ndimage.zoom(im, factors, order=interp_order)
    return resized.astype(np.float32)


def oversample(images, crop_dims):
    """Ten crops of each HxWxK image: the four corners (top-left, top-right, bottom-left, bottom-right) and the
    center, then the same five mirrored left-right. Returns a (10*N) x h x w x K float32 array."""
    height, width, channels = np.shape(images[0])
    ch, cw = int(crop_dims[0]), int(crop_dims[1])
    if ch > height or cw > width:
        raise ValueError("crop %dx%d is larger than the image %dx%d" % (ch, cw, height, width))
    corners = [(0, 0), (0, width - cw), (height - ch, 0), (height - ch, width - cw),
               ((height - ch) // 2, (width - cw) // 2)]
    crops = np.empty((10 * len(images), ch, cw, channels), dtype=np.float32)
    for i, im in enumerate(images):
        five = [im[y:y + ch, x:x + cw, :] for y, x in corners]
        crops[10 * i:10 * i + 5] = five
        crops[10 * i + 5:10 * i + 10] = [c[:, ::-1, :] for c in five]
    return crops
