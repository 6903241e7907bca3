"""Text prototxt files (io/prototxt.py): files that cannot be read are PrototxtErrors naming them."""
import pytest

from pycaffe_dist.errors import PrototxtError
from pycaffe_dist.io.prototxt import read_text
from pycaffe_dist.proto import caffe_pb2


def test_files_that_cannot_be_read(tmp_path):
    with pytest.raises(PrototxtError, match=r"none.prototxt: no such file"):
        read_text(tmp_path / "none.prototxt", caffe_pb2.NetParameter())
    (tmp_path / "bin.prototxt").write_bytes(b'name: "a"\n\xff\xfe')
    with pytest.raises(PrototxtError, match=r"bin.prototxt: not a UTF-8 text file \(byte 10\)"):
        read_text(tmp_path / "bin.prototxt", caffe_pb2.NetParameter())
    # a text string may hold "\000", and a file name from one (a solver's net: "a\000b") raised ValueError
    with pytest.raises(PrototxtError, match=r"a\\x00b': cannot read: embedded null byte"):
        read_text(str(tmp_path / "a\0b"), caffe_pb2.NetParameter())
