"""Fashion-MNIST (the IDX files of the dataset-fashion-mnist package) converts to every backend intact."""
import io
import pathlib

import numpy as np
import pytest

from pycaffe_dist.data import convert, idx
from pycaffe_dist.data.sources import open_records, parse_datum

FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")
# split: (records, sum of all uint8 pixels, first label, last label), computed once from the IDX files
SPLITS = {"train": (60000, 3431114169, 9, 5), "t10k": (10000, 573469082, 9, 5)}

pytestmark = pytest.mark.skipif(not FASHION.is_dir(), reason="Fashion-MNIST is not installed in %s "
                                "(apt-get install dataset-fashion-mnist)" % FASHION)


def split_files(split):
    return FASHION / ("%s-images-idx3-ubyte.gz" % split), FASHION / ("%s-labels-idx1-ubyte.gz" % split)


@pytest.mark.parametrize("split", SPLITS)
def test_idx_files_hold_what_we_expect(split):
    images, labels = idx.read_mnist(*split_files(split))
    count, pixel_sum, first, last = SPLITS[split]
    assert images.shape == (count, 28, 28) and labels.shape == (count,)
    assert int(images.sum(dtype=np.int64)) == pixel_sum and (labels[0], labels[-1]) == (first, last)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lmdb", "leveldb", "datumfile"])
def test_fashion_mnist_converts_to_every_backend(tmp_path, backend):
    for split, (count, pixel_sum, first, last) in SPLITS.items():
        images, labels = idx.read_mnist(*split_files(split))
        out = tmp_path / split
        assert convert.convert_idx(*split_files(split), out, backend, stream=io.StringIO()) == count
        with open_records(out, backend) as source:
            assert len(source) == count
            keys, data, got_labels = [], [], []
            for key, value in source:
                datum = parse_datum(value, key)
                assert (datum.channels, datum.height, datum.width) == (1, 28, 28)
                keys.append(key)
                data.append(datum.data)
                got_labels.append(datum.label)
        pixels = np.frombuffer(b"".join(data), dtype=np.uint8)
        assert pixels.size == count * 784
        assert int(pixels.sum(dtype=np.int64)) == int(images.sum(dtype=np.int64)) == pixel_sum
        assert keys[0] == b"00000000" and keys[-1] == b"%08d" % (count - 1)
        assert (got_labels[0], got_labels[-1]) == (first, last) and got_labels == labels.tolist()
