"""Text prototxt I/O. Parse errors become PrototxtError with file, line, column and the offending token."""
import pathlib
import re

from google.protobuf import text_format

from ..errors import PrototxtError, PrototxtNotFound

_LOCATION = re.compile(r"^(\d+):(\d+) : (.*)$", re.S)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|[\w.+-]+|\S')


def _token_at(text, line, column):
    """The token that starts at (1-based) line/column of text, for error messages."""
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return None
    rest = lines[line - 1][max(column - 1, 0):]
    m = _TOKEN.search(rest)
    return m.group(0) if m else None


def _only_space_after(text, line, column, token):
    lines = text.splitlines()
    rest = "\n".join([lines[line - 1][column - 1:]] + lines[line:])
    return not rest.lstrip()[len(token):].strip()


def parse_text(text, message, filename=None):
    """Merge prototxt `text` into the protobuf `message` (cleared first) and return it."""
    message.Clear()
    try:
        text_format.Parse(text, message, allow_unknown_extension=False)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        detail = str(exc)
        m = _LOCATION.match(detail)
        if m:
            detail = m.group(3)
        token = _token_at(text, line, column) if line else None
        if token is not None and _only_space_after(text, line, column, token):
            detail, token = "unexpected end of file: " + detail, None   # e.g. a missing closing brace
        raise PrototxtError(detail, filename, line, column, token) from None
    return message


def read_text(path, message):
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PrototxtNotFound("no such file", str(path)) from None
    except UnicodeDecodeError as exc:
        raise PrototxtError("not a UTF-8 text file (byte %d); is it a binary proto?" % exc.start, str(path)) from None
    except OSError as exc:
        raise PrototxtError("cannot read: %s" % exc.strerror, str(path)) from None
    except ValueError as exc:      # a name with a NUL byte
        raise PrototxtError("cannot read: %s" % exc, repr(str(path))) from None
    return parse_text(text, message, str(path))


def to_text(message):
    return text_format.MessageToString(message)


def write_text(path, message):
    pathlib.Path(path).write_text(to_text(message))
