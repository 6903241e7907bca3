"""What the verb modules of the command line share: exit codes and argument types."""
import argparse

EXIT_ERROR, EXIT_INTERRUPTED, EXIT_INTERNAL = 1, 130, 70


def phase(value):
    """--phase TRAIN or TEST, as caffe_pb2's enum."""
    from ..proto import caffe_pb2
    try:
        return {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST}[value.upper()]
    except KeyError:
        raise argparse.ArgumentTypeError("phase must be TRAIN or TEST, not %r" % value) from None


def add_net_state(parser, what="NetState"):
    """--level and --stage (repeatable): the NetState a net is built for."""
    parser.add_argument("--level", type=int, default=0, help="%s level" % what)
    parser.add_argument("--stage", action="append", default=[], help="a %s stage (repeatable)" % what)
