"""Caffe's SyncedMemory (include/caffe/syncedmem.hpp): one flat array with a host copy and a device copy, and
which of them is current, so that data stay on the GPU between layers and cross only where someone asks.

    head UNINIT  nothing allocated yet (reads see zeros)
         HOST    the host copy is current      DEVICE  the device copy is current      SYNCED  both are

`host()` is the host array for reading and writing (the device copy becomes stale); `host(write=False)` reads
only. `device()` / `device(write=False)` are the same for the device copy. Copies happen on the transitions only.
Host memory is page-locked while a device is in use, so those copies run at full speed.
"""
import numpy as np

from ..backend import select
from ..errors import DeviceError

UNINIT, HOST, DEVICE, SYNCED = 0, 1, 2, 3


class SyncedMemory:
    __slots__ = ("size", "dtype", "_host", "_dev", "head")

    def __init__(self, size, dtype, host=None):
        self.size, self.dtype = int(size), np.dtype(dtype)
        self._host, self._dev = host, None
        self.head = HOST if host is not None else UNINIT

    @property
    def allocated(self):
        return self.head != UNINIT

    def host(self, write=True):
        if self._host is None:
            self._host = (select.current().pinned_empty(self.size, self.dtype) if self._dev is not None
                          else np.empty(self.size, self.dtype))
            if self.head == UNINIT:
                self._host[...] = 0
        if self.head == DEVICE:
            select.current().download(self._dev, self._host)
            self.head = SYNCED
        if write or self.head == UNINIT:
            self.head = HOST
        return self._host

    def device(self, write=True):
        head = self.head
        if head == DEVICE or head == SYNCED:    # current on the device: nothing to make or copy (most calls of a pass)
            if write:
                self.head = DEVICE
            return self._dev
        dev = select.current()
        if self._dev is None:
            if self.dtype != np.float32:
                raise DeviceError("the GPU path computes in float32; this blob holds %s" % self.dtype)
            self._dev = dev.empty(self.size, self.dtype)
            if self.head == UNINIT:
                dev.memset(self._dev, 0)
        if self.head == HOST:
            dev.upload(self._dev, self._host)
            self.head = SYNCED
        if write or self.head == UNINIT:
            self.head = DEVICE
        return self._dev

    @property
    def device_array(self):
        """The device copy as it is (None before one is made), current or not."""
        return self._dev

    def adopt_device(self, array):
        """Keep `array` (this memory's size, on the current device: a slice of a larger array) as the device
        copy from now on; a current device copy moves there."""
        dev = select.current()
        if array.size != self.size:
            raise DeviceError("a device array of %d elements cannot hold a memory of %d" % (array.size, self.size))
        if self._dev is not None and self.head in (DEVICE, SYNCED):
            dev.copy(array, self._dev)
        elif self.head == UNINIT:
            dev.memset(array, 0)
        self._dev = array

    def device_written(self):
        """The device copy was written by someone else (a memset of the array it is a slice of): it is now the
        current copy."""
        if self._dev is None:
            raise DeviceError("this memory has no device copy")
        self.head = DEVICE

    def astype(self, dtype):
        """Host-only conversion (the float64 gradient checker); the device copy is dropped."""
        host = self.host(write=False).astype(dtype) if self.allocated else None
        self.__init__(self.size, dtype, host)
