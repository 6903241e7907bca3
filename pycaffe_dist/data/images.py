"""Images as Caffe sees them: uint8 (C, H, W) arrays, colour in OpenCV's BGR order.

Caffe reads images with OpenCV (cv::imread / cv::imdecode, then CVMatToDatum); we decode with Pillow and give the
same layout. Deliberate differences, all from using Pillow instead of OpenCV:
- grayscale is Pillow's "L" conversion (ITU-R 601-2 luma, L = (299 R + 587 G + 114 B) / 1000); OpenCV's BGR->gray
  uses the same weights in fixed point and may round a pixel to the next grey level;
- resizing (new_height and new_width both given) is Pillow's bilinear filter, which, unlike OpenCV's INTER_LINEAR
  (cv::resize's default, used by Caffe), widens its support when shrinking (antialiasing); resized pixels differ;
- JPEG decoders differ (libjpeg builds, IDCT); decoded pixels may differ by a few levels from OpenCV's.

Images come from datasets, which may be damaged or hostile, so decoding is bounded:
- only the formats OpenCV's imread reads are opened (FORMATS): Pillow knows some 40 more, several with rarely
  exercised decoders, and opens EPS through Ghostscript;
- an image is refused before it is decoded when width x height x channels exceeds MAX_IMAGE_VALUES (64 Mi by
  default, so at most 64 MiB of pixels and about four times that at the peak of a decode; e.g. 8192 x 8192 grey
  or 4724 x 4724 colour). The header gives the size without decoding: a 78-byte PNG can declare 20000 x 20000.
  Channels are the larger of the stored bands and the channels returned. PCD_MAX_IMAGE_VALUES in the environment
  sets another bound. Pillow's own bomb check (a warning from 89 Mpixels, an error from 179 Mpixels) is silenced:
  ours comes first for every image we decode and is stricter;
- whatever Pillow raises on a damaged file (OSError, but also SyntaxError "broken PNG file", struct.error, ...)
  becomes a DataError naming the image.
"""
import io
import os
import struct
import warnings

import numpy as np

from ..errors import DataError

MAX_IMAGE_VALUES = 1 << 26      # the default bound; PCD_MAX_IMAGE_VALUES in the environment overrides it
FORMATS = ("BMP", "DIB", "GIF", "JPEG", "JPEG2000", "PNG", "PPM", "SUN", "TIFF", "WEBP")   # Pillow's names
_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
_16_BIT_MODES = {"I;16", "I;16B", "I;16L", "I;16N"}
# What Pillow's decoders raise on damaged data, besides OSError (UnidentifiedImageError is one): seen by fuzzing
# (tests/fuzz). Caught around Pillow's open and load only, never around our own code.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError, KeyError, struct.error,
                  ZeroDivisionError)


def _pillow():
    from PIL import Image
    # Every image we decode passes MAX_IMAGE_VALUES first (see the module docstring), so Pillow's bomb warning
    # only repeats it, and for an image we refuse, before we can. Checked at each call, not once: a caller's
    # warnings.catch_warnings() (pytest's, for one) puts the filters back as they were.
    if not any(f[0] == "ignore" and f[2] is Image.DecompressionBombWarning for f in warnings.filters):
        warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    return Image


def _pixels(image, is_color, where, new_height=0, new_width=0):
    """A PIL image as uint8 (C, H, W): BGR if is_color, one grey channel if not, as stored if is_color is None."""
    Image = _pillow()
    if is_color is None:
        is_color = image.mode not in _GRAY_MODES
    try:
        if image.mode in _16_BIT_MODES:
            # OpenCV reads a 16-bit image as 8 bits by keeping the high byte (libpng's strip_16); Pillow's
            # conversion would clip every value above 255 to white
            image = Image.fromarray((np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8), "L")
        image = image.convert("RGB" if is_color else "L")
        if new_height > 0 and new_width > 0:
            image = image.resize((new_width, new_height), Image.BILINEAR)
        array = np.asarray(image, dtype=np.uint8)
    except (OSError, ValueError) as exc:      # Pillow's conversions of a mode it cannot convert; the decode is done
        raise DataError("%s: cannot decode the image: %s" % (where, exc)) from None
    if is_color:
        return np.ascontiguousarray(array[:, :, ::-1].transpose(2, 0, 1))
    return array[np.newaxis]


class _BoundedFile(io.BufferedReader):
    """An image file whose read(n) asks for no more than the file still holds. Pillow reads a chunk by the length
    its header gives, and a buffered read allocates all n bytes before it reads: a damaged PNG chunk length made
    one read allocate gigabytes."""

    def __init__(self, path):
        super().__init__(io.FileIO(path, "rb"))
        self.size = os.fstat(self.fileno()).st_size

    def read(self, n=-1):
        if n is not None and n > 0:
            n = min(n, max(0, self.size - self.tell()))
            if n == 0:
                return b""
        return super().read(n)


def open_image(source, where, channels=1):
    """The image in `source` (a path or a binary file object) as a decoded PIL image, after the checks of the
    module docstring; `channels`: how many the caller will make of it (3 for colour). Close it when done."""
    Image = _pillow()
    try:
        if isinstance(source, (str, os.PathLike)):
            with _BoundedFile(source) as f:
                return _open(Image, f, where, channels)
        return _open(Image, source, where, channels)
    except FileNotFoundError:
        raise DataError("%s: no such image file" % where) from None
    except DataError:
        raise                                   # _open's own verdicts (a ValueError too: errors.py)
    except (OSError, ValueError) as exc:        # a directory, a name with a NUL byte, ...
        raise DataError("%s: cannot read the image: %s" % (where, exc)) from None


def _open(Image, f, where, channels):
    try:
        image = Image.open(f, formats=FORMATS)
    except Image.UnidentifiedImageError:
        raise DataError("%s: cannot decode the image: not an image in a format Caffe reads (%s)"
                        % (where, ", ".join(FORMATS))) from None
    except Image.DecompressionBombError as exc:      # over 179 Mpixels: Pillow refuses it before we see it
        raise DataError("%s: the image is larger than %d values (MAX_IMAGE_VALUES; PCD_MAX_IMAGE_VALUES sets another "
                        "bound): %s" % (where, max_image_values(), exc)) from None
    except _DECODE_ERRORS as exc:
        raise DataError("%s: cannot decode the image: %s" % (where, exc)) from None
    try:
        width, height = image.size
        bands = max(len(image.getbands()), channels)
        limit = max_image_values()
        if width * height * bands > limit:
            raise DataError("%s: the image is %d x %d x %d channel(s), more than %d values (MAX_IMAGE_VALUES; "
                            "PCD_MAX_IMAGE_VALUES sets another bound)" % (where, width, height, bands, limit))
        try:
            image.load()
        except (Image.DecompressionBombError,) + _DECODE_ERRORS as exc:
            raise DataError("%s: cannot decode the image: %s" % (where, exc)) from None
    except BaseException:
        image.close()
        raise
    return image


def max_image_values():
    """The bound on width x height x channels of an image we decode: PCD_MAX_IMAGE_VALUES or MAX_IMAGE_VALUES."""
    value = os.environ.get("PCD_MAX_IMAGE_VALUES")
    if value is None:
        return MAX_IMAGE_VALUES
    try:
        return int(value)
    except ValueError:
        raise DataError("PCD_MAX_IMAGE_VALUES=%r is not an integer" % value) from None


def _channels(is_color):
    return 3 if is_color or is_color is None else 1


def decode_image(data, is_color, where):
    """Encoded image bytes (JPEG, PNG, ...) as uint8 (C, H, W), as Caffe's DecodeDatumToCVMat.

    is_color True: 3 channels BGR (a grey image is replicated); False: 1 grey channel; None: as stored, grey
    images keep 1 channel and others become BGR (DecodeDatumToCVMatNative, cv::IMREAD_ANYCOLOR).
    """
    with open_image(io.BytesIO(data), where, _channels(is_color)) as image:
        return _pixels(image, is_color, where)


def load_image(path, is_color, new_height=0, new_width=0):
    """The image file at `path` as uint8 (C, H, W), BGR if is_color, resized (bilinear) if both sizes are given
    (Caffe's ReadImageToCVMat)."""
    path = str(path)
    with open_image(path, path, _channels(is_color)) as image:
        return _pixels(image, is_color, path, new_height, new_width)


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
    # Caffe's DataTransformer::InferBlobShape: CHECK_GT(channels, 0), and a blob has no negative dimension
    if datum.channels < 1 or datum.height < 0 or datum.width < 0:
        raise DataError("%s: Datum of channels x height x width = %d x %d x %d; expected channels >= 1 and height, "
                        "width >= 0" % ((where,) + shape))
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
