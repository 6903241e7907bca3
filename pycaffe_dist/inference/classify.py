"""`dist_caffe classify`: Caffe's python/classify.py, extended. Images (files, directories, list files with
labels, .npy arrays) go through a Classifier in batches; each gets its top-k classes with their probabilities
(the net's first output), written as CSV or JSON, or all scores as .npy as Caffe's tool writes them.

The preprocessing options are the Classifier's; their defaults are those of Caffe's classify.py (raw_scale 255,
BGR channel order for 3-channel nets), as a Caffe-trained model expects OpenCV's BGR pixels in [0, 255].
"""
import csv
import json
import os

import numpy as np

from ..blob.binaryproto import read_blob_file
from ..errors import PycaffeDistError
from ..io import pycaffe_io
from . import Progress

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".ppm", ".pgm", ".pbm", ".webp")


class ClassifyError(PycaffeDistError):
    """Inputs, labels or preprocessing options that `classify` cannot use."""


class Item:
    """One image to classify: its name in the output, its true label (a list file's) or None, and where its
    pixels are: an image file, or row `index` of an array loaded from a .npy file."""
    __slots__ = ("name", "label", "path", "array", "index")

    def __init__(self, name, label=None, path=None, array=None, index=None):
        self.name, self.label, self.path, self.array, self.index = name, label, path, array, index

    def load(self, color):
        """H x W x K float32: an image file through caffe.io.load_image ([0, 1]), an array row as it is."""
        if self.path is not None:
            return pycaffe_io.load_image(self.path, color=color)
        image = np.asarray(self.array[self.index], dtype=np.float32)
        return image[:, :, np.newaxis] if image.ndim == 2 else image


# --- inputs ---------------------------------------------------------------------------------------------------

def collect_inputs(paths, root=None, extensions=IMAGE_EXTENSIONS):
    """The Items of every input path, in order: an image file; a directory's image files (by `extensions`,
    sorted by name, not recursive); a .npy array (N x H x W x K, N x H x W, or one H x W image); any other
    file is a list of image paths, one a line, each optionally followed by an integer label as in
    convert_imageset's lists, relative to `root` (default: the list file's directory)."""
    items = []
    for path in paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            names = sorted(n for n in os.listdir(path) if n.lower().endswith(tuple(extensions))
                           and os.path.isfile(os.path.join(path, n)))
            if not names:
                raise ClassifyError("%s: the directory holds no images (%s)" % (path, " ".join(extensions)))
            items += [Item(os.path.join(path, n), path=os.path.join(path, n)) for n in names]
        elif not os.path.exists(path):
            raise ClassifyError("%s: no such file or directory" % path)
        elif path.lower().endswith(".npy"):
            items += _array_items(path)
        elif path.lower().endswith(tuple(IMAGE_EXTENSIONS)):
            items.append(Item(path, path=path))
        else:
            items += _list_items(path, root)
    if not items:
        raise ClassifyError("no images to classify")
    return items


def _array_items(path):
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ClassifyError("%s: not a readable .npy array: %s" % (path, exc)) from None
    if array.dtype.kind not in "biuf":
        raise ClassifyError("%s: holds %s values, not numbers" % (path, array.dtype))
    if array.ndim == 2:
        array = array[np.newaxis]
    if array.ndim not in (3, 4) or array.shape[0] == 0:
        raise ClassifyError("%s: expected N x H x W x K, N x H x W or H x W images, got shape %s"
                            % (path, array.shape))
    return [Item("%s[%d]" % (path, i), array=array, index=i) for i in range(array.shape[0])]


def _list_items(listfile, root):
    try:
        with open(listfile, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ClassifyError("%s: cannot read the image list: %s" % (listfile, exc.strerror)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ClassifyError("%s: neither an image (by its extension: %s), a .npy array nor a UTF-8 list of "
                            "image files" % (listfile, " ".join(IMAGE_EXTENSIONS))) from None
    base = root if root is not None else os.path.dirname(listfile)
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        name, label = line, None
        head, space, tail = line.rpartition(" ")
        if space and head.strip():
            try:
                name, label = head.rstrip(), int(tail)
            except ValueError:
                pass        # a name with spaces and no label
        path = os.path.join(base, name)
        if not os.path.isfile(path):
            raise ClassifyError("%s:%d: no image file %s" % (listfile, number, path))
        items.append(Item(name, label=label, path=path))
    if not items:
        raise ClassifyError("%s: the image list is empty" % listfile)
    return items


def read_labels(path):
    """Class names, one a line (Caffe's synset_words.txt: the whole line is the name)."""
    try:
        with open(path, encoding="utf-8") as f:
            names = [line.strip() for line in f.read().splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ClassifyError("%s: cannot read the label names: %s" % (path, exc)) from None
    while names and not names[-1]:
        names.pop()
    return names


# --- preprocessing options --------------------------------------------------------------------------------------

def load_mean(path, input_shape):
    """A mean image (.binaryproto as compute_image_mean writes it, or .npy) as C x H x W for an input of
    `input_shape` (N, C, H, W). A mean larger than the input is centre-cropped to it, as Caffe's TEST-phase data
    layer subtracts the mean at its centre crop; a 1-d .npy is a mean per channel."""
    if path.lower().endswith(".npy"):
        try:
            mean = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ClassifyError("%s: not a readable .npy mean: %s" % (path, exc)) from None
    else:
        mean = read_blob_file(path)
    mean = np.asarray(mean, dtype=np.float32)
    if mean.ndim == 4 and mean.shape[0] == 1:
        mean = mean[0]
    channels, height, width = input_shape[1:]
    if mean.ndim == 1:
        if mean.shape[0] != channels:
            raise ClassifyError("%s: %d channel means, but the net's input has %d channels"
                                % (path, mean.shape[0], channels))
        return mean
    if mean.ndim == 2:
        mean = mean[np.newaxis]
    if mean.ndim != 3 or mean.shape[0] != channels or mean.shape[1] < height or mean.shape[2] < width:
        raise ClassifyError("%s: the mean is %s; the net's input needs %d x H x W with H >= %d, W >= %d"
                            % (path, "x".join(map(str, mean.shape)), channels, height, width))
    top, left = (mean.shape[1] - height) // 2, (mean.shape[2] - width) // 2
    return np.ascontiguousarray(mean[:, top:top + height, left:left + width])


def mean_values(text, channels):
    """--mean-values "104,117,123": one value for every channel, or one per channel (in the net's channel order,
    as transform_param's mean_value)."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ClassifyError("--mean-values takes comma-separated numbers, got %r" % text) from None
    if len(values) == 1:
        values *= channels
    if len(values) != channels:
        raise ClassifyError("--mean-values gives %d values; the net's input has %d channels" % (len(values), channels))
    return np.array(values, dtype=np.float32)


def channel_swap(text, channels):
    """--channel-swap: "auto" is Caffe's classify.py default 2,1,0 (RGB images to a BGR net) for 3 channels and
    none otherwise; "none" or "" is none; else a permutation of the channels."""
    if text == "auto":
        return (2, 1, 0) if channels == 3 else None
    if text in ("", "none"):
        return None
    try:
        order = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ClassifyError("--channel-swap takes comma-separated channel numbers, got %r" % text) from None
    if sorted(order) != list(range(channels)):
        raise ClassifyError("--channel-swap %s is not an order of the net's %d input channels" % (text, channels))
    return order


def image_dims(text):
    """--images-dim "H,W" (Caffe's), or one number for a square."""
    try:
        dims = [int(v) for v in text.split(",")]
    except ValueError:
        dims = []
    if len(dims) == 1:
        dims *= 2
    if len(dims) != 2 or min(dims) < 1:
        raise ClassifyError("--images-dim takes 'height,width' (or one size), got %r" % text)
    return dims


# --- running --------------------------------------------------------------------------------------------------

def predict(classifier, items, color, oversample, progress=None):
    """Yield (item, scores) for every item: the images loaded and classified a net batch at a time (ten crops an
    image when oversampling), so memory stays one batch of images whatever their number."""
    batch = classifier.blobs[classifier.inputs[0]].data.shape[0]
    per_chunk = max(1, batch // 10) if oversample else batch
    for start in range(0, len(items), per_chunk):
        chunk = items[start:start + per_chunk]
        images = [item.load(color) for item in chunk]
        scores = classifier.predict(images, oversample=oversample)
        scores = scores.reshape(len(chunk), -1)
        for item, row in zip(chunk, scores):
            yield item, row
        if progress is not None:
            progress.step(len(chunk))


def top_k(scores, k):
    """The k best classes of a score vector, best first (ties: the lower class first, as argmax)."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return [int(c) for c in order[:k]]


def _number(value):
    """A float32 as the shortest decimal that reads back to the same float32."""
    return str(np.float32(value))


class Results:
    """What classify writes: per image its name, true label and top-k (class, name, probability); plus all
    scores for a .npy output."""

    def __init__(self, k, names=None):
        self.k, self.names = k, names
        self.rows, self.scores = [], []

    def add(self, item, scores):
        best = top_k(scores, self.k)
        self.rows.append((item.name, item.label, [(c, self.names[c] if self.names else None, scores[c])
                                                  for c in best]))
        self.scores.append(np.asarray(scores, dtype=np.float32))

    def accuracy(self):
        """(top-1 accuracy, images with a label) over the labelled images, or (None, 0)."""
        labelled = [(label, top[0][0]) for _, label, top in self.rows if label is not None]
        if not labelled:
            return None, 0
        return sum(label == best for label, best in labelled) / len(labelled), len(labelled)

    def write(self, out, stream):
        """To `out` by its extension (.json, .npy, else CSV), or CSV on `stream` when out is None or "-"."""
        if out is None or out == "-":
            self._write_csv(stream)
            return
        lower = out.lower()
        try:
            if lower.endswith(".npy"):
                np.save(out, np.stack(self.scores))
            elif lower.endswith(".json"):
                with open(out, "w", encoding="utf-8") as f:
                    json.dump(self._json(), f, indent=1)
                    f.write("\n")
            else:
                with open(out, "w", encoding="utf-8", newline="") as f:
                    self._write_csv(f)
        except OSError as exc:
            raise ClassifyError("%s: cannot write the results: %s" % (out, exc.strerror)) from None

    def _write_csv(self, f):
        writer = csv.writer(f, lineterminator="\n")
        header = ["image", "label"]
        for rank in range(1, min(self.k, len(self.scores[0]) if self.scores else self.k) + 1):
            header += ["class_%d" % rank] + (["name_%d" % rank] if self.names else []) + ["probability_%d" % rank]
        writer.writerow(header)
        for name, label, top in self.rows:
            row = [name, "" if label is None else label]
            for cls, cls_name, prob in top:
                row += [cls] + ([cls_name] if self.names else []) + [_number(prob)]
            writer.writerow(row)

    def _json(self):
        accuracy, labelled = self.accuracy()
        images = []
        for name, label, top in self.rows:
            entry = {"image": name, "label": label, "top_k": []}
            for cls, cls_name, prob in top:
                best = {"class": cls, "probability": float(_number(prob))}
                if self.names:
                    best["name"] = cls_name
                entry["top_k"].append(best)
            images.append(entry)
        return {"images": images, "top1_accuracy": accuracy, "labelled_images": labelled}


def classify(classifier, items, color=True, oversample=False, k=5, names=None, stream=None):
    """Classify every item; returns Results (progress on `stream`, default stderr)."""
    classes = int(np.prod(classifier.blobs[classifier.outputs[0]].data.shape[1:]))
    if names is not None and len(names) != classes:
        raise ClassifyError("the label names give %d classes but the net's output '%s' has %d"
                            % (len(names), classifier.outputs[0], classes))
    results = Results(min(k, classes), names)
    progress = Progress("classify", len(items), stream)
    try:
        for item, scores in predict(classifier, items, color, oversample, progress):
            results.add(item, scores)
    finally:
        progress.close()
    return results
