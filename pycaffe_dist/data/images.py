"""Images as Caffe sees them: uint8 (C, H, W) arrays, colour in OpenCV's BGR order.

Caffe reads images with OpenCV (cv::imread / cv::imdecode, then CVMatToDatum); we decode with Pillow and give the
same layout. Deliberate differences, all from using Pillow instead of OpenCV:
- grayscale is Pillow's "L" conversion (ITU-R 601-2 luma, L = (299 R + 587 G + 114 B) / 1000); OpenCV's BGR->gray
  uses the same weights in fixed point and may round a pixel to the next grey level;
- resizing (new_height and new_width both given) is Pillow's bilinear filter, which, unlike OpenCV's INTER_LINEAR
  (cv::resize's default, used by Caffe), widens its support when shrinking (antialiasing); resized pixels differ;
- JPEG decoders differ (libjpeg builds, IDCT); decoded pixels may differ by a few levels from OpenCV's.
"""
import io

import numpy as np

from ..errors import DataError

_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
_16_BIT_MODES = {"I;16", "I;16B", "I;16L", "I;16N"}


def _pixels(image, is_color, where, new_height=0, new_width=0):
    """A PIL image as uint8 (C, H, W): BGR if is_color, one grey channel if not, as stored if is_color is None."""
    if is_color is None:
        is_color = image.mode not in _GRAY_MODES
    try:
        if image.mode in _16_BIT_MODES:
            # OpenCV reads a 16-bit image as 8 bits by keeping the high byte (libpng's strip_16); Pillow's
            # conversion would clip every value above 255 to white
            from PIL import Image
            image = Image.fromarray((np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8), "L")
        image = image.convert("RGB" if is_color else "L")
        if new_height > 0 and new_width > 0:
            from PIL import Image
            image = image.resize((new_width, new_height), Image.BILINEAR)
        array = np.asarray(image, dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise DataError("%s: cannot decode the image: %s" % (where, exc)) from None
    if is_color:
        return np.ascontiguousarray(array[:, :, ::-1].transpose(2, 0, 1))
    return array[np.newaxis]


def _open(source, where):
    from PIL import Image, UnidentifiedImageError
    try:
        image = Image.open(source)
        image.load()
    except FileNotFoundError:
        raise DataError("%s: no such image file" % where) from None
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise DataError("%s: cannot decode the image: %s" % (where, exc)) from None
    return image


def decode_image(data, is_color, where):
    """Encoded image bytes (JPEG, PNG, ...) as uint8 (C, H, W), as Caffe's DecodeDatumToCVMat.

    is_color True: 3 channels BGR (a grey image is replicated); False: 1 grey channel; None: as stored, grey
    images keep 1 channel and others become BGR (DecodeDatumToCVMatNative, cv::IMREAD_ANYCOLOR).
    """
    return _pixels(_open(io.BytesIO(data), where), is_color, where)


def load_image(path, is_color, new_height=0, new_width=0):
    """The image file at `path` as uint8 (C, H, W), BGR if is_color, resized (bilinear) if both sizes are given
    (Caffe's ReadImageToCVMat)."""
    path = str(path)
    return _pixels(_open(path, path), is_color, path, new_height, new_width)


def encode_image(array, fmt, where):
    """uint8 (C, H, W) pixels (BGR or grey) encoded as `fmt` (a file extension: "jpg", "png", ...), as
    cv::imencode does for Caffe's convert_imageset --encoded (JPEG at OpenCV's default quality 95)."""
    from PIL import Image
    pixels = array[0] if array.shape[0] == 1 else array[::-1].transpose(1, 2, 0)
    out = io.BytesIO()
    formats = Image.registered_extensions()
    if "." + fmt.lower() not in formats:
        raise DataError("%s: cannot encode images as %r (unknown image format)" % (where, fmt))
    try:
        Image.fromarray(np.ascontiguousarray(pixels)).save(out, format=formats["." + fmt.lower()], quality=95)
    except (OSError, ValueError, KeyError) as exc:
        raise DataError("%s: cannot encode the image as %s: %s" % (where, fmt, exc)) from None
    return out.getvalue()


def datum_array(datum, where):
    """A Datum's pixels as (C, H, W): uint8 from `data` (a read-only view of it), float32 from `float_data`,
    decoded natively if encoded."""
    if datum.encoded:
        return decode_image(datum.data, None, where)
    shape = (datum.channels, datum.height, datum.width)
    count = datum.channels * datum.height * datum.width
    if datum.data:
        if len(datum.data) != count:
            raise DataError("%s: Datum data holds %d bytes but channels x height x width = %d x %d x %d = %d"
                            % ((where, len(datum.data)) + shape + (count,)))
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape)
    if len(datum.float_data) != count:
        raise DataError("%s: Datum float_data holds %d values but channels x height x width = %d x %d x %d = %d"
                        % ((where, len(datum.float_data)) + shape + (count,)))
    return np.array(datum.float_data, dtype=np.float32).reshape(shape)
