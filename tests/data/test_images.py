"""Images as Caffe's OpenCV path gives them: uint8 (C, H, W), BGR; Datum pixels."""
import io

import numpy as np
import pytest
from PIL import Image

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
