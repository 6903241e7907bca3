"""`dist_caffe`: the command line, one module per group of verbs: training.py (train, test, time, plot: Caffe's
`caffe` tool), distributed.py (train --workers, master, worker, status), pipeline.py (train --pipeline,
pipeline-master, stage), sandblaster.py (train --mode sandblaster, sandblaster-master, sandblaster-worker),
allreduce.py (train --mode allreduce, allreduce-master), tools.py (net-info, draw, upgrade, device-query),
inference.py (classify, extract-features), export.py (export-onnx), data.py (convert-idx, convert-imageset,
convert-db, compute-mean). Every verb's errors reach the user as one line and a non-zero exit code."""
import argparse
import logging
import sys

from .. import __version__
from ..errors import PycaffeDistError
from . import allreduce, arguments, data, distributed, export, inference, pipeline, sandblaster, tools, training


def build_parser():
    parser = argparse.ArgumentParser(prog="dist_caffe", description="Caffe-compatible training, on one machine or "
                                     "many (a Redis parameter server).")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and notices at INFO level")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks of internal errors")
    parser.add_argument("--version", action="version", version="dist_caffe (pycaffe-dist) %s" % __version__)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    for group in (training, distributed, allreduce, pipeline, sandblaster, tools, inference, export, data):
        group.add_verbs(verbs)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="dist_caffe: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except PycaffeDistError as exc:
        print("dist_caffe: error: %s" % exc, file=sys.stderr)
        return arguments.EXIT_ERROR
    except KeyboardInterrupt:
        print("dist_caffe: interrupted", file=sys.stderr)
        return arguments.EXIT_INTERRUPTED
    except Exception as exc:   # a bug of ours: still one line, unless --debug asks for the traceback
        if args.debug:
            raise
        print("dist_caffe: internal error: %s: %s (rerun with --debug for the traceback)"
              % (type(exc).__name__, exc), file=sys.stderr)
        return arguments.EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
