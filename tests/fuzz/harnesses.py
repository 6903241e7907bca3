"""One harness per reader: the real inputs its mutations start from (seeds) and the reader run on one input.

A harness's `run(data, workdir)` writes the input where the reader expects it and reads it as our code does in
use (the net, solver or data layer path), so that whatever escapes is what a user would see. Only our own errors
(PycaffeDistError) may come out; runner.py calls anything else a finding. Seeds are real files from
tests/fixtures/golden and tests/fixtures/zoo, or small stores made here the way our writers (and Caffe's) make them.
"""
import io
import os
import pathlib
import textwrap

import numpy as np

from pycaffe_dist.proto import caffe_pb2
from tests.conftest import GOLDEN, REPO, ZOO

_RNG_SEED = 1234       # the generated seeds are the same on every run


def _write(path, data):
    path = pathlib.Path(path)
    path.write_bytes(data)
    return path


def _net(text, phase=caffe_pb2.TEST):
    from pycaffe_dist.io.prototxt import parse_text
    from pycaffe_dist.net.net import Net
    return Net(parse_text(textwrap.dedent(text), caffe_pb2.NetParameter()), phase=phase)


def _png(array, fmt="PNG", **kw):
    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=fmt, **kw)
    return out.getvalue()


def _small_images():
    """Small images in every format Caffe reads, in several modes."""
    from PIL import Image
    rng = np.random.default_rng(_RNG_SEED)
    rgb = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    grey = rng.integers(0, 256, (6, 4), dtype=np.uint8)
    rgba = rng.integers(0, 256, (3, 4, 4), dtype=np.uint8)
    deep = rng.integers(0, 65536, (4, 3), dtype=np.uint16)
    images = [_png(rgb), _png(grey), _png(rgba), _png(deep), _png(rgb, "JPEG", quality=90), _png(grey, "JPEG"),
              _png(rgb, "BMP"), _png(rgb, "TIFF"), _png(grey, "GIF"), _png(rgb, "PPM"), _png(rgb, "WEBP")]
    out = io.BytesIO()
    Image.fromarray(rgb).convert("P").save(out, format="PNG")          # a palette
    images.append(out.getvalue())
    return images


class Harness:
    name = ""
    ext = ".bin"
    kinds = ("bytes",)

    def seeds(self, workdir):
        raise NotImplementedError

    def mutate(self, rng, mutator):
        """One input (structure-aware harnesses override this)."""
        return mutator.mutate(rng)

    def run(self, data, workdir):
        raise NotImplementedError


class Prototxt(Harness):
    """Text nets and solvers (io/prototxt.py, io/upgrade.py): parsed and upgraded as `dist_caffe` reads them. A
    text holding `base_lr` or `net:` is read as a solver, any other as a net."""
    name, ext, kinds = "prototxt", ".prototxt", ("bytes", "text")

    def seeds(self, workdir):
        paths = sorted(ZOO.rglob("*.prototxt")) + sorted((REPO / "prototxt").glob("*.prototxt"))
        return [p.read_bytes() for p in paths]

    def run(self, data, workdir):
        from pycaffe_dist.io.load import read_net, read_solver
        path = _write(workdir / "input.prototxt", data)
        if b"base_lr" in data or b"net:" in data or b"net_param" in data:
            read_solver(path)
        else:
            read_net(path)


# Nets with weights from the golden layer cases (Input layers only): the caffemodels are their seeds.
_WEIGHTED_CASES = ("conv_plain", "conv_group2", "ip_axis1", "batchnorm_train", "prelu_channelwise", "embed",
                   "deconv_stride2", "scale_bias_term")


def _weighted_nets():
    from pycaffe_dist.io.load import read_net
    from pycaffe_dist.net.net import Net
    return [Net(read_net(GOLDEN / "layers" / case / "net.prototxt"), phase=caffe_pb2.TEST)
            for case in _WEIGHTED_CASES]


class Caffemodel(Harness):
    """Binary weights (proto/binary.py, io/load.py, io/upgrade.py, Net.copy_trained_layers_from): read, upgraded,
    and copied into every net whose layer names match (caffemodel.load_weights). Seeds: Caffe's own weights, and
    the upgrade tests' V0 and V1 nets as binary NetParameters (old caffemodels)."""
    name, ext, kinds = "caffemodel", ".caffemodel", ("bytes", "proto")

    def seeds(self, workdir):
        from pycaffe_dist.errors import PycaffeDistError
        from pycaffe_dist.io.prototxt import read_text
        self.nets = _weighted_nets()
        seeds = [(GOLDEN / "layers" / case / "weights.caffemodel").read_bytes() for case in _WEIGHTED_CASES]
        seeds += [(GOLDEN / "solvers" / "sgd_momentum" / "snap_iter_10.caffemodel").read_bytes()]
        for path in sorted((ZOO / "bvlc_upgrade_tests").glob("*.prototxt")):
            try:
                seeds.append(read_text(path, caffe_pb2.NetParameter()).SerializeToString())
            except PycaffeDistError:        # a deliberately broken text of the upgrade tests: not a seed
                continue
        return seeds

    def run(self, data, workdir):
        from pycaffe_dist.errors import PycaffeDistError
        from pycaffe_dist.io.caffemodel import load_weights
        path = _write(workdir / "w.caffemodel", data)
        for net in self.nets:
            try:
                load_weights(net, path)
            except PycaffeDistError:
                continue


class CaffemodelHdf5(Harness):
    """HDF5 weights (io/caffemodel.py, data/hdf5.py), as Net::ToHDF5 writes them, into the same nets."""
    name, ext = "caffemodel_h5", ".caffemodel.h5"

    def seeds(self, workdir):
        from pycaffe_dist.io.caffemodel import load_weights, write_model
        self.nets = _weighted_nets()
        seeds = []
        for case, net in zip(_WEIGHTED_CASES, self.nets):
            load_weights(net, GOLDEN / "layers" / case / "weights.caffemodel")
            write_model(net, workdir / "seed.h5", hdf5=True, write_diff=case == "conv_plain")
            seeds.append((workdir / "seed.h5").read_bytes())
        return seeds

    def run(self, data, workdir):
        from pycaffe_dist.errors import PycaffeDistError
        from pycaffe_dist.io.caffemodel import load_weights
        path = _write(workdir / "w.caffemodel.h5", data)
        for net in self.nets:
            try:
                load_weights(net, path)
            except PycaffeDistError:
                continue


class Solverstate(Harness):
    """Binary solver states (io/solverstate.py): Caffe's snapshots of every solver type."""
    name, ext, kinds = "solverstate", ".solverstate", ("bytes", "proto")

    def seeds(self, workdir):
        return [p.read_bytes() for p in sorted(GOLDEN.rglob("*.solverstate"))]

    def run(self, data, workdir):
        from pycaffe_dist.io.solverstate import read_state
        read_state(_write(workdir / "s.solverstate", data))


class SolverstateHdf5(Harness):
    """HDF5 solver states (io/solverstate.py, data/hdf5.py), as SnapshotSolverStateToHDF5 writes them."""
    name, ext = "solverstate_h5", ".solverstate.h5"

    def seeds(self, workdir):
        from pycaffe_dist.io.solverstate import write_state
        rng = np.random.default_rng(_RNG_SEED)
        seeds = []
        for count in (0, 1, 3):
            history = [rng.standard_normal(shape).astype(np.float32) for shape in [(4, 3), (4,), (2, 2, 2)][:count]]
            write_state(workdir / "seed.h5", 10 * count, "snap_iter_%d.caffemodel" % count, count, history, hdf5=True)
            seeds.append((workdir / "seed.h5").read_bytes())
        return seeds

    def run(self, data, workdir):
        from pycaffe_dist.io.solverstate import read_state
        read_state(_write(workdir / "s.solverstate.h5", data))


class Binaryproto(Harness):
    """Blob files (blob/binaryproto.py): mean files as a Data layer's transformer reads them, InfogainLoss's H,
    and pycaffe's BlobProtoVector strings (io/pycaffe_io.py)."""
    name, ext, kinds = "binaryproto", ".binaryproto", ("bytes", "proto")

    def seeds(self, workdir):
        from pycaffe_dist.blob.binaryproto import write_blob_file
        from pycaffe_dist.io.pycaffe_io import arraylist_to_blobprotovector_str
        rng = np.random.default_rng(_RNG_SEED)
        seeds = [(GOLDEN / "layers" / "infogain_loss" / "H.binaryproto").read_bytes()]
        for shape in ((1, 3, 4, 5), (3, 4, 5), (2, 2)):
            write_blob_file(workdir / "seed.binaryproto", rng.standard_normal(shape))
            seeds.append((workdir / "seed.binaryproto").read_bytes())
        legacy = caffe_pb2.BlobProto(num=1, channels=2, height=2, width=2, data=list(range(8)))
        seeds.append(legacy.SerializeToString())
        seeds.append(caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(dim=[2]), double_data=[1, 2]).SerializeToString())
        seeds.append(arraylist_to_blobprotovector_str([np.zeros((2, 3)), np.ones(4)]))
        return seeds

    def run(self, data, workdir):
        from pycaffe_dist.blob.binaryproto import read_blob_file
        from pycaffe_dist.data.transform import DataTransformer
        from pycaffe_dist.errors import PycaffeDistError
        from pycaffe_dist.io.pycaffe_io import blobprotovector_str_to_arraylist
        path = _write(workdir / "mean.binaryproto", data)
        try:
            read_blob_file(path)
            transformer = DataTransformer(caffe_pb2.TransformationParameter(mean_file=str(path)), caffe_pb2.TEST)
            transformer.transform(np.zeros((2, 3, 4, 5), np.uint8))
        except PycaffeDistError:
            pass
        blobprotovector_str_to_arraylist(data)


def _datums():
    """Records of every kind a store holds: raw uint8 of two shapes, float, encoded images."""
    rng = np.random.default_rng(_RNG_SEED)
    raw = [caffe_pb2.Datum(channels=3, height=4, width=5, label=i,
                           data=rng.integers(0, 256, 60, dtype=np.uint8).tobytes()) for i in range(4)]
    other = caffe_pb2.Datum(channels=1, height=6, width=6, label=-3, data=bytes(range(36)))
    floats = caffe_pb2.Datum(channels=3, height=4, width=5, label=7,
                             float_data=rng.standard_normal(60).astype(np.float32).tolist())
    encoded = [caffe_pb2.Datum(data=image, encoded=True, label=i) for i, image in enumerate(_small_images()[:5])]
    return raw, other, floats, encoded


def _store_seeds(backend, workdir):
    """Serialized stores: raw records only, raw with a float one, encoded images, mixed shapes."""
    from pycaffe_dist.data.sources import open_writer
    raw, other, floats, encoded = _datums()
    seeds = []
    for records in (raw, raw[:2] + [floats] + raw[2:], encoded, raw[:2] + [other]):
        path = workdir / ("seed%d.%s" % (len(seeds), backend))
        with open_writer(path, backend) as writer:
            for i, datum in enumerate(records):
                writer.put(b"%08d" % i, datum.SerializeToString())
        seeds.append(_pack(path))
    return seeds


def _pack(path):
    """A store as one input: a datumfile's bytes, or a directory's files as (name length, name, size, bytes)."""
    path = pathlib.Path(path)
    if path.is_file():
        return path.read_bytes()
    out = bytearray()
    for f in sorted(path.iterdir()):
        if f.name == "LOCK" or f.name.startswith("LOG"):
            continue
        body = f.read_bytes()
        out += len(f.name).to_bytes(1, "little") + f.name.encode() + len(body).to_bytes(4, "little") + body
    return bytes(out)


def _unpack(data, directory):
    """The directory _pack made, as far as the (mutated) bytes go: a short or oversized entry ends it."""
    directory.mkdir()
    pos = 0
    while pos < len(data):
        n = data[pos]
        name = data[pos + 1:pos + 1 + n].decode("ascii", "replace")
        size = int.from_bytes(data[pos + 1 + n:pos + 5 + n], "little")
        body = data[pos + 5 + n:pos + 5 + n + size]
        safe = "".join(c for c in name if c.isalnum() or c in "._-")
        if not safe or safe in (".", ".."):
            break
        (directory / safe).write_bytes(body)
        pos += 5 + n + size
    return directory


def _read_store(path, backend):
    """A store read as a Data layer reads it: the first record for the shapes, every record decoded, then batches
    through the C splitter and decoder (record_batches), in TRAIN with a crop and in TEST."""
    from pycaffe_dist.data import sources
    from pycaffe_dist.data.batches import datum_image, record_batches
    from pycaffe_dist.data.transform import DataTransformer
    from pycaffe_dist.errors import PycaffeDistError
    with sources.open_records(path, backend) as source:
        datum = sources.first_datum(source)
        param = caffe_pb2.TransformationParameter(force_color=datum.encoded)
        datum_image(datum, param, "first")
        for key, value in source:
            record = sources.parse_datum(value, "record %r" % key)
            datum_image(record, caffe_pb2.TransformationParameter(), "record")
            datum_image(record, caffe_pb2.TransformationParameter(force_gray=True), "record")
        for phase, crop in ((caffe_pb2.TRAIN, 2), (caffe_pb2.TEST, 0)):
            transformer = DataTransformer(caffe_pb2.TransformationParameter(crop_size=crop, mirror=True), phase)
            try:
                make_batch = record_batches(source, 3, transformer, "layer 'data'", skip=1, shard=phase,
                                            num_shards=2 if phase == caffe_pb2.TEST else 1)
                make_batch()
                make_batch()
            except PycaffeDistError:
                continue


def _split_datumfile(data):
    """[[key, value]] of the whole records at the start of a datumfile (record_size, key_size, key, value_size,
    value; little-endian uint32 lengths)."""
    records, pos = [], 0
    while pos + 12 <= len(data):
        key_size = int.from_bytes(data[pos + 4:pos + 8], "little")
        key = data[pos + 8:pos + 8 + key_size]
        value_size = int.from_bytes(data[pos + 8 + key_size:pos + 12 + key_size], "little")
        value = data[pos + 12 + key_size:pos + 12 + key_size + value_size]
        if len(key) < key_size or len(value) < value_size:
            break
        records.append([key, value])
        pos += 12 + key_size + value_size
    return records


def _join_datumfile(records):
    u32 = lambda n: (n % 2 ** 32).to_bytes(4, "little")     # noqa: E731
    return b"".join(u32(len(k) + len(v) + 8) + u32(len(k)) + k + u32(len(v)) + v for k, v in records)


class Datumfile(Harness):
    """Datumfiles (data/sources.py DatumFileSource, csrc/datum.pyx, data/batches.py, data/images.py): whole files
    mutated, or one record's Datum (protobuf edits), key or length field, the others intact."""
    name, ext, kinds = "datumfile", ".datumfile", ("bytes",)

    def seeds(self, workdir):
        from tests.fuzz.mutate import Mutator
        seeds = _store_seeds("datumfile", workdir)
        self.values = Mutator([v for seed in seeds for _, v in _split_datumfile(seed)], ("bytes", "proto"))
        return seeds

    def mutate(self, rng, mutator):
        from tests.fuzz.mutate import INTERESTING
        if rng.random() < 0.4:
            return mutator.mutate(rng)
        records = _split_datumfile(rng.choice(mutator.seeds))
        i, choice = rng.randrange(len(records)), rng.randrange(4)
        if choice < 2:
            records[i][1] = self.values.mutate(rng, records[i][1])
        elif choice == 2:
            records[i][0] = mutator.mutate(rng, records[i][0])
        data = bytearray(_join_datumfile(records))
        if choice == 3:          # one length field of record i set to an interesting value
            start = len(_join_datumfile(records[:i]))
            field = rng.choice((0, 4, 8 + len(records[i][0])))
            data[start + field:start + field + 4] = (rng.choice(INTERESTING) % 2 ** 32).to_bytes(4, "little")
        return bytes(data)

    def run(self, data, workdir):
        _read_store(_write(workdir / "records.datumfile", data), "datumfile")


class DatumfileIndex(Harness):
    """A datumfile's index side-file (<file>.idx): the input is the index; its size and mtime fields are set to
    the datumfile's, so that the offsets themselves are read."""
    name, ext = "datumfile_index", ".idx"

    def seeds(self, workdir):
        from pycaffe_dist.data.sources import open_records
        self.datumfile = _store_seeds("datumfile", workdir)[1]
        path = _write(workdir / "seed.datumfile", self.datumfile)
        with open_records(path, "datumfile") as source:
            len(source)
        return [pathlib.Path(str(path) + ".idx").read_bytes()]

    def run(self, data, workdir):
        path = _write(workdir / "records.datumfile", self.datumfile)
        stat = os.stat(path)
        if len(data) >= 32:
            data = data[:8] + stat.st_size.to_bytes(8, "little") + stat.st_mtime_ns.to_bytes(8, "little") + data[24:]
        _write(str(path) + ".idx", data)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        _read_store(path, "datumfile")


class Lmdb(Harness):
    """LMDB environments (data/sources.py LmdbSource): Caffe's own (the solver goldens') and ours, their files
    mutated."""
    name, ext = "lmdb", ".lmdb"

    def seeds(self, workdir):
        return [_pack(GOLDEN / "solvers" / "sgd_momentum" / "train_lmdb")] + _store_seeds("lmdb", workdir)

    def run(self, data, workdir):
        _read_store(_unpack(data, workdir / "db"), "lmdb")


class Leveldb(Harness):
    """LevelDB databases (data/sources.py LevelDBSource), their files (log, tables, manifest) mutated."""
    name, ext = "leveldb", ".leveldb"

    def seeds(self, workdir):
        return _store_seeds("leveldb", workdir)

    def run(self, data, workdir):
        _read_store(_unpack(data, workdir / "db"), "leveldb")


class Images(Harness):
    """Image files (data/images.py; io/pycaffe_io.py load_image): decoded from bytes as an encoded Datum is, and
    from a file as ImageData reads it (colour, grey, resized)."""
    name, ext = "images", ".img"

    def seeds(self, workdir):
        return _small_images()

    def run(self, data, workdir):
        from pycaffe_dist.data.images import decode_image, load_image
        from pycaffe_dist.errors import PycaffeDistError
        from pycaffe_dist.io.pycaffe_io import load_image as caffe_io_load_image
        path = _write(workdir / "image", data)
        for call in (lambda: decode_image(data, None, "record"), lambda: decode_image(data, False, "record"),
                     lambda: load_image(path, True, 3, 4), lambda: caffe_io_load_image(path, color=False)):
            try:
                call()
            except PycaffeDistError:
                continue


class ImageList(Harness):
    """Image lists (data/convert.py read_image_list, layers/data.py ImageData): the list mutated, over a folder of
    good images named in it."""
    name, ext, kinds = "imagelist", ".txt", ("bytes", "text")

    def seeds(self, workdir):
        self.root = workdir / "images"
        self.root.mkdir()
        lines = []
        for i, image in enumerate(_small_images()[:4]):
            name = "im %d.png" % i if i == 1 else "im%d.png" % i
            (self.root / name).write_bytes(image)
            lines.append("%s %d" % (name, i))
        return ["\n".join(lines).encode() + b"\n", ("\n".join(lines[::-1]) + "\n\n").encode()]

    def run(self, data, workdir):
        path = _write(workdir / "list.txt", data)
        net = _net("""layer { name: "img" type: "ImageData" top: "data" top: "label"
            image_data_param { source: "%s" root_folder: "%s/" batch_size: 2 new_height: 3 new_width: 3 } }"""
                   % (path, self.root), phase=caffe_pb2.TRAIN)
        net.forward_from_to()


class Hdf5Data(Harness):
    """HDF5Data sources (layers/data.py, data/hdf5.py): the .h5 file mutated, read by a net as Caffe's layer
    reads it (datasets named like the tops), two forwards."""
    name, ext = "hdf5data", ".h5"

    def seeds(self, workdir):
        import h5py
        rng = np.random.default_rng(_RNG_SEED)
        seeds = []
        for kw in ({}, {"compression": "gzip"}, {"chunks": True}):
            with h5py.File(workdir / "seed.h5", "w") as h5:
                h5.create_dataset("data", data=rng.standard_normal((5, 2, 3)).astype(np.float32), **kw)
                h5.create_dataset("label", data=np.arange(5, dtype=np.float64), **kw)
            seeds.append((workdir / "seed.h5").read_bytes())
        return seeds

    def run(self, data, workdir):
        h5 = _write(workdir / "f.h5", data)
        listing = _write(workdir / "list.txt", b"%s\n%s\n" % (bytes(h5), bytes(h5)))
        net = _net("""layer { name: "h" type: "HDF5Data" top: "data" top: "label"
            hdf5_data_param { source: "%s" batch_size: 4 } }""" % listing)
        net.forward_from_to()
        net.forward_from_to()


class Idx(Harness):
    """IDX files (data/idx.py), plain and gzip, as convert-idx reads MNIST."""
    name, ext = "idx", ".idx"

    def seeds(self, workdir):
        import gzip
        images = b"\0\0\x08\x03" + (3).to_bytes(4, "big") + (4).to_bytes(4, "big") * 2 + bytes(range(48))
        labels = b"\0\0\x08\x01" + (3).to_bytes(4, "big") + bytes([1, 2, 3])
        floats = b"\0\0\x0d\x02" + (2).to_bytes(4, "big") * 2 + np.arange(4, dtype=">f4").tobytes()
        return [images, labels, floats, gzip.compress(images, mtime=0)]

    def run(self, data, workdir):
        from pycaffe_dist.data.idx import read_idx
        read_idx(_write(workdir / "x-idx", data))


class CaffeLog(Harness):
    """Caffe-format training logs (solver/training_log.py), as `dist_caffe plot` reads them: Caffe's own."""
    name, ext, kinds = "caffe_log", ".log", ("bytes", "text")

    def seeds(self, workdir):
        stamped = b"".join(b"I1231 23:59:%02d.%06d  4242 solver.cpp:%d] %s\n" % (50 + i, 4636 * i, 200 + i, line)
                           for i, line in enumerate([b"Iteration 0, Testing net (#0)",
                                                     b"    Test net output #0: accuracy = 0.1",
                                                     b"Iteration 0 (0 iter/s, 0.01s/20 iters), loss = 2.30",
                                                     b"    Train net output #0: loss = 2.30 (* 1 = 2.30 loss)",
                                                     b"Iteration 0, lr = 0.01"]))
        stamped += b"I0101 00:00:01.000001  4242 solver.cpp:218] Iteration 20, loss = 1.5\n"     # a new year
        return [p.read_bytes() for p in sorted(GOLDEN.rglob("caffe_train.log"))][:4] + [stamped]

    def run(self, data, workdir):
        from pycaffe_dist.solver.training_log import parse_log
        parse_log(_write(workdir / "train.log", data))


HARNESSES = {h.name: h for h in (Prototxt(), Caffemodel(), CaffemodelHdf5(), Solverstate(), SolverstateHdf5(),
                                 Binaryproto(), Datumfile(), DatumfileIndex(), Lmdb(), Leveldb(), Images(),
                                 ImageList(), Hdf5Data(), Idx(), CaffeLog())}
