"""The verbs that run trained nets over data: classify (Caffe's python/classify.py, with labels, top-k and
CSV/JSON output) and extract-features (Caffe's tools/extract_features)."""
import sys

from ..errors import PycaffeDistError
from . import arguments


def _positive(flag, value):
    if value is not None and value < 1:
        raise PycaffeDistError("%s must be at least 1, got %d" % (flag, value))


def cmd_classify(args):
    from .. import common
    from ..backend import select
    from ..classifier import Classifier
    from ..inference import classify
    for flag, value in (("--top-k", args.top_k), ("--batch-size", args.batch_size)):
        _positive(flag, value)
    if args.threads:
        common.set_num_threads(args.threads)
    select.choose(args.gpu)
    dims = classify.image_dims(args.images_dim) if args.images_dim else None
    clf = Classifier(args.model, args.weights, image_dims=dims, raw_scale=args.raw_scale or None,
                     input_scale=args.input_scale)
    in_ = clf.inputs[0]
    if args.batch_size:
        clf.blobs[in_].reshape(args.batch_size, *clf.blobs[in_].data.shape[1:])
        clf.reshape()
    shape = clf.blobs[in_].data.shape
    channels = shape[1]
    swap = classify.channel_swap(args.channel_swap, channels)
    if swap is not None:
        clf.transformer.set_channel_swap(in_, swap)
    if args.mean:
        clf.transformer.set_mean(in_, classify.load_mean(args.mean, shape))
    elif args.mean_values:
        clf.transformer.set_mean(in_, classify.mean_values(args.mean_values, channels))
    extensions = tuple("." + e.lstrip(".").lower() for e in args.ext.split(",")) if args.ext else \
        classify.IMAGE_EXTENSIONS
    items = classify.collect_inputs(args.inputs, root=args.root, extensions=extensions)
    names = classify.read_labels(args.labels) if args.labels else None
    results = classify.classify(clf, items, color=not args.gray and channels != 1, oversample=args.oversample,
                                k=args.top_k, names=names)
    results.write(args.output, sys.stdout)
    accuracy, labelled = results.accuracy()
    if accuracy is not None:
        print("top-1 accuracy %.4f over %d labelled images" % (accuracy, labelled), file=sys.stderr)
    if args.output not in (None, "-"):
        print("wrote %s" % args.output, file=sys.stderr)
    return 0


def cmd_extract_features(args):
    from .. import common
    from ..backend import select
    from ..inference import features
    from ..pycaffe import TEST, Net
    if args.threads:
        common.set_num_threads(args.threads)
    select.choose(args.gpu)
    blob_names = args.blobs.split(",")
    outputs = features.output_paths(blob_names, args.output, args.format)
    net = Net(args.model, TEST, weights=args.weights, level=args.level, stages=args.stage)
    features.check_blobs(net, blob_names, args.model)
    counts = features.extract_features(net, blob_names, args.batches, outputs, args.format, args.overwrite)
    for name in blob_names:
        print("extracted %d images' '%s' into %s" % (counts[name], name, outputs[name]), file=sys.stderr)
    return 0


def add_verbs(verbs):
    p = verbs.add_parser("classify", help="classify images with a trained deploy net: top-k labels and "
                         "probabilities per image (Caffe's classify.py)")
    p.add_argument("inputs", nargs="+", help="image files, directories of images, .npy arrays (N x H x W [x K]) "
                   "or list files (an image path per line, optionally with its integer label)")
    p.add_argument("--model", required=True, help="deploy prototxt (its first input takes the images)")
    p.add_argument("--weights", required=True, help=".caffemodel (or .caffemodel.h5)")
    p.add_argument("-o", "--output", help="results file: .csv (default, on stdout without -o), .json, or .npy "
                   "(every score, N x classes, as Caffe's classify.py saves)")
    p.add_argument("--labels", help="class names, one a line (e.g. synset_words.txt)")
    p.add_argument("--top-k", type=int, default=5, help="classes to report per image (default 5)")
    mean = p.add_mutually_exclusive_group()
    mean.add_argument("--mean", help="mean image to subtract: .binaryproto (compute-mean's) or .npy; centre-cropped "
                      "to the input size")
    mean.add_argument("--mean-values", help="mean per channel in the net's channel order, e.g. 104,117,123")
    p.add_argument("--raw-scale", type=float, default=255.0,
                   help="multiply the [0, 1] image by this first (default 255, Caffe's; 0 for none)")
    p.add_argument("--input-scale", type=float, help="multiply by this after subtracting the mean (LeNet: "
                   "0.00390625, its data layer's scale)")
    p.add_argument("--channel-swap", default="auto", help="channel order, e.g. 2,1,0 (RGB images to a BGR net); "
                   "auto (default): 2,1,0 for a 3-channel input, none otherwise; none: keep RGB")
    p.add_argument("--gray", action="store_true", help="load images in grey, one channel (implied for a "
                   "1-channel input, e.g. LeNet)")
    p.add_argument("--images-dim", help="resize images to 'height,width' before cropping (default: the input size)")
    crops = p.add_mutually_exclusive_group()
    crops.add_argument("--center-only", dest="oversample", action="store_false",
                       help="classify the centre crop (default)")
    crops.add_argument("--oversample", dest="oversample", action="store_true",
                       help="average over 10 crops: corners, centre and their mirrors")
    p.add_argument("--batch-size", type=int, help="images per forward pass (default: the net's input batch)")
    p.add_argument("--root", help="folder that list files' paths are relative to (default: the list's folder)")
    p.add_argument("--ext", help="image extensions to take from a directory, comma-separated (default: all "
                   "common image formats)")
    p.add_argument("--threads", type=int, help="CPU threads (BLAS and kernels); default: all cores")
    p.add_argument("--gpu", help="classify on this GPU id (default: the CPU)")
    p.set_defaults(func=cmd_classify, oversample=False)

    p = verbs.add_parser("extract-features", help="write the values of named blobs for every image a net's data "
                         "layers read (Caffe's extract_features)")
    p.add_argument("--model", required=True, help="net prototxt with its data layers (built in the TEST phase)")
    p.add_argument("--weights", required=True, help=".caffemodel (or .caffemodel.h5)")
    p.add_argument("--blobs", required=True, help="blob names, comma-separated, e.g. fc7,prob")
    p.add_argument("--batches", type=int, required=True, help="forward passes (mini-batches) to run")
    p.add_argument("--output", required=True, help="one output per blob, comma-separated, or an existing directory "
                   "(one output per blob in it, named after the blob); hdf5: one file may hold every blob")
    p.add_argument("--format", default="lmdb", choices=("lmdb", "leveldb", "datumfile", "hdf5", "npy"),
                   help="lmdb (default) / leveldb / datumfile: a Datum of float_data per image, keys %%010d, as "
                   "Caffe's; hdf5: a dataset per blob; npy: an array per blob")
    p.add_argument("--overwrite", action="store_true", help="replace outputs that exist")
    arguments.add_net_state(p)
    p.add_argument("--threads", type=int, help="CPU threads (BLAS and kernels); default: all cores")
    p.add_argument("--gpu", help="run on this GPU id (default: the CPU)")
    p.set_defaults(func=cmd_extract_features)
