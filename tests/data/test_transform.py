"""DataTransformer against a per-element transcription of Caffe's DataTransformer::Transform(Datum) loop."""
import numpy as np
import pytest

from pycaffe_dist import common
from pycaffe_dist.data.transform import DataTransformer
from pycaffe_dist.errors import DataError
from pycaffe_dist.blob.binaryproto import write_blob_file
from pycaffe_dist.proto import caffe_pb2

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def caffe_transform(x, crop, h_off, w_off, mirror, mean_file=None, mean_values=None, scale=1.0):
    """data_transformer.cpp, Transform(const Datum&, Dtype*), element by element, in float32."""
    channels, datum_h, datum_w = x.shape
    height, width = (crop, crop) if crop else (datum_h, datum_w)
    out = np.empty((channels, height, width), np.float32)
    scale = np.float32(scale)
    for c in range(channels):
        for h in range(height):
            for w in range(width):
                data_index = (c, h_off + h, w_off + w)
                top = (c, h, width - 1 - w) if mirror else (c, h, w)
                element = np.float32(x[data_index])
                if mean_file is not None:
                    out[top] = (element - mean_file[data_index]) * scale
                elif mean_values is not None:
                    out[top] = (element - np.float32(mean_values[c if len(mean_values) > 1 else 0])) * scale
                else:
                    out[top] = element * scale
    return out


def param(**fields):
    p = caffe_pb2.TransformationParameter()
    for name, value in fields.items():
        if name == "mean_value":
            p.mean_value.extend(value)
        else:
            setattr(p, name, value)
    return p


@pytest.fixture
def batch():
    return np.random.default_rng(7).integers(0, 256, (5, 3, 9, 8), dtype=np.uint8)


def test_test_phase_centre_crop_mean_file_and_scale(batch, tmp_path):
    mean = np.random.default_rng(8).uniform(0, 255, (1, 3, 9, 8)).astype(np.float32)
    write_blob_file(tmp_path / "mean.binaryproto", mean)
    t = DataTransformer(param(crop_size=5, scale=0.00390625, mean_file=str(tmp_path / "mean.binaryproto")), TEST)
    got = t.transform(batch)
    assert got.dtype == np.float32 and got.shape == (5, 3, 5, 5)
    for i in range(5):
        want = caffe_transform(batch[i], 5, 2, 1, False, mean_file=mean[0], scale=0.00390625)
        np.testing.assert_array_equal(got[i], want)       # same float32 operations: bitwise


@pytest.mark.parametrize("values", [[104.0, 117.0, 123.0], [127.5]])
def test_mean_values_without_crop(batch, values):
    got = DataTransformer(param(mean_value=values, scale=0.5), TEST).transform(batch)
    for i in range(5):
        np.testing.assert_array_equal(got[i], caffe_transform(batch[i], 0, 0, 0, False, mean_values=values,
                                                              scale=0.5))


def test_train_random_crop_and_mirror_match_some_caffe_offset(batch, tmp_path):
    mean = np.random.default_rng(9).uniform(0, 255, (1, 3, 9, 8)).astype(np.float32)
    write_blob_file(tmp_path / "mean.binaryproto", mean)
    common.set_random_seed(11)
    t = DataTransformer(param(crop_size=4, mirror=True, mean_file=str(tmp_path / "mean.binaryproto")), TRAIN)
    # Every (h_off, w_off, mirror) Caffe's Rand can draw, for every image.
    choices = [(h, w, m) for h in range(6) for w in range(5) for m in (False, True)]
    candidates = [[caffe_transform(image, 4, h, w, m, mean_file=mean[0]) for h, w, m in choices] for image in batch]
    seen = set()
    for _ in range(100):
        got = t.transform(batch)
        for i in range(len(batch)):
            matches = [c for c, want in zip(choices, candidates[i]) if np.array_equal(got[i], want)]
            assert matches, "image %d is no crop/mirror of the input" % i
            seen.update(matches)
    # Every offset and both mirror states turn up: the draw is uniform over what Caffe's Rand allows
    # (500 draws over 30 offsets: missing one by chance has odds of about 1e-6, and the seed is fixed).
    assert {(h, w) for h, w, _ in seen} == {(h, w) for h in range(6) for w in range(5)}
    assert {m for _, _, m in seen} == {False, True}


def test_float_records_are_transformed_alike():
    x = np.random.default_rng(3).normal(size=(2, 1, 4, 4)).astype(np.float32)
    got = DataTransformer(param(scale=2.0, mean_value=[0.25]), TEST).transform(x)
    np.testing.assert_array_equal(got, (x - np.float32(0.25)) * np.float32(2.0))


def test_mean_file_of_other_shape_names_both_shapes(batch, tmp_path):
    write_blob_file(tmp_path / "m.binaryproto", np.zeros((1, 3, 10, 10), np.float32))
    t = DataTransformer(param(mean_file=str(tmp_path / "m.binaryproto")), TEST, "layer 'data' (Data)")
    with pytest.raises(DataError, match=r"layer 'data' \(Data\): mean file .*m.binaryproto has shape 3x10x10 but "
                                        r"the records are 3x9x8"):
        t.transform(batch)


def test_bad_configurations_are_refused(batch, tmp_path):
    write_blob_file(tmp_path / "m.binaryproto", np.zeros((1, 3, 9, 8), np.float32))
    with pytest.raises(DataError, match="mean_file and mean_value at the same time"):
        DataTransformer(param(mean_file=str(tmp_path / "m.binaryproto"), mean_value=[1.0]), TEST)
    with pytest.raises(DataError, match="2 mean_value entries for records of 3 channels"):
        DataTransformer(param(mean_value=[1.0, 2.0]), TEST).transform(batch)
    with pytest.raises(DataError, match="crop_size 10 is larger than the 9x8 records"):
        DataTransformer(param(crop_size=10), TEST).transform(batch)


def test_mean_file_of_several_images_uses_the_first(batch, tmp_path):
    """Caffe reads the mean blob by (c, h, w) offsets, so of a num > 1 blob only the first image counts
    (a reshape error before)."""
    mean = np.random.default_rng(9).uniform(0, 255, (2, 3, 9, 8)).astype(np.float32)
    write_blob_file(tmp_path / "mean.binaryproto", mean)
    got = DataTransformer(param(mean_file=str(tmp_path / "mean.binaryproto")), TEST).transform(batch[:1])
    np.testing.assert_array_equal(got[0], caffe_transform(batch[0], 0, 0, 0, False, mean_file=mean[0]))


def test_a_mean_file_without_values_is_refused(tmp_path):
    """num 0: indexing its first image raised IndexError, a reshape ValueError (found by tests/fuzz)."""
    for shape in ((0, 3, 4, 5), (2, 2, 0)):
        write_blob_file(tmp_path / "mean.binaryproto", np.zeros(shape, np.float32))
        with pytest.raises(DataError, match=r"mean file .*mean.binaryproto holds no values \(shape %s\)"
                           % "x".join(map(str, shape))):
            DataTransformer(param(mean_file=str(tmp_path / "mean.binaryproto")), TEST)
