"""pycaffe's caffe.io: Transformer, BlobProto/Datum conversions, oversample, resize_image, load_image."""
import subprocess
import sys

import numpy as np
import pytest

import pycaffe_dist as caffe
from pycaffe_dist.errors import DataError, ModelFileError
from pycaffe_dist.proto import caffe_pb2
from tests.conftest import REPO

# a 2x2 RGB image, HxWxK in [0, 1]
IMAGE = np.array([[[0.0, 0.5, 1.0], [1.0, 0.0, 0.2]],
                  [[0.2, 0.4, 0.6], [0.8, 1.0, 0.0]]], dtype=np.float32)


def imagenet_style_transformer(shape=(1, 3, 2, 2)):
    t = caffe.io.Transformer({"data": shape})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    t.set_mean("data", np.array([10.0, 20.0, 30.0]))
    t.set_input_scale("data", 0.5)
    return t


def test_fresh_interpreter_has_caffe_io_without_scipy():
    code = ("import sys, pycaffe_dist as caffe; caffe.io.Transformer; caffe.io.load_image; caffe.NetSpec; "
            "assert 'scipy' not in sys.modules and 'PIL' not in sys.modules")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr


def test_preprocess_order_transpose_swap_rawscale_mean_inputscale():
    out = imagenet_style_transformer().preprocess("data", IMAGE)
    # out[c] = (IMAGE[..., 2 - c] * 255 - mean[c]) * 0.5, worked by hand
    expected = np.array([[[122.5, 20.5], [71.5, -5.0]],      # B
                         [[53.75, -10.0], [41.0, 117.5]],    # G
                         [[-15.0, 112.5], [10.5, 87.0]]])    # R
    assert out.dtype == np.float32 and out.shape == (3, 2, 2)
    np.testing.assert_allclose(out, expected, atol=1e-4)


def test_preprocess_leaves_its_input_alone_and_deprocess_inverts():
    t = imagenet_style_transformer()
    image = IMAGE.copy()
    out = t.preprocess("data", image)
    np.testing.assert_array_equal(image, IMAGE)
    np.testing.assert_allclose(t.deprocess("data", out), IMAGE, atol=1e-6)
    back = t.deprocess("data", out[np.newaxis])     # a batch of one is squeezed, as pycaffe does
    assert back.shape == (2, 2, 3)
    np.testing.assert_allclose(back, IMAGE, atol=1e-6)


def test_preprocess_without_settings_only_casts():
    t = caffe.io.Transformer({"data": (1, 3, 2, 2)})
    out = t.preprocess("data", (IMAGE * 255).astype(np.uint8))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, (IMAGE * 255).astype(np.uint8))


def test_preprocess_resizes_to_the_input_size_first():
    t = caffe.io.Transformer({"data": (1, 3, 4, 6)})
    t.set_transpose("data", (2, 0, 1))
    out = t.preprocess("data", np.full((2, 3, 3), 0.5, np.float32))
    assert out.shape == (3, 4, 6)
    np.testing.assert_array_equal(out, 0.5)


def test_elementwise_means():
    t = caffe.io.Transformer({"data": (1, 3, 2, 2), "gray": (1, 1, 2, 2)})
    t.set_transpose("data", (2, 0, 1))
    mean = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    t.set_mean("data", mean)
    np.testing.assert_allclose(t.preprocess("data", IMAGE), IMAGE.transpose(2, 0, 1) - mean)
    t.set_transpose("gray", (2, 0, 1))
    t.set_mean("gray", np.ones((2, 2)))      # HxW for a one-channel input
    np.testing.assert_allclose(t.preprocess("gray", IMAGE[:, :, :1]), IMAGE[:, :, :1].transpose(2, 0, 1) - 1)


def test_transformer_checks():
    t = caffe.io.Transformer({"data": (1, 3, 2, 2)})
    with pytest.raises(DataError, match="label is not one of the net inputs"):
        t.set_raw_scale("label", 255)
    with pytest.raises(DataError, match="is not one of the net inputs"):
        t.preprocess("label", IMAGE)
    with pytest.raises(DataError, match="Transpose order"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(DataError, match="Channel swap"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(ValueError, match="Mean channels incompatible"):
        t.set_mean("data", np.zeros(4))
    with pytest.raises(ValueError, match="Mean shape incompatible"):
        t.set_mean("data", np.zeros((3, 4, 4)))
    with pytest.raises(ValueError, match="Mean shape invalid"):
        t.set_mean("data", np.zeros((1, 3, 2, 2)))


# --- BlobProto / Datum ---------------------------------------------------------------------------------------

def test_blobproto_round_trip_nd():
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    diff = -arr
    blob = caffe.io.array_to_blobproto(arr, diff)
    assert list(blob.shape.dim) == [2, 3, 4] and not blob.HasField("num")
    back = caffe.io.blobproto_to_array(blob)
    assert back.dtype == np.float32 and back.shape == (2, 3, 4)
    np.testing.assert_array_equal(back, arr)
    np.testing.assert_array_equal(caffe.io.blobproto_to_array(blob, return_diff=True), diff)
    with pytest.raises(ValueError, match="diff shape"):
        caffe.io.array_to_blobproto(arr, diff[:1])


def test_blobproto_legacy_4d_shape_and_double_data():
    blob = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3, data=[1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(caffe.io.blobproto_to_array(blob), [[[[1, 2, 3]], [[4, 5, 6]]]])
    blob = caffe_pb2.BlobProto(shape=dict(dim=[2]), double_data=[0.1, 0.2], double_diff=[1e300, 2])
    assert caffe.io.blobproto_to_array(blob).tolist() == [0.1, 0.2]
    assert caffe.io.blobproto_to_array(blob, return_diff=True).tolist() == [1e300, 2]


def test_a_blobproto_whose_values_do_not_fill_its_shape():
    """pycaffe's reshape raised ValueError on bytes read from a file (found by tests/fuzz)."""
    with pytest.raises(DataError, match=r"blob holds 3 values but its shape \(2, 2\) needs 4"):
        caffe.io.blobproto_to_array(caffe_pb2.BlobProto(shape=dict(dim=[2, 2]), data=[1, 2, 3]))
    data = caffe_pb2.BlobProtoVector(blobs=[caffe_pb2.BlobProto(num=1, channels=-1, height=1, width=1)])
    with pytest.raises(DataError, match=r"blob holds 0 values but its shape \(1, -1, 1, 1\) needs -1"):
        caffe.io.blobprotovector_str_to_arraylist(data.SerializeToString())


def test_blobprotovector_round_trip():
    arrays = [np.ones((1, 2)), np.arange(6.0).reshape(1, 2, 3), np.array(5.0)]
    data = caffe.io.arraylist_to_blobprotovector_str(arrays)
    assert caffe.io.arraylist_to_blobprotovecor_str(arrays) == data     # pycaffe's spelling
    back = caffe.io.blobprotovector_str_to_arraylist(data)
    assert [a.shape for a in back] == [(1, 2), (1, 2, 3), ()]
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)
    assert caffe.io.blobprotovector_str_to_arraylist(caffe.io.arraylist_to_blobprotovector_str([])) == []
    with pytest.raises(ModelFileError):
        caffe.io.blobprotovector_str_to_arraylist(b"\xff\xff\xff")


def test_array_to_datum_uint8_goes_to_data_bytes():
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    datum = caffe.io.array_to_datum(arr, label=7)
    assert (datum.channels, datum.height, datum.width, datum.label) == (2, 3, 4, 7)
    assert datum.data == bytes(range(24)) and len(datum.float_data) == 0
    back = caffe.io.datum_to_array(datum)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, arr)
    back[0, 0, 0] = 99       # a writable copy


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_array_to_datum_other_dtypes_go_to_float_data(dtype):
    arr = (np.arange(6).reshape(1, 2, 3) * 1.5).astype(dtype)
    datum = caffe.io.array_to_datum(arr)
    assert datum.data == b"" and list(datum.float_data) == list(arr.astype(float).ravel())
    assert not datum.HasField("label")
    back = caffe.io.datum_to_array(datum)
    assert back.dtype == np.float64
    np.testing.assert_array_equal(back, arr)


def test_datum_errors():
    with pytest.raises(ValueError, match="Incorrect array shape"):
        caffe.io.array_to_datum(np.zeros((2, 2)))
    with pytest.raises(DataError, match="holds 3 values, not channels x height x width = 1x2x2"):
        caffe.io.datum_to_array(caffe_pb2.Datum(channels=1, height=2, width=2, data=b"abc"))
    with pytest.raises(DataError, match="encoded"):
        caffe.io.datum_to_array(caffe_pb2.Datum(channels=3, height=2, width=2, data=b"\xff\xd8", encoded=True))
    with pytest.raises(DataError, match="holds 6 values, not channels x height x width = -1x-2x3"):
        caffe.io.datum_to_array(caffe_pb2.Datum(channels=-1, height=-2, width=3, data=bytes(6)))   # reshape failed


# --- oversample ----------------------------------------------------------------------------------------------

def test_oversample_corners_center_and_mirrors():
    a = np.arange(4 * 5 * 2, dtype=np.float32).reshape(4, 5, 2)
    b = -a
    crops = caffe.io.oversample([a, b], (2, 3))
    assert crops.shape == (20, 2, 3, 2) and crops.dtype == np.float32
    boxes = [(0, 0), (0, 2), (2, 0), (2, 2), (1, 1)]   # TL, TR, BL, BR, center ((4-2)/2, (5-3)/2)
    for i, im in enumerate([a, b]):
        for k, (y, x) in enumerate(boxes):
            np.testing.assert_array_equal(crops[10 * i + k], im[y:y + 2, x:x + 3])
            np.testing.assert_array_equal(crops[10 * i + 5 + k], im[y:y + 2, x:x + 3][:, ::-1])


def test_oversample_odd_center_rounds_down():
    im = np.arange(49, dtype=np.float32).reshape(7, 7, 1)
    crops = caffe.io.oversample(np.stack([im]), (4, 4))
    np.testing.assert_array_equal(crops[4], im[1:5, 1:5])   # center 3.5 -/+ 2 -> rows 1..4, as pycaffe
    with pytest.raises(ValueError, match="larger than the image"):
        caffe.io.oversample([im], (8, 4))


# --- resize_image --------------------------------------------------------------------------------------------

def test_resize_upsample_is_pixel_center_aligned_with_mirrored_edges():
    im = np.array([[0.0, 1.0], [0.0, 1.0]]).reshape(2, 2, 1)
    out = caffe.io.resize_image(im, (4, 4))
    # output column j samples input x = (j + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 (edges mirrored)
    assert out.shape == (4, 4, 1) and out.dtype == np.float32
    np.testing.assert_allclose(out[:, :, 0], [[0.25, 0.25, 0.75, 0.75]] * 4, atol=1e-6)


def test_resize_downsample_averages_neighbours_and_keeps_range():
    im = np.arange(16, dtype=np.float32).reshape(4, 4, 1) * 10 + 5     # min 5, max 155
    out = caffe.io.resize_image(im, (2, 2))
    # samples at (0.5, 0.5), (0.5, 2.5), ...: means of 2x2 blocks
    np.testing.assert_allclose(out[:, :, 0], [[30, 50], [110, 130]], atol=1e-4)


def test_resize_three_channels_and_constant_image():
    im = np.random.RandomState(0).rand(3, 5, 3)
    out = caffe.io.resize_image(im, (4, 2))
    assert out.shape == (4, 2, 3) and im.min() <= out.min() and out.max() <= im.max()
    np.testing.assert_allclose(caffe.io.resize_image(im, (3, 5)), im, atol=1e-6)   # same size: unchanged
    const = caffe.io.resize_image(np.full((2, 3, 3), 7.0), (5, 4))
    assert const.shape == (5, 4, 3) and const.dtype == np.float32
    np.testing.assert_array_equal(const, 7.0)


def test_resize_other_channel_counts_is_corner_aligned_zoom():
    im = np.stack([[[0.0, 2.0], [4.0, 6.0]], [[1.0, 1.0], [1.0, 1.0]]], axis=-1)   # 2x2x2
    out = caffe.io.resize_image(im, (3, 3))
    np.testing.assert_allclose(out[:, :, 0], [[0, 1, 2], [2, 3, 4], [4, 5, 6]], atol=1e-6)
    np.testing.assert_allclose(out[:, :, 1], 1.0, atol=1e-6)


# --- load_image ----------------------------------------------------------------------------------------------

def test_load_image_without_pillow_says_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(DataError, match="load_image needs Pillow"):
        caffe.io.load_image(str(tmp_path / "cat.jpg"))


def test_load_image_with_pillow(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    rgba = np.array([[[255, 0, 51, 10], [0, 255, 102, 255]]], dtype=np.uint8)    # 1x2 RGBA
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    img = caffe.io.load_image(str(tmp_path / "rgba.png"))
    assert img.shape == (1, 2, 3) and img.dtype == np.float32
    np.testing.assert_allclose(img, rgba[:, :, :3] / 255.0, atol=1e-7)
    gray = np.array([[0, 51], [255, 102]], dtype=np.uint8)
    Image.fromarray(gray, "L").save(tmp_path / "gray.png")
    color = caffe.io.load_image(str(tmp_path / "gray.png"))
    assert color.shape == (2, 2, 3)
    np.testing.assert_allclose(color[:, :, 1], gray / 255.0, atol=1e-7)
    one = caffe.io.load_image(str(tmp_path / "gray.png"), color=False)
    assert one.shape == (2, 2, 1)
    np.testing.assert_allclose(one[:, :, 0], gray / 255.0, atol=1e-7)
    to_gray = caffe.io.load_image(str(tmp_path / "rgba.png"), color=False)
    np.testing.assert_allclose(to_gray[0, :, 0], [0.2125 + 0.0721 * 0.2, 0.7154 + 0.0721 * 0.4], atol=1e-6)
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match="bad.png: cannot decode the image"):
        caffe.io.load_image(str(tmp_path / "bad.png"))
