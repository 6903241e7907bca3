"""What the one-machine launcher hands a master process (`dist_caffe master`, `pipeline-master`,
`sandblaster-master`): a dataclass of its settings as JSON. Read back field by field (an unknown field is an error,
not ignored), never unpickled."""
import dataclasses
import json

from ..errors import PycaffeDistError


class JsonSettings:
    """Mixin for a dataclass of settings: to_json() and from_json(text). `SOURCE` names them in errors."""
    SOURCE = "settings"

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
