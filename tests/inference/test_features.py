"""`dist_caffe extract-features` (pycaffe_dist/inference/features.py, cli/inference.py): the named blobs of
every image the net's data layer reads, in Caffe's extract_features format (a float_data Datum per image, keys
%010d, legacy C/H/W) in LMDB / LevelDB / datumfile, and as HDF5 datasets or .npy arrays, equal to what the same
net computes batch by batch; errors that name the blob or output."""
import h5py
import numpy as np
import pytest

from pycaffe_dist.data import sources
from pycaffe_dist.errors import PycaffeDistError
from pycaffe_dist.inference import features
from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.pycaffe import TEST, Net
from tests.inference.small_nets import LAYERS, randomize, run_verb

RECORDS, BATCH, BATCHES = 10, 4, 3          # 12 images: the data layer wraps around after record 9, as Caffe's


@pytest.fixture
def data_net(tmp_path):
    """A TEST net reading a datumfile of 10 3x6x6 uint8 images (scale 1/255), with random weights saved."""
    rng = np.random.RandomState(0)
    with sources.open_writer(tmp_path / "images.datumfile", "datumfile") as w:
        for i in range(RECORDS):
            datum = caffe_pb2.Datum(channels=3, height=6, width=6, label=i % 5,
                                    data=rng.randint(0, 256, 108).astype(np.uint8).tobytes())
            w.put(b"%08d" % i, datum.SerializeToString())
    proto = tmp_path / "net.prototxt"
    proto.write_text('name: "feat" layer { name: "d" type: "Data" top: "data" top: "label" '
                     'transform_param { scale: 0.00392156862 } data_param { source: "%s" batch_size: %d '
                     'backend: DATUMFILE } }' % (tmp_path / "images.datumfile", BATCH) + LAYERS % {"classes": 5})
    weights = tmp_path / "w.caffemodel"
    randomize(Net(str(proto), TEST), 1).save(str(weights))
    return proto, weights


def expected(proto, weights, names):
    """{blob: [12, ...]}: the blobs after each of the 3 forward passes of a fresh net, stacked."""
    net = Net(str(proto), TEST, weights=str(weights))
    got = {name: [] for name in names}
    for _ in range(BATCHES):
        net.forward()
        for name in names:
            got[name].append(net.blobs[name].data.copy())
    return {name: np.concatenate(values) for name, values in got.items()}


def read_store(path, backend):
    with sources.open_records(path, backend) as records:
        return [(key, sources.parse_datum(value, key)) for key, value in records]


@pytest.mark.parametrize("backend", ["lmdb", "leveldb", "datumfile"])
def test_record_stores_hold_caffes_datums(data_net, tmp_path, backend, capsys):
    proto, weights = data_net
    outs = "%s,%s" % (tmp_path / "ip_out", tmp_path / "conv_out")
    assert run_verb("extract-features", "--model", proto, "--weights", weights, "--blobs", "ip,conv",
                    "--batches", BATCHES, "--output", outs, "--format", backend) == 0
    want = expected(proto, weights, ["ip", "conv", "label"])
    assert want["label"].tolist() == [i % RECORDS % 5 for i in range(12)]         # the data wrapped around
    for name, path, shape in (("ip", "ip_out", (5, 1, 1)), ("conv", "conv_out", (4, 4, 4))):
        records = read_store(tmp_path / path, backend)
        assert [key for key, _ in records] == [b"%010d" % i for i in range(12)]
        for (key, datum), values in zip(records, want[name]):
            assert (datum.channels, datum.height, datum.width) == shape
            assert not datum.data and not datum.HasField("label")
            np.testing.assert_array_equal(np.array(datum.float_data, dtype=np.float32), values.reshape(-1))
    err = capsys.readouterr().err
    assert "extract-features: 12 images in" in err and "extracted 12 images' 'ip' into %s" % (tmp_path / "ip_out") \
        in err


def test_hdf5_one_file_one_dataset_per_blob(data_net, tmp_path):
    proto, weights = data_net
    run_verb("extract-features", "--model", proto, "--weights", weights, "--blobs", "prob,data", "--batches",
             BATCHES, "--output", tmp_path / "f.h5", "--format", "hdf5")
    want = expected(proto, weights, ["prob", "data"])
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert sorted(f) == ["data", "prob"]
        assert f["prob"].shape == (12, 5) and f["prob"].dtype == np.float32
        np.testing.assert_array_equal(f["prob"][...], want["prob"])
        np.testing.assert_array_equal(f["data"][...], want["data"])


def test_npy_into_a_directory_one_array_per_blob(data_net, tmp_path):
    proto, weights = data_net
    (tmp_path / "feats").mkdir()
    run_verb("extract-features", "--model", proto, "--weights", weights, "--blobs", "ip,conv", "--batches", 2,
             "--output", tmp_path / "feats", "--format", "npy")
    want = expected(proto, weights, ["ip", "conv"])
    ip, conv = np.load(tmp_path / "feats" / "ip.npy"), np.load(tmp_path / "feats" / "conv.npy")
    assert ip.shape == (8, 5) and conv.shape == (8, 4, 4, 4)
    np.testing.assert_array_equal(ip, want["ip"][:8])
    np.testing.assert_array_equal(conv, want["conv"][:8])


def test_outputs_that_exist_are_refused_unless_overwrite(data_net, tmp_path):
    proto, weights = data_net
    args = ["extract-features", "--model", proto, "--weights", weights, "--blobs", "ip", "--batches", 1]
    for fmt, out in (("npy", tmp_path / "ip.npy"), ("lmdb", tmp_path / "ip_lmdb")):
        run_verb(*args, "--output", out, "--format", fmt)
        with pytest.raises(PycaffeDistError, match="already exists; refusing to overwrite it"):
            run_verb(*args, "--output", out, "--format", fmt)
        run_verb(*args, "--output", out, "--format", fmt, "--overwrite")


@pytest.mark.parametrize("blobs, output, message", [
    ("ip,fc7", "a,b", r"net.prototxt: the net \(TEST phase\) has no blob named 'fc7'; its blobs: data, label, conv"),
    ("ip,conv", "a", "2 blob names but 1 outputs"),
    ("ip,", "a,b", "--blobs needs blob names separated by commas"),
    ("ip,ip", "a,b", "--blobs names a blob twice"),
    ("ip", "nodir/a", r"a: no directory .*nodir to write it in"),
])
def test_bad_blobs_and_outputs_are_one_clear_error(data_net, tmp_path, blobs, output, message):
    proto, weights = data_net
    output = ",".join(str(tmp_path / o) for o in output.split(","))
    with pytest.raises(PycaffeDistError, match=message):
        run_verb("extract-features", "--model", proto, "--weights", weights, "--blobs", blobs, "--batches", 1,
                 "--output", output, "--format", "npy")


def test_a_deploy_net_is_refused(tmp_path):
    from tests.inference.small_nets import write_deploy
    proto, weights = write_deploy(tmp_path)
    with pytest.raises(PycaffeDistError, match=r"takes input blobs \(data\) that nothing would fill"):
        run_verb("extract-features", "--model", proto, "--weights", weights, "--blobs", "ip", "--batches", 1,
                 "--output", tmp_path / "x.npy", "--format", "npy")


def test_a_blob_of_more_than_four_axes_cannot_be_a_datum(tmp_path):
    proto = tmp_path / "n.prototxt"
    proto.write_text('name: "five" layer { name: "d" type: "DummyData" top: "x" '
                     'dummy_data_param { shape { dim: 2 dim: 1 dim: 1 dim: 1 dim: 3 } } }')
    weights = tmp_path / "w.caffemodel"
    Net(str(proto), TEST).save(str(weights))
    net = Net(str(proto), TEST, weights=str(weights))
    with pytest.raises(PycaffeDistError, match=r"blob 'x' is 2x1x1x1x3: a Datum holds at most 4 axes"):
        features.extract_features(net, ["x"], 1, {"x": str(tmp_path / "x_lmdb")}, "lmdb")
    counts = features.extract_features(net, ["x"], 2, {"x": str(tmp_path / "x.npy")}, "npy")
    assert counts == {"x": 4} and np.load(tmp_path / "x.npy").shape == (4, 1, 1, 1, 3)
