"""The blob floor: Blob (data + diff, as Caffe's), its SyncedMemory (host and device copies), the fillers, and
blobs in .binaryproto files."""
