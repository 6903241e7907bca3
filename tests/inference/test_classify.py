"""`dist_caffe classify` (pycaffe_dist/inference/classify.py, cli/inference.py): inputs of every kind, CSV /
JSON / .npy results with labels and top-k, the preprocessing flags, clear errors; and the issue's acceptance:
LeNet trained by the main job's solver classifies Fashion-MNIST PNG files exactly as `dist_caffe test` and the
TEST-phase net score the same images."""
import csv
import io
import json
import pathlib
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from pycaffe_dist.classifier import Classifier
from pycaffe_dist.errors import PycaffeDistError
from pycaffe_dist.inference import Progress, classify
from tests.cli.commands import dist_caffe
from tests.conftest import REPO, ZOO
from tests.inference.small_nets import run_verb, write_deploy

FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")
LENET_DEPLOY = ZOO / "bvlc" / "examples" / "mnist" / "lenet.prototxt"     # Caffe's deploy of the main job's LeNet
FASHION_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                 "Ankle boot"]


def png_images(folder, count, height, width, seed=0):
    """`count` random RGB PNG files in `folder`; returns their paths and pixels (uint8)."""
    folder.mkdir()
    rng = np.random.RandomState(seed)
    paths, pixels = [], []
    for i in range(count):
        p = rng.randint(0, 256, (height, width, 3)).astype(np.uint8)
        path = folder / ("img%02d.png" % i)
        Image.fromarray(p).save(path)
        paths.append(path)
        pixels.append(p)
    return paths, pixels


@pytest.fixture
def small(tmp_path):
    proto, weights = write_deploy(tmp_path, channels=3, size=8, batch=2, classes=5)
    (tmp_path / "names.txt").write_text("zero\none\ntwo\nthree\nfour\n")
    return proto, weights


def caffe_scores(proto, weights, pixels, **options):
    """What caffe.Classifier with Caffe's classify.py defaults (raw_scale 255, channel swap 2,1,0) predicts."""
    clf = Classifier(str(proto), str(weights), raw_scale=255.0, channel_swap=(2, 1, 0), **options)
    return clf.predict([p.astype(np.float32) / 255 for p in pixels], oversample=False)


def test_a_directory_to_csv_with_names_and_top_k(small, tmp_path, capsys):
    proto, weights = small
    paths, pixels = png_images(tmp_path / "imgs", 5, 8, 8)
    out = tmp_path / "out.csv"
    assert run_verb("classify", tmp_path / "imgs", "--model", proto, "--weights", weights, "--labels",
                    tmp_path / "names.txt", "--top-k", 3, "-o", out, "--input-scale", 0.02) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["image", "label", "class_1", "name_1", "probability_1", "class_2", "name_2",
                       "probability_2", "class_3", "name_3", "probability_3"]
    want = caffe_scores(proto, weights, pixels, input_scale=0.02)
    assert [r[0] for r in rows[1:]] == [str(p) for p in paths]
    for row, scores in zip(rows[1:], want):
        best = np.argsort(-scores, kind="stable")[:3]
        assert [int(c) for c in row[2::3]] == list(best)
        assert row[3::3] == [["zero", "one", "two", "three", "four"][c] for c in best]
        assert np.float32(row[4::3]).tolist() == scores[best].tolist()        # the float32 read back exactly
        assert row[1] == ""
    assert "wrote %s" % out in capsys.readouterr().err


def test_a_list_file_with_labels_to_json_reports_top1_accuracy(small, tmp_path, capsys):
    proto, weights = small
    paths, pixels = png_images(tmp_path / "imgs", 4, 10, 12)
    want = caffe_scores(proto, weights, pixels, image_dims=(10, 12))
    truth = [int(np.argmax(want[0])), (int(np.argmax(want[1])) + 1) % 5, int(np.argmax(want[2])), 0]
    lines = ["imgs/%s %d" % (p.name, label) for p, label in zip(paths, truth)]
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n\n")
    out = tmp_path / "out.json"
    run_verb("classify", tmp_path / "list.txt", "--model", proto, "--weights", weights, "--images-dim", "10,12",
             "-o", out, "--top-k", 9)
    result = json.loads(out.read_text())
    assert [e["image"] for e in result["images"]] == ["imgs/" + p.name for p in paths]
    assert [e["label"] for e in result["images"]] == truth
    assert all(len(e["top_k"]) == 5 for e in result["images"])           # top-k clipped to the 5 classes
    for entry, scores in zip(result["images"], want):
        assert [t["class"] for t in entry["top_k"]] == list(np.argsort(-scores, kind="stable"))
        assert [np.float32(t["probability"]) for t in entry["top_k"]] == sorted(scores.tolist(), reverse=True)
    hits = sum(int(np.argmax(s)) == t for s, t in zip(want, truth))
    assert result["top1_accuracy"] == hits / 4 and result["labelled_images"] == 4
    assert "top-1 accuracy %.4f over 4 labelled images" % (hits / 4) in capsys.readouterr().err


def test_npy_inputs_and_npy_output_as_caffe_classify_py(small, tmp_path):
    proto, weights = small
    arrays = np.random.RandomState(5).rand(3, 8, 8, 3).astype(np.float32)
    np.save(tmp_path / "in.npy", arrays)
    run_verb("classify", tmp_path / "in.npy", "--model", proto, "--weights", weights, "--oversample",
             "--mean-values", "0.1,0.2,0.3", "--raw-scale", 0, "--channel-swap", "none", "-o", tmp_path / "o.npy")
    clf = Classifier(str(proto), str(weights), mean=np.array([0.1, 0.2, 0.3], dtype=np.float32))
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), clf.predict(list(arrays)), rtol=1e-6)


def test_stdout_csv_without_output_and_a_mean_file(small, tmp_path, capsys):
    proto, weights = small
    _, pixels = png_images(tmp_path / "imgs", 1, 8, 8)
    from pycaffe_dist.blob.binaryproto import write_blob_file
    mean = np.random.RandomState(2).rand(1, 3, 10, 10).astype(np.float32) * 255
    write_blob_file(str(tmp_path / "mean.binaryproto"), mean)
    run_verb("classify", tmp_path / "imgs" / "img00.png", "--model", proto, "--weights", weights, "--mean",
             tmp_path / "mean.binaryproto", "--top-k", 1, "--input-scale", 0.02)
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    want = caffe_scores(proto, weights, pixels, mean=mean[0, :, 1:9, 1:9], input_scale=0.02)[0]   # centre of mean
    assert rows[0] == ["image", "label", "class_1", "probability_1"]
    assert int(rows[1][2]) == int(np.argmax(want)) and np.float32(rows[1][3]) == want.max()


def test_batch_size_changes_the_forward_batch_not_the_answers(small, tmp_path):
    proto, weights = small
    png_images(tmp_path / "imgs", 5, 8, 8)
    for batch in (1, 3):
        run_verb("classify", tmp_path / "imgs", "--model", proto, "--weights", weights, "--batch-size", batch,
                 "-o", tmp_path / ("b%d.npy" % batch))
    np.testing.assert_allclose(np.load(tmp_path / "b1.npy"), np.load(tmp_path / "b3.npy"), rtol=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--labels", "short.txt"], "the label names give 2 classes but the net's output 'prob' has 5"),
    (["--mean-values", "1,2"], "--mean-values gives 2 values; the net's input has 3 channels"),
    (["--mean", "small_mean.npy"], "small_mean.npy: the mean is 3x4x4; the net's input needs 3 x H x W with H >= 8"),
    (["--channel-swap", "0,0,1"], "--channel-swap 0,0,1 is not an order of the net's 3 input channels"),
    (["--images-dim", "6,6"], r"image_dims \(6, 6\) must be \(height, width\) at least the net's input size"),
    (["--gray"], r"1 channel\(s\) but the net's input 'data' takes 3"),
    (["--top-k", "0"], "--top-k must be at least 1"),
])
def test_bad_options_are_one_clear_error(small, tmp_path, args, message):
    proto, weights = small
    png_images(tmp_path / "imgs", 1, 8, 8)
    (tmp_path / "short.txt").write_text("a\nb\n")
    np.save(tmp_path / "small_mean.npy", np.zeros((3, 4, 4), np.float32))
    args = [str(tmp_path / a) if a.endswith((".txt", ".npy")) else a for a in args]
    with pytest.raises(PycaffeDistError, match=message):
        run_verb("classify", tmp_path / "imgs", "--model", proto, "--weights", weights, *args)


def test_bad_inputs_name_the_file_and_line(small, tmp_path):
    proto, weights = small
    (tmp_path / "list.txt").write_text("missing.png 3\n")
    (tmp_path / "empty").mkdir()
    np.save(tmp_path / "bad.npy", np.zeros((2, 3, 4, 5, 6), np.float32))
    cases = [(tmp_path / "list.txt", r"list.txt:1: no image file .*missing.png"),
             (tmp_path / "empty", "the directory holds no images"),
             (tmp_path / "nothing.png", "nothing.png: no such file or directory"),
             (tmp_path / "bad.npy", r"bad.npy: expected N x H x W x K, N x H x W or H x W images, got shape")]
    for path, message in cases:
        with pytest.raises(PycaffeDistError, match=message):
            run_verb("classify", path, "--model", proto, "--weights", weights)


def test_progress_line_counts_rate_and_eta():
    stream = io.StringIO()
    progress = Progress("classify", 10, stream, every_s=0.0)
    progress.step(4)
    progress.close()
    first, last = stream.getvalue().splitlines()
    assert re.fullmatch(r"classify: 4/10 images  40%, \d+ images/s, ETA \d:\d\d:\d\d", first)
    assert re.fullmatch(r"classify: 4 images in \d+\.\d s \(\d+ images/s\)", last)


def test_list_names_with_spaces_and_no_label(tmp_path):
    (tmp_path / "a b.png").write_bytes(b"")
    (tmp_path / "c.png").write_bytes(b"")
    (tmp_path / "l.txt").write_text("a b.png\nc.png 7\n")
    items = classify.collect_inputs([tmp_path / "l.txt"])
    assert [(i.name, i.label) for i in items] == [("a b.png", None), ("c.png", 7)]


# --- the acceptance: LeNet on Fashion-MNIST ----------------------------------------------------------------------

def _fashion_subset(tmp_path, train_count, test_count):
    """The main job's tree in tmp_path: prototxt/ (its LeNet and solver), data/fashion-mnist/{train,test}.datumfile
    with the first images of each split (as convert-idx writes them), out/."""
    from pycaffe_dist.data import idx, sources
    from pycaffe_dist.proto import caffe_pb2
    (tmp_path / "prototxt").mkdir()
    for name in ("lenet_solver.prototxt", "lenet_train_test.prototxt"):
        shutil.copy(REPO / "prototxt" / name, tmp_path / "prototxt" / name)
    (tmp_path / "data" / "fashion-mnist").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    test_pixels = None
    for split, dst, count in (("train", "train", train_count), ("t10k", "test", test_count)):
        pixels, labels = idx.read_mnist(FASHION / ("%s-images-idx3-ubyte.gz" % split),
                                        FASHION / ("%s-labels-idx1-ubyte.gz" % split))
        with sources.open_writer(tmp_path / "data" / "fashion-mnist" / ("%s.datumfile" % dst), "datumfile") as w:
            for i in range(count):
                datum = caffe_pb2.Datum(channels=1, height=28, width=28, data=pixels[i].tobytes(),
                                        label=int(labels[i]))
                w.put(b"%08d" % i, datum.SerializeToString())
        test_pixels = (pixels[:count], labels[:count])
    return test_pixels


@pytest.mark.skipif(not FASHION.is_dir(), reason="Fashion-MNIST is not installed in %s "
                    "(apt-get install dataset-fashion-mnist)" % FASHION)
def test_lenet_classifies_fashion_mnist_pngs_as_dist_caffe_test_scores_them(tmp_path, monkeypatch):
    from pycaffe_dist.pycaffe import TEST, Net
    iterations, count = 60, 300                     # 3 test batches of LeNet's 100
    pixels, labels = _fashion_subset(tmp_path, 64 * iterations, count)
    train = dist_caffe("train", "--solver", "prototxt/lenet_solver.prototxt", "--iterations", iterations,
                       cwd=tmp_path)
    assert train.returncode == 0, train.stderr
    weights = tmp_path / "out" / ("lenet_iter_%d.caffemodel" % iterations)
    # the test images as PNG files, a list with their labels, and the class names
    (tmp_path / "png").mkdir()
    with open(tmp_path / "test.txt", "w") as f:
        for i in range(count):
            Image.fromarray(pixels[i]).save(tmp_path / "png" / ("%05d.png" % i))
            f.write("png/%05d.png %d\n" % (i, labels[i]))
    (tmp_path / "names.txt").write_text("\n".join(FASHION_NAMES) + "\n")
    # LeNet's data layer scales the uint8 pixels by 1/256: [0, 1] images x 255 (raw scale) x 0.00390625
    assert run_verb("classify", tmp_path / "test.txt", "--model", LENET_DEPLOY, "--weights", weights,
                    "--labels", tmp_path / "names.txt", "--input-scale", 0.00390625, "-o", tmp_path / "out.json",
                    "--batch-size", 50, "--top-k", 10) == 0
    result = json.loads((tmp_path / "out.json").read_text())
    top1 = np.array([e["top_k"][0]["class"] for e in result["images"]])
    probs = np.array([[t["probability"] for t in sorted(e["top_k"], key=lambda t: t["class"])]
                      for e in result["images"]])
    assert [e["label"] for e in result["images"]] == labels.tolist()
    assert result["images"][0]["top_k"][0]["name"] == FASHION_NAMES[top1[0]]

    # image by image: the main job's TEST net over the same records (its paths are relative to the tree's root)
    monkeypatch.chdir(tmp_path)
    net = Net("prototxt/lenet_train_test.prototxt", TEST, weights=str(weights))
    scores, seen = [], []
    for _ in range(count // 100):
        net.forward()
        scores.append(net.blobs["ip2"].data.copy())
        seen.append(net.blobs["label"].data.copy())
    scores, seen = np.concatenate(scores), np.concatenate(seen)
    assert seen.tolist() == labels.tolist()
    assert top1.tolist() == np.argmax(scores, axis=1).tolist()
    softmax = np.exp(scores - scores.max(1, keepdims=True))
    np.testing.assert_allclose(probs, softmax / softmax.sum(1, keepdims=True), rtol=1e-4, atol=1e-6)

    # and `dist_caffe test` over the same 300 images gives the accuracy classify's top-1 gives
    test = dist_caffe("test", "--model", "prototxt/lenet_train_test.prototxt", "--weights", weights,
                      "--iterations", count // 100, cwd=tmp_path)
    assert test.returncode == 0, test.stderr
    accuracy = float(re.findall(r"\] accuracy = ([0-9.]+)", test.stderr)[-1])
    assert result["top1_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert result["top1_accuracy"] == np.mean(top1 == labels) > 0.5            # it learnt something
