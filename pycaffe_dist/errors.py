"""The project's exception types. The CLI turns any of them into one readable line and a non-zero exit code.

Each is also the built-in type that Caffe's pycaffe raises for the same fault, so that a script's `except
ValueError` (or IOError, ...) catches ours as it caught Caffe's: bad content is a ValueError, a file that is not
there a FileNotFoundError (pycaffe's "Cannot open file" is an IOError), a device or a store that fails a
RuntimeError, and NaN in training a FloatingPointError."""


class PycaffeDistError(Exception):
    """Base of every error we raise on purpose (bad input, bad config), as opposed to bugs."""

    # Our message, even where a built-in base has its own (OSError's would read "[Errno None] None: ...").
    __str__ = Exception.__str__


class PrototxtError(PycaffeDistError, ValueError):
    """A text prototxt that does not parse: carries file, line, column and the offending token."""

    def __init__(self, message, filename=None, line=None, column=None, token=None):
        self.filename, self.line, self.column, self.token = filename, line, column, token
        where = filename or "<string>"
        if line is not None:
            where += ":%d" % line + (":%d" % column if column is not None else "")
        near = " (at %r)" % token if token else ""
        super().__init__("%s: %s%s" % (where, message, near))


class PrototxtNotFound(PrototxtError, FileNotFoundError):
    """A prototxt that is not there."""


class ModelFileError(PycaffeDistError, ValueError):
    """A binary proto file (.caffemodel, .binaryproto, .solverstate) that is missing, truncated or not a proto."""


class ModelFileNotFound(ModelFileError, FileNotFoundError):
    """A binary proto or HDF5 file that is not there."""


class UpgradeError(PycaffeDistError, ValueError):
    """An old-format net or solver that Caffe's upgrade rules cannot convert."""


class NetError(PycaffeDistError, ValueError):
    """A net that cannot be built: bad graph, bad layer parameters, shape mismatches."""


class SolverError(PycaffeDistError, ValueError):
    """A solver configuration Caffe would reject."""


class DataError(PycaffeDistError, ValueError):
    """A data source that cannot be read: missing database, bad record."""


class StoreError(PycaffeDistError, RuntimeError):
    """The Redis store is unreachable or holds something unexpected."""


class DeviceError(PycaffeDistError, RuntimeError):
    """No usable GPU (no driver, no pycuda, no built kernels, a bad device id), or a device call that failed."""


class DivergedError(PycaffeDistError, FloatingPointError):
    """Training brought NaN or Inf: a distributed job refuses the merge and stops with the last finite weights."""


class ExportError(PycaffeDistError):
    """A net that cannot be written in another format (ONNX): a layer with no equivalent there, a bad option."""
