"""distributed/blob_exchange.py on the GPU path: blobs' data and diffs go out through the exchange's host arrays
and come back in from them, by the device copies alone (the blobs' host copies are neither read nor marked
current), and arrays received earlier (the pipeline's micro-batches) land as well."""
import numpy as np

from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.blob.synced_memory import DEVICE, SYNCED
from pycaffe_dist.distributed.blob_exchange import BlobExchange, host_arrays


def blobs_on_the_device(gpu, seed=0):
    rng = np.random.default_rng(seed)
    made = []
    for shape in [(2, 3), (4,), (1, 2, 2, 2)]:
        blob = Blob(shape)
        gpu.upload(blob.mutable_gpu_data, rng.standard_normal(shape).astype(np.float32))
        gpu.upload(blob.mutable_gpu_diff, rng.standard_normal(shape).astype(np.float32))
        made.append(blob)
    return made


def device_values(gpu, blobs, diff=False):
    out = []
    for blob in blobs:
        host = np.empty(blob.shape, np.float32)
        gpu.download(blob.gpu_diff if diff else blob.gpu_data, host)
        out.append(host)
    return out


def test_out_and_back_in_by_the_device_copies(gpu):
    for diff in (False, True):
        source, target = blobs_on_the_device(gpu, 1), blobs_on_the_device(gpu, 2)
        sent = BlobExchange(source, diff=diff).outgoing()
        for blob, array in zip(source, sent):
            np.testing.assert_array_equal(array, device_values(gpu, [blob], diff)[0])
            memory = blob.diff_memory if diff else blob.data_memory
            assert memory.head == DEVICE        # the blob's host copy was not made current
        receiving = BlobExchange(target, diff=diff)
        for array, value in zip(receiving.incoming(), sent):
            array[...] = value
        receiving.land()
        for got, want in zip(device_values(gpu, target, diff), sent):
            np.testing.assert_array_equal(got, want)
        assert all((b.diff_memory if diff else b.data_memory).head in (DEVICE, SYNCED) for b in target)


def test_arrays_received_earlier_land_too(gpu):
    blobs = blobs_on_the_device(gpu)
    fed = BlobExchange(blobs)
    kept = [host_arrays([b.shape for b in blobs]) for _ in range(2)]     # two micro-batches
    for i, arrays in enumerate(kept):
        for array in fed.incoming(arrays):
            array[...] = i + 1
    for i in (1, 0):                                                     # the recompute lands them again
        fed.land(kept[i])
        assert all((v == i + 1).all() for v in device_values(gpu, blobs))
