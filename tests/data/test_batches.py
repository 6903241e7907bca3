"""Batches from record stores: the C decoder of raw Datums (csrc/datum.pyx) against protobuf, and record_batches
falling back to protobuf, with its messages, wherever the decoder stops."""
import struct

import numpy as np
import pytest

from pycaffe_dist._kernels import datum as datum_kernel
from pycaffe_dist.data.batches import record_batches
from pycaffe_dist.data.sources import open_records, open_writer
from pycaffe_dist.data.transform import DataTransformer
from pycaffe_dist.errors import DataError
from pycaffe_dist.proto import caffe_pb2


def raw_datum(rng, shape=(3, 4, 5), label=None):
    d = caffe_pb2.Datum(channels=shape[0], height=shape[1], width=shape[2],
                        label=int(rng.integers(-2 ** 31, 2 ** 31)) if label is None else label)
    d.data = rng.integers(0, 256, int(np.prod(shape)), dtype=np.uint8).tobytes()
    return d


def varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def unknown_fields():
    """One unknown field (numbers above Datum's 7) of each wire type protobuf skips."""
    return (varint(9 << 3 | 0) + varint(300) + varint(10 << 3 | 2) + varint(3) + b"abc" +
            varint(11 << 3 | 5) + b"\x01\x02\x03\x04" + varint(12 << 3 | 1) + b"\x00" * 8)


def decode(values, shape):
    pixels = np.full((len(values), int(np.prod(shape))), 7, np.uint8)
    labels = np.full(len(values), -7, np.float32)
    return datum_kernel.decode_raw(values, pixels, labels, *shape), pixels, labels


def protobuf_reading(value):
    d = caffe_pb2.Datum()
    d.ParseFromString(value)
    return np.frombuffer(d.data, np.uint8), np.float32(d.label)


def test_decoder_reads_what_protobuf_reads():
    rng = np.random.default_rng(0)
    values = [raw_datum(rng).SerializeToString() for _ in range(5)]
    values.append(raw_datum(rng, label=0).SerializeToString())                   # label 0: not written at all
    values.append(unknown_fields() + raw_datum(rng).SerializeToString() + unknown_fields())
    # Concatenated messages merge: the last data and label win, as in protobuf.
    values.append(raw_datum(rng).SerializeToString() + raw_datum(rng).SerializeToString())
    done, pixels, labels = decode(values, (3, 4, 5))
    assert done == len(values)
    for i, value in enumerate(values):
        data, label = protobuf_reading(value)
        np.testing.assert_array_equal(pixels[i], data)
        assert labels[i] == label


@pytest.mark.parametrize("case", ["encoded", "float_data", "other shape", "short data", "truncated", "field 0",
                                  "group", "packed float_data", "no data"])
def test_decoder_stops_at_a_record_it_does_not_handle(case):
    rng = np.random.default_rng(1)
    d = raw_datum(rng)
    if case == "encoded":
        d.encoded = True
    elif case == "float_data":
        d.float_data.extend([1.0, 2.0])
    elif case == "other shape":
        d.height, d.width = 5, 4
    elif case == "short data":
        d.data = d.data[:-1]
    elif case == "no data":
        d.ClearField("data")
    bad = d.SerializeToString()
    if case == "truncated":
        bad = bad[:-3]
    elif case == "field 0":
        bad += varint(0) + varint(1)
    elif case == "group":
        bad += varint(13 << 3 | 3) + varint(13 << 3 | 4)
    elif case == "packed float_data":
        bad += varint(6 << 3 | 2) + varint(4) + struct.pack("<f", 1.5)
    good = raw_datum(rng).SerializeToString()
    done, pixels, labels = decode([good, good, bad, good], (3, 4, 5))
    assert done == 2
    np.testing.assert_array_equal(pixels[2], 7)     # nothing written from the record it stopped at
    assert labels[2] == -7


def test_decoder_refuses_arrays_that_do_not_fit():
    with pytest.raises(ValueError, match="do not fit"):
        datum_kernel.decode_raw([b""] * 3, np.empty((2, 60), np.uint8), np.empty(3, np.float32), 3, 4, 5)
    with pytest.raises(TypeError, match="record 0 is str"):
        datum_kernel.decode_raw(["x"], np.empty((1, 60), np.uint8), np.empty(1, np.float32), 3, 4, 5)


def batches_from(tmp_path, datums, batch_size, scale=1.0, phase=caffe_pb2.TRAIN, crop_size=0):
    path = tmp_path / ("records%d.datumfile" % len(list(tmp_path.iterdir())))
    with open_writer(path, "datumfile") as writer:
        for i, value in enumerate(datums):
            writer.put(b"%08d" % i, value if isinstance(value, bytes) else value.SerializeToString())
    source = open_records(path, "datumfile")
    transformer = DataTransformer(caffe_pb2.TransformationParameter(scale=scale, crop_size=crop_size), phase,
                                  "layer 'data'")
    return record_batches(source, batch_size, transformer, "layer 'data'")


def test_raw_batches_are_the_records_scaled(tmp_path):
    rng = np.random.default_rng(2)
    datums = [raw_datum(rng, label=i) for i in range(6)]
    make_batch = batches_from(tmp_path, datums, 4, scale=0.5)
    for first in (0, 4, 2):          # wraps around the 6 records
        data, labels = make_batch()
        expected = [datums[(first + i) % 6] for i in range(4)]
        np.testing.assert_array_equal(
            data, [np.frombuffer(d.data, np.uint8).reshape(3, 4, 5).astype(np.float32) * 0.5 for d in expected])
        np.testing.assert_array_equal(labels, [d.label for d in expected])
        assert data.dtype == np.float32 and labels.dtype == np.float32


def test_a_float_record_in_a_raw_batch_goes_through_protobuf(tmp_path):
    rng = np.random.default_rng(3)
    datums = [raw_datum(rng, label=i) for i in range(3)]
    floats = caffe_pb2.Datum(channels=3, height=4, width=5, label=9)
    floats.float_data.extend(np.arange(60, dtype=np.float32) / 7)
    data, labels = batches_from(tmp_path, datums[:2] + [floats] + datums[2:], 4)()
    np.testing.assert_array_equal(data[2], (np.arange(60, dtype=np.float32) / 7).reshape(3, 4, 5))
    np.testing.assert_array_equal(data[3], np.frombuffer(datums[2].data, np.uint8).reshape(3, 4, 5))
    np.testing.assert_array_equal(labels, [0, 1, 9, 2])


def test_bad_records_in_a_batch_are_named(tmp_path):
    rng = np.random.default_rng(4)
    other = raw_datum(rng, shape=(3, 5, 4))
    with pytest.raises(DataError, match=r"layer 'data': record b'00000001' has shape 3x5x4 but the batch started with 3x4x5"):
        batches_from(tmp_path, [raw_datum(rng), other], 2)()
    with pytest.raises(DataError, match=r"layer 'data': record b'00000001': record is not a Caffe Datum"):
        batches_from(tmp_path, [raw_datum(rng), b"\xff\xff\xff"], 2)()
    short = raw_datum(rng)
    short.data = short.data[:10]
    with pytest.raises(DataError, match=r"record b'00000000': Datum data holds 10 bytes but .* = 60"):
        batches_from(tmp_path, [short, raw_datum(rng)], 2)()


def test_records_of_different_sizes_are_cropped_one_by_one(tmp_path):
    # data_transformer.cpp checks and crops each Datum on its own: with crop_size a batch may mix sizes
    rng = np.random.default_rng(5)
    small, large = raw_datum(rng, shape=(3, 4, 5)), raw_datum(rng, shape=(3, 6, 7))
    data, _ = batches_from(tmp_path, [small, large], 2, phase=caffe_pb2.TEST, crop_size=3)()
    centre = [np.frombuffer(d.data, np.uint8).reshape(shape)[:, (shape[1] - 3) // 2:(shape[1] - 3) // 2 + 3,
                                                             (shape[2] - 3) // 2:(shape[2] - 3) // 2 + 3]
              for d, shape in ((small, (3, 4, 5)), (large, (3, 6, 7)))]
    np.testing.assert_array_equal(data, np.stack(centre).astype(np.float32))


# A 8x8 RGB PNG whose second IDAT chunk has a damaged type: Pillow's load() raised SyntaxError "broken PNG file"
BROKEN_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000080000000808020000004b6d29dc0000000a49444154789c6360606462666165c421d9"
    "750000001a4944005463e7e0e4e2e6e1e5e3171014121611151367185a12003b8508a1defd16dd0000000049454e44ae426082")


def test_records_of_other_channels_are_refused_even_with_a_crop(tmp_path):
    """np.concatenate raised ValueError (found by tests/fuzz); Caffe's DataTransformer CHECKs the channels."""
    rng = np.random.default_rng(7)
    with pytest.raises(DataError, match=r"layer 'data': record b'00000001' has shape 1x6x7 but the batch started "
                       r"with 3x4x5; all records need the same number of channels"):
        batches_from(tmp_path, [raw_datum(rng, shape=(3, 4, 5)), raw_datum(rng, shape=(1, 6, 7))], 2,
                     crop_size=3)()


def test_a_corrupt_png_in_a_datumfile_record_names_the_record(tmp_path):
    rng = np.random.default_rng(6)
    encoded = caffe_pb2.Datum(data=BROKEN_PNG, encoded=True, label=1)
    with pytest.raises(DataError, match=r"layer 'data': record b'00000001': cannot decode the image: broken PNG file"):
        batches_from(tmp_path, [raw_datum(rng), encoded], 2)()
    with pytest.raises(DataError, match=r"record b'00000000': cannot decode the image: broken PNG file"):
        batches_from(tmp_path, [encoded, encoded], 2)()
