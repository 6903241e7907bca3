"""caffe.Classifier (pycaffe_dist/classifier.py): its predictions equal the net's forward pass over images
preprocessed by hand as Caffe's Classifier and Transformer do (resize, centre crop or the ten crops, transpose,
channel swap, raw scale, mean, input scale), in both modes, for any number of images."""
import numpy as np
import pytest

from pycaffe_dist.classifier import Classifier, InferenceInputError
from pycaffe_dist.errors import PycaffeDistError
from pycaffe_dist.io.pycaffe_io import resize_image
from pycaffe_dist.pycaffe import TEST, Net
from tests.inference.small_nets import write_deploy

SWAP, RAW, INPUT_SCALE = (2, 1, 0), 255.0, 0.02


def images(count, height, width, channels=3, seed=1):
    rng = np.random.RandomState(seed)
    return [rng.rand(height, width, channels).astype(np.float32) for _ in range(count)]


def by_hand(crop, mean):
    """Caffe's preprocessing of one H x W x K crop, written out: K x H x W, BGR, x255, minus mean, x0.02."""
    x = crop.transpose(2, 0, 1)[list(SWAP)] * RAW
    return (x - mean) * INPUT_SCALE


def forward(proto, weights, batch):
    net = Net(str(proto), TEST, weights=str(weights))
    net.blobs["data"].reshape(*batch.shape)
    return net.forward(data=batch)["prob"].copy()


@pytest.fixture
def small(tmp_path):
    return write_deploy(tmp_path, channels=3, size=8, batch=2, classes=5)


def mean_image():
    return np.random.RandomState(7).rand(3, 8, 8).astype(np.float32) * 100


def test_centre_crop_is_the_hand_made_preprocess_through_forward(small):
    proto, weights = small
    mean = mean_image()
    clf = Classifier(str(proto), str(weights), image_dims=(11, 12), mean=mean, input_scale=INPUT_SCALE, raw_scale=RAW,
                     channel_swap=SWAP)
    inputs = images(5, 20, 15)           # five images through a net of batch 2: forward_all pads and trims
    got = clf.predict(inputs, oversample=False)
    assert got.shape == (5, 5)
    # resize to 11 x 12, then the centre 8 x 8 starts at int(5.5 - 4) = 1, int(6 - 4) = 2
    crops = [resize_image(im, (11, 12))[1:9, 2:10] for im in inputs]
    want = forward(proto, weights, np.stack([by_hand(c, mean) for c in crops]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert not np.allclose(got[0], got[1])          # the images give different answers


def test_oversampling_averages_the_ten_crops_and_their_mirrors(small):
    proto, weights = small
    mean = np.array([10.0, 20.0, 30.0], dtype=np.float32)       # per channel
    clf = Classifier(str(proto), str(weights), image_dims=(12, 12), mean=mean, input_scale=INPUT_SCALE, raw_scale=RAW,
                     channel_swap=SWAP)
    inputs = images(3, 12, 12)          # already at image_dims
    got = clf.predict(inputs)           # oversample=True is Caffe's default
    assert got.shape == (3, 5)
    for i, im in enumerate(inputs):
        corners = [im[y:y + 8, x:x + 8] for y, x in ((0, 0), (0, 4), (4, 0), (4, 4), (2, 2))]
        crops = corners + [c[:, ::-1] for c in corners]
        batch = np.stack([by_hand(c, mean[:, None, None]) for c in crops])
        want = forward(proto, weights, batch).mean(0)
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-7)
    # the centre crop alone differs from the average over ten
    assert not np.allclose(clf.predict(inputs, oversample=False), got)


def test_default_image_dims_are_the_input_size(small):
    proto, weights = small
    clf = Classifier(str(proto), str(weights))
    assert list(clf.image_dims) == [8, 8] and list(clf.crop_dims) == [8, 8]
    inputs = images(2, 8, 8)
    got = clf.predict(inputs, oversample=False)
    want = forward(proto, weights, np.stack([im.transpose(2, 0, 1) for im in inputs]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.sum(1), 1.0, rtol=1e-5)     # the Softmax output


def test_a_grey_net_takes_one_channel_images(tmp_path):
    proto, weights = write_deploy(tmp_path, channels=1, size=8, batch=4, classes=3)
    clf = Classifier(str(proto), str(weights), raw_scale=255.0, input_scale=0.00390625)
    inputs = images(2, 8, 8, channels=1)
    got = clf.predict(inputs, oversample=False)
    want = forward(proto, weights, np.stack([im.transpose(2, 0, 1) * 255.0 * 0.00390625 for im in inputs]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_images_of_the_wrong_channel_count_are_refused_clearly(tmp_path):
    proto, weights = write_deploy(tmp_path, channels=1, size=8, batch=2, classes=3)
    clf = Classifier(str(proto), str(weights))
    with pytest.raises(InferenceInputError, match=r"3 channel\(s\) but the net's input 'data' takes 1.*grey"):
        clf.predict(images(1, 8, 8, channels=3))
    with pytest.raises(ValueError, match="no images"):
        clf.predict([])


def test_image_dims_smaller_than_the_input_are_refused(small):
    proto, weights = small
    with pytest.raises(InferenceInputError, match=r"image_dims \(6, 9\) .* input size \(8, 8\)") as info:
        Classifier(str(proto), str(weights), image_dims=(6, 9))
    assert isinstance(info.value, ValueError) and isinstance(info.value, PycaffeDistError)


def test_a_net_without_inputs_is_refused(tmp_path):
    proto = tmp_path / "train.prototxt"
    proto.write_text('name: "no_inputs" layer { name: "d" type: "DummyData" top: "data" '
                     'dummy_data_param { shape { dim: 1 dim: 1 dim: 4 dim: 4 } } }')
    with pytest.raises(InferenceInputError, match="net 'no_inputs' has no input blobs"):
        Classifier(str(proto), None)
