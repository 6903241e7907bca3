"""Reading nets and solvers as Caffe does: parse, then upgrade old formats on the fly with a one-line notice
(Caffe's ReadNetParamsFromTextFileOrDie / ReadNetParamsFromBinaryFileOrDie / ReadSolverParamsFromTextFileOrDie).
"""
import logging

from ..errors import UpgradeError
from ..proto import caffe_pb2
from ..proto.binary import read_binary
from . import upgrade
from .prototxt import read_text

log = logging.getLogger("pycaffe_dist")


def describe_net_upgrade(net):
    """Names of the upgrade steps a NetParameter needs, in Caffe's order (empty: already current)."""
    steps = [("V0 layers", upgrade.net_needs_v0_to_v1_upgrade), ("data-layer transform fields",
             upgrade.net_needs_data_upgrade), ("V1 layers", upgrade.net_needs_v1_to_v2_upgrade),
             ("input fields", upgrade.net_needs_input_upgrade), ("BatchNorm param specs",
             upgrade.net_needs_batchnorm_upgrade)]
    return [name for name, needs in steps if needs(net)]


def upgrade_net_with_notice(net, source):
    """Upgrade `net` in place if it needs it, logging one line that says what was upgraded."""
    steps = describe_net_upgrade(net)
    if not steps:
        return net
    try:
        ok, messages = upgrade.upgrade_net(net, source)
    except UpgradeError as exc:
        raise UpgradeError("%s: cannot be upgraded from %s: %s" % (source, ", ".join(steps), exc)) from None
    for line in messages:
        log.debug("%s", line)
    if not ok:
        problems = [m for m in messages if m.startswith(("E ", "Unknown", "Upgrade of"))] or messages
        raise UpgradeError("%s: could not be fully upgraded from %s: %s" % (source, ", ".join(steps),
                                                                             "; ".join(problems[-3:])))
    log.warning("%s: upgraded on load (%s are deprecated); `dist_caffe upgrade` rewrites the file",
                source, ", ".join(steps))
    return net


def read_net(path):
    """A net from a text prototxt or a binary .caffemodel (by content), upgraded to the current format."""
    path = str(path)
    net = caffe_pb2.NetParameter()
    if path.endswith((".caffemodel", ".binaryproto", ".pb")):
        read_binary(path, net)
    else:
        read_text(path, net)
    return upgrade_net_with_notice(net, path)


def read_net_binary(path):
    """A .caffemodel as a NetParameter, upgraded from V0/V1 as Caffe does on load (ReadNetParamsFromBinaryFile)."""
    net = read_binary(path, caffe_pb2.NetParameter())
    return upgrade_net_with_notice(net, str(path))


def read_solver(path):
    """A solver prototxt: solver_type enum upgraded, nested nets upgraded, snapshot_prefix defaulted."""
    path = str(path)
    solver = read_text(path, caffe_pb2.SolverParameter())
    before = solver.SerializeToString()
    try:
        ok, messages = upgrade.upgrade_solver(solver, source=path, nested_nets=True)
    except UpgradeError as exc:
        raise UpgradeError("%s: cannot be upgraded: %s" % (path, exc)) from None
    if not ok:
        raise UpgradeError("%s: could not be fully upgraded: %s" % (path, "; ".join(messages[-3:])))
    if solver.SerializeToString() != before:
        log.warning("%s: upgraded on load (legacy solver_type or old nested nets); `dist_caffe upgrade --solver` "
                    "rewrites the file", path)
    upgrade.default_snapshot_prefix(solver, path)
    return solver
