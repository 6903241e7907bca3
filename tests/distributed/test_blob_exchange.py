"""distributed/blob_exchange.py on the CPU: the blobs' own arrays are sent and received into, no copy made; arrays
received earlier are copied in when they land. (tests/gpu/test_blob_exchange_gpu.py: the device path.)"""
import numpy as np

from pycaffe_dist.blob.blob import Blob
from pycaffe_dist.distributed.blob_exchange import BlobExchange, host_arrays


def test_the_cpu_sends_and_receives_the_blobs_own_arrays():
    blobs = [Blob((2, 3)), Blob((4,))]
    for diff in (False, True):
        exchange = BlobExchange(blobs, diff=diff)
        own = [b.diff if diff else b.data for b in blobs]
        assert all(np.shares_memory(a, b) for a, b in zip(exchange.outgoing(), own))
        received = exchange.incoming()
        assert all(np.shares_memory(a, b) for a, b in zip(received, own))
        for array in received:
            array[...] = 7
        exchange.land()
        assert all((a == 7).all() for a in own)


def test_arrays_received_earlier_are_copied_in():
    blobs = [Blob((2, 3)), Blob((4,))]
    kept = host_arrays([(2, 3), (4,)])
    exchange = BlobExchange(blobs)
    assert exchange.incoming(kept) is kept
    for i, array in enumerate(kept):
        array[...] = i + 3
    exchange.land(kept)
    assert (blobs[0].data == 3).all() and (blobs[1].data == 4).all()
