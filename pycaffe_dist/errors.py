"""The project's exception types. The CLI turns any of them into one readable line and a non-zero exit code."""


class PycaffeDistError(Exception):
    """Base of every error we raise on purpose (bad input, bad config), as opposed to bugs."""


class PrototxtError(PycaffeDistError):
    """A text prototxt that does not parse: carries file, line, column and the offending token."""

    def __init__(self, message, filename=None, line=None, column=None, token=None):
        self.filename, self.line, self.column, self.token = filename, line, column, token
        where = filename or "<string>"
        if line is not None:
            where += ":%d" % line + (":%d" % column if column is not None else "")
        near = " (at %r)" % token if token else ""
        super().__init__("%s: %s%s" % (where, message, near))


class ModelFileError(PycaffeDistError):
    """A binary proto file (.caffemodel, .binaryproto, .solverstate) that is missing, truncated or not a proto."""


class UpgradeError(PycaffeDistError):
    """An old-format net or solver that Caffe's upgrade rules cannot convert."""


class NetError(PycaffeDistError):
    """A net that cannot be built: bad graph, bad layer parameters, shape mismatches."""


class SolverError(PycaffeDistError):
    """A solver configuration Caffe would reject."""


class DataError(PycaffeDistError):
    """A data source that cannot be read: missing database, bad record."""


class StoreError(PycaffeDistError):
    """The Redis store is unreachable or holds something unexpected."""


class DeviceError(PycaffeDistError):
    """No usable GPU (no driver, no pycuda, no built kernels, a bad device id), or a device call that failed."""


class DivergedError(PycaffeDistError):
    """Training brought NaN or Inf: a distributed job refuses the merge and stops with the last finite weights."""
