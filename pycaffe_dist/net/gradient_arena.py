"""The device copies of a net's parameter gradients (its learnable params' diffs) as slices of one device array,
so that a GPU iteration clears them with one memset. Caffe's ClearParamDiffs makes a call per parameter: 320 for
ResNet-50 (its BatchNorm statistics count), each too small to keep the GPU busy while the host issues the next, at
the start of every iteration when nothing else is queued. (PyTorch's zero_grad clears with its multi-tensor
kernels for the same reason.)

The arena is made at the first clear on a device and again whenever a diff's memory changed (a reshaped param, a
diff that moved to another device array); each diff keeps its own SyncedMemory, whose device copy is its slice.
"""
from ..backend import select

ALIGN = 64      # elements: each slice starts on a 256-byte boundary, as cudaMalloc's arrays do


class GradientArena:
    def __init__(self, blobs):
        dev = select.current()
        memories, seen = [], set()
        for blob in blobs:
            blob.mutable_gpu_diff                       # allocated on the device, its content current there
            memory = blob.diff_memory
            if id(memory) not in seen:
                seen.add(id(memory))
                memories.append(memory)
        offsets, total = [], 0
        for memory in memories:
            offsets.append(total)
            total += -(-memory.size // ALIGN) * ALIGN
        self.device = dev
        self.array = dev.empty(max(total, 1))
        self.slots = []
        for memory, offset in zip(memories, offsets):
            slot = self.array.at(offset, memory.size)
            memory.adopt_device(slot)
            self.slots.append((memory, slot))
        self._memory_of = [blob.diff_memory for blob in blobs]     # each blob's, in order

    def holds(self, blobs):
        """Whether the arena is still where `blobs`' diffs live on the current device."""
        if self.device is not select.current() or len(blobs) != len(self._memory_of):
            return False
        if any(blob.diff_memory is not memory for blob, memory in zip(blobs, self._memory_of)):
            return False
        return all(memory.device_array is slot for memory, slot in self.slots)

    def clear(self):
        """Zero every diff on the device (one memset); the device copies become the current ones."""
        self.device.memset(self.array, 0)
        for memory, _ in self.slots:
            memory.device_written()
