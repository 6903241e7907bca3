"""caffe.Detector (pycaffe_dist/detector.py): windows cropped as Caffe's R-CNN Detector crops them (the window
alone, or grown by context_pad with the mean filling what lies outside the image), warped to the input size, and
one prediction per window that equals the net's forward pass over the hand-made crops."""
import numpy as np
import pytest
from PIL import Image

from pycaffe_dist.classifier import InferenceInputError
from pycaffe_dist.detector import Detector, SelectiveSearchUnavailable
from pycaffe_dist.errors import PycaffeDistError
from pycaffe_dist.io.pycaffe_io import resize_image
from pycaffe_dist.pycaffe import TEST, Net
from tests.inference.small_nets import write_deploy

SWAP, RAW, INPUT_SCALE = (2, 1, 0), 255.0, 0.02
MEAN = np.array([10.0, 60.0, 200.0], dtype=np.float32)     # per channel, in the net's (BGR) order


@pytest.fixture
def small(tmp_path):
    return write_deploy(tmp_path, channels=3, size=8, batch=3, classes=4)


def picture(tmp_path, name, height=40, width=30, seed=3):
    """An RGB PNG of random pixels; returns (path, the pixels as caffe.io.load_image reads them)."""
    pixels = np.random.RandomState(seed).randint(0, 256, (height, width, 3)).astype(np.uint8)
    path = tmp_path / name
    Image.fromarray(pixels).save(path)
    return str(path), pixels.astype(np.float32) / 255


def detector(small, context_pad=None):
    proto, weights = small
    return Detector(str(proto), str(weights), mean=MEAN, input_scale=INPUT_SCALE, raw_scale=RAW, channel_swap=SWAP,
                    context_pad=context_pad)


def test_without_context_a_crop_is_the_window(small):
    det = detector(small)
    im = np.random.RandomState(0).rand(20, 20, 3).astype(np.float32)
    np.testing.assert_array_equal(det.crop(im, (2, 3, 12, 9)), im[2:12, 3:9])
    assert list(det.crop_dims) == [8, 8, 3]


def test_context_inside_the_image_grows_the_box_by_the_input_scale(small):
    det = detector(small, context_pad=1)
    im = np.random.RandomState(0).rand(40, 40, 3).astype(np.float32)
    # window 10..19 (10 pixels, Caffe's +1 sizes); scale 8 / (8 - 2): half size 5 -> 6.67, centre 15:
    # box round(8.33, 21.67) = 8..22; the 15 rows fill all 8 input rows; Caffe slices 8:22 (its box end excluded)
    np.testing.assert_allclose(det.crop(im, np.array([10, 10, 19, 19])), resize_image(im[8:22, 8:22], (8, 8)),
                               rtol=1e-6)


def test_context_beyond_the_image_is_filled_with_the_mean_in_image_space(small):
    det = detector(small, context_pad=1)
    im = np.random.RandomState(0).rand(40, 40, 3).astype(np.float32)
    crop = det.crop(im, (0, 0, 9, 9))
    # centre 5, box round(5 -/+ 6.67) = -2..12 (15 rows), 8/15 input pixels a row: round(2 * 8/15) = 1 row and
    # column of padding, then the clipped box 0..12 (13 rows) -> round(13 * 8/15) = 7 rows of image
    fill = (MEAN[np.argsort(SWAP)] / RAW).astype(np.float32)       # back to RGB, back to [0, 1]
    assert crop.shape == (8, 8, 3)
    np.testing.assert_allclose(crop[0], np.broadcast_to(fill, (8, 3)), rtol=1e-6)
    np.testing.assert_allclose(crop[:, 0], np.broadcast_to(fill, (8, 3)), rtol=1e-6)
    np.testing.assert_allclose(crop[1:, 1:], resize_image(im[0:12, 0:12], (7, 7)), rtol=1e-6)


def test_without_a_mean_the_context_is_zeros(small):
    proto, weights = small
    det = Detector(str(proto), str(weights), context_pad=1)
    crop = det.crop(np.ones((40, 40, 3), dtype=np.float32), (0, 0, 9, 9))
    assert (crop[0] == 0).all() and (crop[1:, 1:] == 1).all()


def test_detect_windows_gives_one_prediction_per_window_in_order(small, tmp_path):
    det = detector(small, context_pad=1)
    proto, weights = small
    first, im1 = picture(tmp_path, "a.png", seed=3)
    second, im2 = picture(tmp_path, "b.png", 25, 35, seed=4)
    windows1 = [np.array([0, 0, 9, 9]), np.array([10, 5, 30, 25])]
    windows2 = [np.array([3, 4, 20, 30]), np.array([5, 5, 14, 14])]
    found = det.detect_windows(zip([first, second], [windows1, windows2]))     # an iterator, as Caffe passes one
    assert [(d["filename"], tuple(d["window"])) for d in found] == \
        [(first, tuple(w)) for w in windows1] + [(second, tuple(w)) for w in windows2]
    crops = [det.crop(im1, w) for w in windows1] + [det.crop(im2, w) for w in windows2]
    batch = np.stack([(c.transpose(2, 0, 1)[list(SWAP)] * RAW - MEAN[:, None, None]) * INPUT_SCALE for c in crops])
    net = Net(str(proto), TEST, weights=str(weights))
    net.blobs["data"].reshape(*batch.shape)
    want = net.forward(data=batch)["prob"]
    np.testing.assert_allclose(np.stack([d["prediction"] for d in found]), want, rtol=1e-5, atol=1e-7)
    assert not np.allclose(want[0], want[1])


def test_windows_without_context_are_warped_to_the_input(small, tmp_path):
    det = detector(small)
    proto, weights = small
    name, im = picture(tmp_path, "a.png")
    found = det.detect_windows([(name, [(0, 0, 20, 10)])])
    crop = resize_image(im[0:20, 0:10], (8, 8))
    batch = ((crop.transpose(2, 0, 1)[list(SWAP)] * RAW - MEAN[:, None, None]) * INPUT_SCALE)[None]
    net = Net(str(proto), TEST, weights=str(weights))
    net.blobs["data"].reshape(*batch.shape)
    np.testing.assert_allclose(found[0]["prediction"], net.forward(data=batch)["prob"][0], rtol=1e-5, atol=1e-7)


def test_a_window_outside_the_image_is_named(small, tmp_path):
    det = detector(small)
    name, _ = picture(tmp_path, "a.png", 40, 30)
    with pytest.raises(InferenceInputError, match=r"a.png: window \(50, 0, 60, 10\) of the 40x30 image holds no"):
        det.detect_windows([(name, [(50, 0, 60, 10)])])


def test_selective_search_without_the_tool_says_what_is_missing(small, tmp_path):
    det = detector(small)
    with pytest.raises(SelectiveSearchUnavailable, match="selective_search_ijcv_with_python.*detect_windows") as info:
        det.detect_selective_search([str(tmp_path / "a.png")])
    assert isinstance(info.value, ImportError) and isinstance(info.value, PycaffeDistError)
