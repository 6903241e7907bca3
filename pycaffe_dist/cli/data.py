"""The data verbs of `dist_caffe`: Caffe's convert_mnist_data, convert_imageset, compute_image_mean, and a
db-to-db copy (the work is data/convert.py's). Each handler returns 0 and raises DataError on bad input, which the
CLI prints as one line."""
from ..data import convert

BACKENDS = ("lmdb", "leveldb", "datumfile")


def _backend(parser, flag="--backend", help_text="output store (default lmdb, as Caffe's tools)"):
    parser.add_argument(flag, choices=BACKENDS, default="lmdb", help=help_text)


def cmd_convert_idx(args):
    convert.convert_idx(args.images, args.labels, args.out, args.backend, overwrite=args.overwrite)
    return 0


def cmd_convert_imageset(args):
    convert.convert_imageset(args.root, args.listfile, args.out, args.backend, args.resize_height, args.resize_width,
                             args.gray, args.shuffle, args.encoded, args.seed, overwrite=args.overwrite)
    return 0


def cmd_convert_db(args):
    convert.convert_db(args.src, args.backend_in, args.dst, args.backend, overwrite=args.overwrite)
    return 0


def cmd_compute_mean(args):
    mean = convert.compute_mean(args.src, args.backend, args.out)
    for channel, value in enumerate(mean.reshape(mean.shape[1], -1).mean(axis=1)):
        print("mean_value channel [%d]: %g" % (channel, value))
    return 0


def add_verbs(verbs):
    """Register convert-idx, convert-imageset, convert-db and compute-mean on an argparse subparsers object."""
    p = verbs.add_parser("convert-idx", help="MNIST/Fashion-MNIST IDX files (gz or not) into a record store "
                         "(Caffe's convert_mnist_data)")
    p.add_argument("images", help="IDX images file (magic 2051)")
    p.add_argument("labels", help="IDX labels file (magic 2049)")
    p.add_argument("out", help="store to create")
    _backend(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing store of the same backend")
    p.set_defaults(func=cmd_convert_idx)

    p = verbs.add_parser("convert-imageset", help="a list of 'file label' lines into a record store "
                         "(Caffe's convert_imageset)")
    p.add_argument("root", help="folder the list's file names are relative to")
    p.add_argument("listfile", help="list file: one 'file label' per line")
    p.add_argument("out", help="store to create")
    _backend(p)
    p.add_argument("--resize_height", type=int, default=0, help="resize to this height (with --resize_width)")
    p.add_argument("--resize_width", type=int, default=0, help="resize to this width (with --resize_height)")
    p.add_argument("--gray", action="store_true", help="store grey images (one channel)")
    p.add_argument("--shuffle", action="store_true", help="shuffle the list first")
    p.add_argument("--seed", type=int, help="seed of the shuffle (default: a fresh random order)")
    p.add_argument("--encoded", action="store_true", help="store encoded images (the file's own bytes)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store of the same backend")
    p.set_defaults(func=cmd_convert_imageset)

    p = verbs.add_parser("convert-db", help="copy a record store into another backend")
    p.add_argument("src", help="store to read")
    p.add_argument("dst", help="store to create")
    _backend(p, "--backend-in", "backend of SRC (default lmdb)")
    _backend(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing store of the same backend")
    p.set_defaults(func=cmd_convert_db)

    p = verbs.add_parser("compute-mean", help="mean image of a record store into a .binaryproto "
                         "(Caffe's compute_image_mean)")
    p.add_argument("src", help="store to read")
    p.add_argument("out", help=".binaryproto to write")
    _backend(p, help_text="backend of SRC (default lmdb)")
    p.set_defaults(func=cmd_compute_mean)
