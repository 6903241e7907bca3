"""The data layers of pycaffe_dist/layers/data.py on the GPU code path: HDF5Data reads its rows on the host and
uploads each batch into its tops' device memory (hdf5_data_layer.cu), and gives the CPU code's batches."""
import numpy as np

from pycaffe_dist import common
from pycaffe_dist.blob import synced_memory
from tests.gpu.test_shape_gpu import device_work


def test_hdf5_data_uploads_its_batches_into_the_tops_device_memory(gpu, tmp_path):
    import h5py
    from tests.layers.test_data import net_from_text
    for i, rows in enumerate((3, 2)):
        with h5py.File(tmp_path / ("f%d.h5" % i), "w") as h5:
            h5["data"] = np.arange(rows * 6, dtype=np.float64).reshape(rows, 2, 3) + 100 * i
            h5["label"] = np.arange(rows, dtype=np.float32) + 10 * i
    (tmp_path / "list.txt").write_text("%s\n%s\n" % (tmp_path / "f0.h5", tmp_path / "f1.h5"))
    text = """layer { name: "h" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param { source: "%s" batch_size: 4 } }""" % (tmp_path / "list.txt")
    common.set_mode_cpu()
    cpu = net_from_text(text)
    common.set_mode_gpu()
    ours = net_from_text(text)
    for _ in range(3):      # wraps over rows and files
        cpu.forward_from_to(gpu=False)
        with device_work(gpu) as work:
            ours.forward_from_to()
        assert work.get("upload") == 2 and "download" not in work, work
        for name in ("data", "label"):
            blob = ours.blob_by_name(name)
            assert blob.data_memory.head == synced_memory.DEVICE, name
            # cpu_data: reading leaves both copies current, so that the next batch's upload is the only one
            np.testing.assert_array_equal(blob.cpu_data, cpu.blob_by_name(name).data)
