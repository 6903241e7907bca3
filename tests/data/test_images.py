"""Images as Caffe's OpenCV path gives them: uint8 (C, H, W), BGR; Datum pixels."""
import io
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from pycaffe_dist.data import images
from pycaffe_dist.data.images import datum_array, decode_image, encode_image, load_image
from pycaffe_dist.errors import DataError
from pycaffe_dist.proto import caffe_pb2

RGB = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]],
                [[10, 20, 30], [200, 100, 50], [7, 7, 7]]], dtype=np.uint8)      # H=2, W=3, RGB


def png(array, mode=None):
    out = io.BytesIO()
    Image.fromarray(array, mode).save(out, format="PNG")
    return out.getvalue()


def test_colour_is_bgr_channels_first():
    got = decode_image(png(RGB), True, "x.png")
    assert got.dtype == np.uint8 and got.shape == (3, 2, 3)
    assert got[:, 0, 0].tolist() == [0, 0, 255] and got[:, 0, 2].tolist() == [255, 0, 0]   # red, blue as BGR
    assert got.tolist() == RGB[:, :, ::-1].transpose(2, 0, 1).tolist()


def test_gray_is_luma_within_one_level_of_opencv_weights():
    got = decode_image(png(RGB), False, "x.png")
    assert got.shape == (1, 2, 3)
    luma = RGB.astype(np.float64) @ [0.299, 0.587, 0.114]
    assert np.abs(got[0] - luma).max() <= 1
    grey = np.array([[0, 128, 255]], dtype=np.uint8)
    assert decode_image(png(grey), True, "g.png").tolist() == [grey.tolist()] * 3     # grey -> 3 equal channels


def test_native_decode_keeps_grey_and_drops_alpha():
    grey = np.array([[1, 2], [3, 4]], dtype=np.uint8)
    assert decode_image(png(grey), None, "g.png").tolist() == [grey.tolist()]
    rgba = np.dstack([RGB, np.full(RGB.shape[:2], 9, np.uint8)])
    assert decode_image(png(rgba), None, "a.png").tolist() == RGB[:, :, ::-1].transpose(2, 0, 1).tolist()


def test_16_bit_images_keep_their_high_byte():
    """OpenCV's imread without IMREAD_ANYDEPTH reduces 16 bits to the high byte; Pillow alone clips to 255."""
    deep = np.array([[0, 255, 256, 5000], [40000, 65535, 511, 32768]], dtype=np.uint16)
    out = io.BytesIO()
    Image.fromarray(deep).save(out, format="PNG")
    high = (deep >> 8).astype(np.uint8)
    assert decode_image(out.getvalue(), False, "d.png").tolist() == [high.tolist()]
    assert decode_image(out.getvalue(), True, "d.png").tolist() == [high.tolist()] * 3
    assert decode_image(out.getvalue(), None, "d.png").tolist() == [high.tolist()]


def test_load_image_resizes_bilinear(tmp_path):
    flat = np.full((8, 6, 3), 77, dtype=np.uint8)
    Image.fromarray(flat).save(tmp_path / "f.png")
    got = load_image(tmp_path / "f.png", True, 4, 5)
    assert got.shape == (3, 4, 5) and (got == 77).all()
    assert load_image(tmp_path / "f.png", False).shape == (1, 8, 6)
    assert load_image(tmp_path / "f.png", True, 4, 0).shape == (3, 8, 6)     # both sizes or no resize, as Caffe


def test_bad_images_name_the_file(tmp_path):
    with pytest.raises(DataError, match=r"%s: no such image file" % (tmp_path / "none.jpg")):
        load_image(tmp_path / "none.jpg", True)
    (tmp_path / "junk.jpg").write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"junk.jpg: cannot decode the image"):
        load_image(tmp_path / "junk.jpg", True)
    with pytest.raises(DataError, match=r"rec 5: cannot decode the image"):
        decode_image(png(RGB)[:40], True, "rec 5")
    with pytest.raises(DataError, match=r"x: cannot encode images as 'nope'"):
        encode_image(np.zeros((1, 2, 2), np.uint8), "nope", "x")


def test_encode_then_decode_round_trips_losslessly():
    bgr = RGB[:, :, ::-1].transpose(2, 0, 1)
    assert decode_image(encode_image(bgr, "png", "x"), True, "x").tolist() == bgr.tolist()
    jpeg = decode_image(encode_image(np.full((3, 16, 16), 100, np.uint8), "JPG", "x"), True, "x")
    assert np.abs(jpeg.astype(int) - 100).max() <= 2


def test_datum_array():
    pixels = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    d = caffe_pb2.Datum(channels=2, height=3, width=4, data=pixels.tobytes())
    got = datum_array(d, "r")
    assert got.dtype == np.uint8 and got.tolist() == pixels.tolist()
    f = caffe_pb2.Datum(channels=1, height=1, width=3, float_data=[0.5, -1, 2])
    got = datum_array(f, "r")
    assert got.dtype == np.float32 and got.tolist() == [[[0.5, -1.0, 2.0]]]
    e = caffe_pb2.Datum(data=png(RGB), encoded=True, label=3)
    assert datum_array(e, "r").tolist() == RGB[:, :, ::-1].transpose(2, 0, 1).tolist()
    with pytest.raises(DataError, match=r"db: record b'7': Datum data holds 23 bytes but channels x height x "
                       r"width = 2 x 3 x 4 = 24"):
        datum_array(caffe_pb2.Datum(channels=2, height=3, width=4, data=bytes(23)), "db: record b'7'")
    with pytest.raises(DataError, match=r"r: Datum float_data holds 3 values but .* = 4"):
        datum_array(caffe_pb2.Datum(channels=1, height=2, width=2, float_data=[1, 2, 3]), "r")
    for dims in ((-1, 2, 3), (-1, -2, 3), (2, -3, -1), (0, 1, 1)):
        # -1 x -2 x 3 = 6 bytes fits the data: numpy's reshape raised ValueError
        bad = caffe_pb2.Datum(channels=dims[0], height=dims[1], width=dims[2], data=bytes(abs(np.prod(dims))))
        with pytest.raises(DataError, match=r"r: Datum of channels x height x width = %d x %d x %d; expected "
                           r"channels >= 1" % dims):
            datum_array(bad, "r")


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(width, height, colour_type, idat):
    """A PNG whose header declares width x height (8 bits, colour type 0 grey or 2 RGB) over the given IDAT data."""
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0))
            + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b""))


def test_a_78_byte_png_of_20000_x_20000_is_refused_before_decoding():
    bomb = png_declaring(20000, 20000, 2, zlib.compress(bytes(range(13))))
    assert len(bomb) == 78
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # nor may Pillow's DecompressionBombWarning escape
        for is_color in (True, False, None):  # Pillow raised DecompressionBombError
            with pytest.raises(DataError, match=r"rec 3: the image is larger than 67108864 values"):
                decode_image(bomb, is_color, "rec 3")


def test_an_87_kb_png_of_10000_x_9000_is_refused_before_decoding(tmp_path):
    """It decoded with only Pillow's warning, into 257 MB at the peak."""
    compressor = zlib.compressobj(9)
    row = bytes(1 + 10000)                    # filter byte + 10000 grey pixels
    idat = b"".join(compressor.compress(row) for _ in range(9000)) + compressor.flush()
    png = png_declaring(10000, 9000, 0, idat)
    assert 80000 < len(png) < 90000
    (tmp_path / "big.png").write_bytes(png)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError, match=r"big.png: the image is 10000 x 9000 x 1 channel\(s\), more than "
                           r"67108864 values \(MAX_IMAGE_VALUES"):
            load_image(tmp_path / "big.png", False)
        with pytest.raises(DataError, match=r"the image is 10000 x 9000 x 3 channel\(s\)"):
            decode_image(png, True, "x")


def test_the_image_bound_is_checked_from_the_header(monkeypatch):
    """width x height x channels: the larger of the stored bands and the channels returned."""
    rgb = png(np.zeros((4, 5, 3), np.uint8))
    monkeypatch.setattr(images, "MAX_IMAGE_VALUES", 60)
    assert decode_image(rgb, True, "x").shape == (3, 4, 5)
    monkeypatch.setattr(images, "MAX_IMAGE_VALUES", 59)
    with pytest.raises(DataError, match=r"x: the image is 5 x 4 x 3 channel\(s\), more than 59 values"):
        decode_image(rgb, False, "x")
    grey = png(np.zeros((4, 5), np.uint8))
    assert decode_image(grey, False, "x").shape == (1, 4, 5)
    with pytest.raises(DataError, match=r"5 x 4 x 3 channel"):
        decode_image(grey, True, "x")                          # made into three channels
    monkeypatch.setenv("PCD_MAX_IMAGE_VALUES", "60")
    assert decode_image(grey, True, "x").shape == (3, 4, 5)
    monkeypatch.setenv("PCD_MAX_IMAGE_VALUES", "lots")
    with pytest.raises(DataError, match=r"PCD_MAX_IMAGE_VALUES='lots' is not an integer"):
        decode_image(grey, True, "x")


def test_formats_opencv_does_not_read_are_refused():
    out = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(out, format="TGA")
    with pytest.raises(DataError, match=r"t: cannot decode the image: not an image in a format Caffe reads"):
        decode_image(out.getvalue(), True, "t")


def test_a_damaged_chunk_length_is_not_read_at_once(tmp_path):
    """Pillow reads what is left of a PNG chunk by its declared length, and a buffered file read allocates the
    length first: 2 GiB for 4 damaged bytes (MemoryError under a memory limit, found by tests/fuzz)."""
    import tracemalloc
    data = bytearray(png(np.zeros((4, 4, 3), np.uint8)))
    idat = data.index(b"IDAT") - 4
    data[idat:idat + 4] = struct.pack(">I", 2 ** 31 - 1)
    (tmp_path / "long.png").write_bytes(bytes(data))
    tracemalloc.start()
    try:
        load_image(tmp_path / "long.png", True)
    except DataError:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 24
