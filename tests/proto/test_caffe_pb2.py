"""caffe.proto and caffe_pb2 against Caffe's field table (tests/fixtures/reference/caffe_proto_fields.md)."""
import importlib.util

import pytest
from google.protobuf.descriptor import FieldDescriptor

from pycaffe_dist.proto import caffe_pb2
from tests.conftest import FIXTURES, REPO

TABLE = FIXTURES / "reference" / "caffe_proto_fields.md"
spec = importlib.util.spec_from_file_location("gen_caffe_proto", REPO / "tools" / "gen_caffe_proto.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

MESSAGES, ENUMS = gen.parse_table(TABLE.read_text())
TYPE_NAMES = {v: k[5:].lower() for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}


def label(field):
    # protobuf 7 dropped FieldDescriptor.label; is_repeated / is_required say the same.
    return "repeated" if field.is_repeated else "required" if field.is_required else "optional"


def test_table_is_complete():
    # Caffe's caffe.proto has 63 messages; the V0/V1 legacy layer messages must be among them.
    assert len(MESSAGES) == 63
    assert {"V0LayerParameter", "V1LayerParameter", "SolverState", "Datum"} <= set(MESSAGES)


def test_committed_proto_is_generated_from_table():
    committed = (REPO / "pycaffe_dist" / "proto" / "caffe.proto").read_text()
    assert committed == gen.render(MESSAGES, ENUMS), "caffe.proto is stale: run python tools/gen_caffe_proto.py"


@pytest.mark.parametrize("message", sorted(MESSAGES))
def test_message_fields(message):
    desc = caffe_pb2.DESCRIPTOR.message_types_by_name[message]
    assert sorted(f.number for f in desc.fields) == sorted(f["number"] for f in MESSAGES[message])
    for row in MESSAGES[message]:
        field = desc.fields_by_number[row["number"]]
        assert field.name == row["name"]
        assert label(field) == row["label"], row
        if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_ENUM):
            assert (field.message_type or field.enum_type).name == row["type"].split(".")[-1]
        else:
            assert TYPE_NAMES[field.type] == row["type"]
        default = [o.split("=", 1)[1].strip() for o in row["opts"].split(";") if o.strip().startswith("default")]
        if default:
            assert field.has_default_value, row
            want = default[0].strip("'\"")
            got = field.default_value
            if field.type == FieldDescriptor.TYPE_ENUM:
                assert field.enum_type.values_by_number[got].name == want
            elif field.type == FieldDescriptor.TYPE_BOOL:
                assert got == (want == "true")
            elif field.type == FieldDescriptor.TYPE_STRING:
                assert got == want
            else:
                assert float(got) == pytest.approx(float(want), rel=1e-6)
        else:
            assert not field.has_default_value, row
        if "packed = true" in row["opts"]:
            assert field.is_packed


def test_enums():
    for (owner, name), values in ENUMS.items():
        desc = (caffe_pb2.DESCRIPTOR.enum_types_by_name[name] if owner is None
                else caffe_pb2.DESCRIPTOR.message_types_by_name[owner].enum_types_by_name[name])
        got = [(v.name, v.number) for v in desc.values]
        extra = gen.EXTRA_ENUM_VALUES.get((owner, name), [])
        assert got == values + extra


def test_datumfile_backend():
    assert caffe_pb2.DataParameter.DATUMFILE == 2
    assert caffe_pb2.DataParameter.DB.Name(2) == "DATUMFILE"


def test_defaults_that_caffe_relies_on():
    solver = caffe_pb2.SolverParameter()
    assert (solver.type, solver.delta, solver.momentum2, solver.rms_decay, solver.clip_gradients) == \
        ("SGD", pytest.approx(1e-8), pytest.approx(0.999), pytest.approx(0.99), -1)
    assert not solver.HasField("lr_policy") and solver.solver_mode == caffe_pb2.SolverParameter.GPU
    assert caffe_pb2.NetState().phase == caffe_pb2.TEST
    assert caffe_pb2.FillerParameter().type == "constant"
    assert caffe_pb2.LossParameter().normalization == caffe_pb2.LossParameter.VALID
    assert caffe_pb2.PoolingParameter().round_mode == caffe_pb2.PoolingParameter.CEIL
