"""What the one-machine launcher hands a master process (`dist_caffe master`, `pipeline-master`,
`sandblaster-master`): a dataclass of its settings as JSON. Read back field by field (an unknown field is an error,
not ignored), never unpickled. The fields every master has are here; each master's Settings adds its own."""
import dataclasses
import json
import sys

from ..errors import PycaffeDistError


@dataclasses.dataclass
class JsonSettings:
    """The settings every master has, with to_json(), from_json(text) and read(where). `SOURCE` names them in
    errors."""
    SOURCE = "settings"
    redis: str = "redis://127.0.0.1:6379"
    solver: str = None
    job: str = None
    snapshot: str = None
    weights: str = None
    threads: int = 1
    heartbeat_s: float = 5.0
    join_timeout_s: float = 300.0
    keep: bool = False
    max_iter: int = None
    stats_path: str = None
    retry_s: float = 30.0
    log: str = None

    def to_json(self):
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text, source=None):
        source = source or cls.SOURCE
        try:
            values = json.loads(text)
        except ValueError as exc:
            raise PycaffeDistError("%s: not JSON: %s" % (source, exc)) from None
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(values, dict) or set(values) - names:
            raise PycaffeDistError("%s: expected a JSON object of %s" % (source, ", ".join(sorted(names))))
        return cls(**values)

    @classmethod
    def read(cls, where):
        """From the file `where`, or standard input for '-' (a master's --settings)."""
        if where == "-":
            return cls.from_json(sys.stdin.read(), "%s on stdin" % cls.SOURCE)
        try:
            with open(where) as f:
                text = f.read()
        except OSError as exc:
            raise PycaffeDistError("%s: cannot read: %s" % (where, exc.strerror)) from None
        return cls.from_json(text, "%s %s" % (cls.SOURCE, where))
