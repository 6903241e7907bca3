"""The wire's checks without a server: each queue's schema, the job spec's fields, the Python layers' allow-list,
and URLs that never show a password."""
import json
import math

import pytest

from pycaffe_dist.distributed import job as jobs
from pycaffe_dist.distributed import wire
from pycaffe_dist.distributed.data_parallel.keys import SPEC as DATA_PARALLEL
from pycaffe_dist.distributed.launch import without_password
from pycaffe_dist.distributed.redis_client import describe
from pycaffe_dist.distributed.sandblaster.keys import SPEC as SANDBLASTER
from pycaffe_dist.errors import StoreError
from pycaffe_dist.proto import caffe_pb2


def test_a_checked_message_keeps_only_its_known_fields_of_their_types():
    message = {"type": "result", "worker": 3, "round": 7, "epoch": 2, "loss": float("nan"), "images": 64,
               "compute_s": 0.5, "injected": {"x": 1}}
    checked = wire.INBOX.check(message, "q")
    assert checked == {"type": "result", "worker": "3", "round": 7, "epoch": 2, "loss": checked["loss"],
                       "images": 64, "compute_s": 0.5}
    assert math.isnan(checked["loss"])                      # a loss gone NaN is news for the NaN guard


@pytest.mark.parametrize("message, expected", [
    ([], "q: [] is not a JSON object"),
    ({"type": "hello"}, "q: a message whose type is 'hello', where a data-parallel master's inbox expects one of"),
    ({"type": "result", "worker": "0", "round": 1}, "q: a result message without its field 'epoch'"),
    ({"type": "result", "worker": "0", "round": True, "epoch": 1}, "'round' is True, where a non-negative integer"),
    ({"type": "result", "worker": "0", "round": -1, "epoch": 1}, "'round' is -1, where a non-negative integer"),
    ({"type": "result", "worker": "0", "round": 1, "epoch": 1, "compute_s": math.inf}, "where a finite number"),
    ({"type": "join", "worker": "1e3"}, "'worker' is '1e3', where a worker id"),
    ({"type": "join", "worker": 10 ** 9}, "where a worker id"),
    ({"type": "join", "worker": "0", "host": ["a"]}, "'host' is ['a'], where a string"),
    ({"type": "leave", "worker": "0", "damaged": "yes"}, "'damaged' is 'yes', where true or false"),
])
def test_a_message_that_fails_its_schema_is_named_with_what_was_expected(message, expected):
    with pytest.raises(wire.BadMessage) as caught:
        wire.INBOX.check(message, "q")
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_long_text_is_cut_and_long_values_are_shown_short():
    checked = wire.INBOX.check({"type": "join", "worker": "0", "host": "h" * 10000}, "q")
    assert len(checked["host"]) == wire.TEXT_LIMIT
    with pytest.raises(wire.BadMessage) as caught:
        wire.INBOX.check({"type": "join", "worker": "x" * 100000}, "q")
    assert len(str(caught.value)) < 300


def test_every_schema_names_kinds_that_exist():
    for name in ("INBOX", "REPLY", "CONTROL", "SANDBLASTER_INBOX", "UNIT", "PIPELINE_INBOX", "FLOW", "MEMBER"):
        schema = getattr(wire, name)
        for kind, fields in schema.kinds.items():
            required = {f: (v if not isinstance(v, float) else 1.0) for f, (c, r) in fields.items() if r
                        for v in [_valid(c)]}
            assert schema.check(dict(required, **{schema.tag: kind}), "q")[schema.tag] == kind


def _valid(check):
    for value in ("0", 0, 1, 1.0, "x", [], [0], True):
        try:
            check(value)
            return value
        except ValueError:
            pass
    raise AssertionError("no value passes %r" % check)


def _spec(**fields):
    param = caffe_pb2.SolverParameter(base_lr=0.01, max_iter=10)
    layer = param.net_param.layer.add(name="ip", type="InnerProduct")
    layer.bottom.append("data")
    layer.top.append("ip")
    spec = jobs.make_spec(param, "async", {}, ["ip/0"], [(2, 3)], 5.0, 2)
    return dict(json.loads(json.dumps(spec)), **fields)


def _kind(fields):
    """The SpecKind of the reader that checks a spec: Sandblaster's for a Sandblaster spec, else data-parallel's."""
    return SANDBLASTER if fields.get("kind") == "sandblaster" else DATA_PARALLEL


def test_a_good_spec_passes_with_its_options_resolved():
    spec = jobs.check_spec(_spec(), "pcd:j:job", (), DATA_PARALLEL)
    assert spec["options"]["tau"] == 1 and spec["heartbeat_s"] == 5.0 and spec["blobs"][0]["shape"] == [2, 3]


@pytest.mark.parametrize("fields, expected", [
    ({"version": 2}, "not a job spec of this version (version 2, where 1 was expected)"),
    ({"heartbeat_s": -1}, "'heartbeat_s' is -1, where a number from 0.01 to 3600"),
    ({"workers": "2"}, "'workers' is '2', where an integer from 1"),
    ({"blobs": [{"name": "a", "shape": [2, -3]}]}, "the job spec's 'blobs'"),
    ({"mode": "fastest"}, "the job spec's mode and options are not this project's: unknown mode 'fastest'"),
    ({"options": {"tau": "many"}}, "the job spec's mode and options are not this project's"),
    ({"kind": "mapreduce"}, "the job spec's kind is 'mapreduce'"),
    ({"solver": "max_iter: -"}, "the job spec's solver does not parse"),
    ({"kind": "sandblaster", "seed": 1, "start": 0, "state": "", "net": "layer {", "feed": ""},
     "the job spec's net does not parse"),
])
def test_a_damaged_spec_is_one_line_naming_the_key_and_the_field(fields, expected):
    with pytest.raises(wire.DamagedData) as caught:
        jobs.check_spec(_spec(**fields), "pcd:j:job", (), _kind(fields))
    assert str(caught.value).startswith("pcd:j:job: ") and expected in str(caught.value), str(caught.value)


def test_a_python_layer_in_a_spec_needs_the_allow_list_and_a_display_imports_nothing():
    spec = _spec()
    spec["solver"] = spec["solver"].replace('type: "InnerProduct"', 'type: "Python" python_param { module: "os" '
                                            'layer: "L" }')
    with pytest.raises(StoreError, match="a Python layer 'ip' of module 'os'.*--python-layers os"):
        jobs.check_spec(spec, "pcd:j:job", ())
    with pytest.raises(StoreError, match="module 'os'"):
        jobs.check_spec(spec, "pcd:j:job", ["sys"])
    assert jobs.check_spec(spec, "pcd:j:job", ["os"])["mode"] == "async"
    assert jobs.check_spec(spec, "pcd:j:job", None)["mode"] == "async"     # status: nothing is built


@pytest.mark.parametrize("url, shown", [
    ("redis://:s3cret@10.0.0.1:6380/0", "redis://10.0.0.1:6380"),
    ("rediss://user:s3cret@host", "rediss://host:6379"),
    ("redis://:s3cret@a:1,redis://:s3cret@b:2", "redis://a:1,redis://b:2"),
    ("unix://:s3cret@/tmp/redis.sock", "unix:///tmp/redis.sock"),
    ("redis://:s3cret@host:notaport", "<a malformed URL>"),
])
def test_a_url_in_a_message_never_shows_its_password(url, shown):
    assert describe(url) == shown


def test_a_launcher_hands_the_password_of_the_users_urls_over_in_the_environment():
    assert without_password("redis://:p%40ss@a:1,redis://:p%40ss@b:2") == ("redis://a:1,redis://b:2", "p@ss")
    assert without_password("redis://a:1") == ("redis://a:1", None)
    assert without_password("redis://:x@a:1,redis://:y@b:2") == ("redis://:x@a:1,redis://:y@b:2", None)
