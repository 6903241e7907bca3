"""The data verbs (cli/data.py) on the converters: convert-idx, convert-db, compute-mean, convert-imageset."""
import argparse

import numpy as np
import pytest

from pycaffe_dist.cli.data import add_verbs
from pycaffe_dist.data.sources import open_records, parse_datum
from pycaffe_dist.errors import DataError
from tests.data.test_convert import golden_idx, make_images  # noqa: F401  (golden_idx: the fixture)


def run_verb(argv):
    parser = argparse.ArgumentParser()
    add_verbs(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_verbs(golden_idx, tmp_path, capsys):
    images, labels, records = golden_idx
    assert run_verb(["convert-idx", str(images), str(labels), str(tmp_path / "db"), "--backend", "leveldb"]) == 0
    assert run_verb(["convert-db", str(tmp_path / "db"), str(tmp_path / "df"), "--backend-in", "leveldb",
                     "--backend", "datumfile"]) == 0
    assert run_verb(["compute-mean", str(tmp_path / "df"), str(tmp_path / "m.binaryproto"),
                     "--backend", "datumfile"]) == 0
    assert "mean_value channel [0]: %g\n" % records["images"].astype(np.float32).mean() in capsys.readouterr().out
    make_images(tmp_path / "img")
    (tmp_path / "list").write_text("a.png 2\nd.png 1\n")
    assert run_verb(["convert-imageset", str(tmp_path / "img"), str(tmp_path / "list"), str(tmp_path / "im"),
                     "--resize_height", "2", "--resize_width", "3", "--gray", "--shuffle", "--seed", "3"]) == 0
    datums = [parse_datum(v, "r") for _, v in open_records(tmp_path / "im", "lmdb")]
    assert [(d.channels, d.height, d.width) for d in datums] == [(1, 2, 3)] * 2
    with pytest.raises(DataError, match=r"already exists; refusing to overwrite it"):
        run_verb(["convert-idx", str(images), str(labels), str(tmp_path / "db"), "--backend", "leveldb"])
    assert run_verb(["convert-idx", str(images), str(labels), str(tmp_path / "db"), "--backend", "leveldb",
                     "--overwrite"]) == 0
