# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Records of Datums in C, for the data layers' prefetch thread: a datumfile's records split out of one read, and
a batch of serialized caffe.Datum records with raw uint8 pixels decoded into one array without the GIL.

The prefetch thread runs beside the training thread. Reading and parsing each record with struct, protobuf and
numpy in Python held the GIL for about 20 us a record (1.3 ms a LeNet batch), and the training thread, which
takes the GIL back between its kernels, waited for it: 1 to 3 ms an iteration.

decode_raw handles only the common case: field 4 (data) holding exactly channels x height x width bytes of the
expected shape, no float_data (field 6) and encoded (field 7) false. Anything else (encoded images, float records,
another shape, malformed bytes) stops the decode at that record, and the caller reads the batch through protobuf,
which gives its own results and error messages. Field semantics are protobuf's: for a repeated scalar field the
last value wins, unknown fields are skipped by their wire type. Python callers: pycaffe_dist/data/batches.py,
pycaffe_dist/data/sources.py.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cdef enum:
    VARINT = 0
    FIXED64 = 1
    DELIMITED = 2
    FIXED32 = 5


cdef inline const uint8_t* _varint(const uint8_t* p, const uint8_t* end, uint64_t* value) noexcept nogil:
    # the varint at p into *value; NULL when it runs past end or beyond 10 bytes
    cdef uint64_t v = 0
    cdef int shift = 0
    while p < end and shift < 70:
        v |= <uint64_t>(p[0] & 0x7F) << shift
        shift += 7
        if p[0] < 0x80:
            value[0] = v
            return p + 1
        p += 1
    return NULL


cdef bint _decode(const uint8_t* p, Py_ssize_t size, int channels, int height, int width, uint8_t* pixels,
                  float* label) noexcept nogil:
    # One Datum's pixels and label; False where it is not a plain record of this shape (see the docstring)
    cdef const uint8_t* end = p + size
    cdef const uint8_t* data = NULL
    cdef uint64_t key, value, length
    cdef Py_ssize_t count = <Py_ssize_t>channels * height * width
    cdef int field, wire
    cdef int32_t shape[3]
    cdef int32_t label_value = 0     # proto2 default
    shape[0] = shape[1] = shape[2] = 0
    while p < end:
        p = _varint(p, end, &key)
        if p == NULL:
            return False
        field, wire = <int>(key >> 3), <int>(key & 7)
        if field == 0:
            return False     # not a valid tag: protobuf's error
        if wire == VARINT:
            p = _varint(p, end, &value)
            if p == NULL:
                return False
            if 1 <= field <= 3:
                shape[field - 1] = <int32_t>value
            elif field == 5:
                label_value = <int32_t>value
            elif field == 7 and value != 0:
                return False
            elif field == 4 or field == 6:
                return False
        elif wire == DELIMITED:
            p = _varint(p, end, &length)
            if p == NULL or length > <uint64_t>(end - p):
                return False
            if field == 4:
                if <Py_ssize_t>length != count:
                    return False
                data = p
            elif field == 6 or (1 <= field <= 7):
                return False
            p += length
        elif wire == FIXED32 or wire == FIXED64:
            if field <= 7 or (end - p) < (4 if wire == FIXED32 else 8):
                return False
            p += 4 if wire == FIXED32 else 8
        else:
            return False     # groups (3, 4) and invalid wire types: left to protobuf
    if data == NULL or shape[0] != channels or shape[1] != height or shape[2] != width:
        return False
    memcpy(pixels, data, count)
    label[0] = <float>label_value
    return True


def decode_raw(list values, uint8_t[:, ::1] pixels, float[::1] labels, int channels, int height, int width):
    """Decode values[i] (bytes of serialized Datums) into pixels[i] (channels * height * width bytes) and
    labels[i], in order. Returns how many were decoded: len(values) unless a record is not a plain uint8 Datum of
    this shape, at which the decode stops."""
    cdef Py_ssize_t n = len(values), i, done = 0
    if pixels.shape[0] < n or labels.shape[0] < n or pixels.shape[1] != <Py_ssize_t>channels * height * width:
        raise ValueError("decode_raw: pixels %s or labels (%d) do not fit %d records of %dx%dx%d"
                         % ((pixels.shape[0], pixels.shape[1]), labels.shape[0], n, channels, height, width))
    for i in range(n):
        if type(values[i]) is not bytes:
            raise TypeError("decode_raw: record %d is %s, not bytes" % (i, type(values[i]).__name__))
    cdef const uint8_t** starts = <const uint8_t**>malloc(max(1, n) * sizeof(uint8_t*))
    cdef Py_ssize_t* sizes = <Py_ssize_t*>malloc(max(1, n) * sizeof(Py_ssize_t))
    if starts == NULL or sizes == NULL:
        free(starts)
        free(sizes)
        raise MemoryError()
    for i in range(n):      # `values` holds the bytes objects alive while the GIL is released
        starts[i] = <const uint8_t*>PyBytes_AS_STRING(values[i])
        sizes[i] = PyBytes_GET_SIZE(values[i])
    with nogil:
        while done < n and _decode(starts[done], sizes[done], channels, height, width, &pixels[done, 0],
                                   &labels[done]):
            done += 1
    free(starts)
    free(sizes)
    return done


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


def split_records(bytes run, Py_ssize_t n, uint32_t max_length):
    """The n datumfile records that `run` holds back to back, as [(key, value)], or None where a length field
    exceeds max_length, a record's record_size is not its key and value sizes + 8, or the n records do not fill
    `run` exactly (the checks of sources.DatumFileSource._read_record, which then names the bad record)."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(run)
    cdef const uint8_t* end = p + PyBytes_GET_SIZE(run)
    cdef uint32_t record_size, key_size, value_size
    cdef Py_ssize_t i
    records = []
    for i in range(n):
        if end - p < 8:
            return None
        record_size, key_size = _u32(p), _u32(p + 4)
        if record_size > max_length or key_size > max_length or <uint64_t>key_size + 12 > <uint64_t>(end - p):
            return None
        value_size = _u32(p + 8 + key_size)
        if (value_size > max_length or <uint64_t>record_size != <uint64_t>key_size + value_size + 8
                or <uint64_t>record_size + 4 > <uint64_t>(end - p)):
            return None
        records.append((PyBytes_FromStringAndSize(<const char*>p + 8, key_size),
                        PyBytes_FromStringAndSize(<const char*>p + 12 + key_size, value_size)))
        p += 4 + record_size
    return records if p == end else None
