# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""CPU 2-D pooling, forward and backward, as Caffe's src/caffe/layers/pooling_layer.cpp (MAX, AVE) and, for
STOCHASTIC, its GPU kernels in pooling_layer.cu (Caffe's CPU has no STOCHASTIC path).

Every function takes C-contiguous arrays of planes: the input (planes, height * width), the output
(planes, pooled_h * pooled_w), with planes = num * channels, and `geometry` = (height, width, pooled_h, pooled_w,
kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w). float32 and float64 both work (all real arrays of one call
share the dtype). Work runs in parallel (OpenMP prange) without the GIL. Window positions are plane offsets
h * width + w in int32 arrays shaped like the output (-1: the window chose nothing).

Window of output (ph, pw), as Caffe: hstart = ph * stride_h - pad_h, clipped to [0, height) for reading; AVE
divides by the window's size clipped to the PADDED extent [-pad, height + pad) only. STOCHASTIC ignores padding
(Caffe allows none with it).

MAX and AVE run Caffe's loops LANES planes at a time: every plane has the same windows, so a block of planes is
first interleaved (element e of lane l at e * LANES + l) and each step of a window then works on LANES
neighbouring values, independent of each other (one window at a time is a chain of dependent compares or adds,
and consecutive windows of one plane would need strided reads). Each lane still takes its inputs, and each input
diff its terms, in exactly Caffe's order, so the results are Caffe's bit for bit. The float32 fast paths (one
window of 8 lanes, and whole planes of the common geometries) are C with generic vectors: csrc/pooling.h.
Python wrappers on 4-D arrays: pycaffe_dist/backend/pooling.py.
"""
cimport openmp
from cython.parallel import prange, threadid
import numpy as np
from libc.float cimport FLT_MAX, FLT_MIN

ctypedef fused real:
    float
    double

cdef enum:
    LANES = 8   # planes pooled side by side (pooling.h's pcd_max_window8 is written for 8)


cdef extern from "pooling.h" nogil:
    # the float32 fast paths, in C with generic vectors (what each is for: pooling.h)
    void pcd_max_window8(const float* buf, int width, int hstart, int hend, int wstart, int wend, float* best,
                         int* arg)
    void pcd_max2x2_plane(const float* x, int width, int pooled_h, int pooled_w, float* y, int* mask)
    void pcd_max3x3s2_plane(const float* x, int height, int width, int pooled_h, int pooled_w, float* y, int* mask)
    void pcd_ave3x3s2_plane(const float* x, int height, int width, int pooled_h, int pooled_w, float* y)
    void pcd_ave3x3s2_backward_plane(const float* dy, float* dx, int height, int width, int pooled_h, int pooled_w,
                                     int accumulate)
    void pcd_max2x2_backward_plane(const float* dy, const int* mask, float* dx, int width, int pooled_h, int pooled_w,
                                   int accumulate)


cdef struct Geometry:
    int height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w


cdef int _geometry(tuple geometry, Py_ssize_t planes_in, Py_ssize_t plane_in, Py_ssize_t planes_out,
                   Py_ssize_t plane_out, Geometry* g) except -1:
    if len(geometry) != 10:
        raise ValueError("geometry is (height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, "
                         "stride_w, pad_h, pad_w), got %r" % (geometry,))
    (g.height, g.width, g.pooled_h, g.pooled_w, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h,
     g.pad_w) = geometry
    if min(geometry) < 0 or g.kernel_h < 1 or g.kernel_w < 1 or g.stride_h < 1 or g.stride_w < 1:
        raise ValueError("bad pooling geometry %r" % (geometry,))
    if planes_in != planes_out or plane_in != <Py_ssize_t>g.height * g.width \
            or plane_out != <Py_ssize_t>g.pooled_h * g.pooled_w:
        raise ValueError("pooling arrays of shapes (%d, %d) -> (%d, %d) do not match the geometry %r"
                         % (planes_in, plane_in, planes_out, plane_out, geometry))
    return 0


cdef inline void _window(int ph, int pw, const Geometry* g, int* hstart, int* hend, int* wstart, int* wend,
                         int* pool_size) noexcept nogil:
    """Caffe's window of output (ph, pw), clipped to the image, and its AVE divisor (clipped to the padding)."""
    hstart[0] = ph * g.stride_h - g.pad_h
    wstart[0] = pw * g.stride_w - g.pad_w
    hend[0] = min(hstart[0] + g.kernel_h, g.height + g.pad_h)
    wend[0] = min(wstart[0] + g.kernel_w, g.width + g.pad_w)
    pool_size[0] = (hend[0] - hstart[0]) * (wend[0] - wstart[0])
    hstart[0] = max(hstart[0], 0)
    wstart[0] = max(wstart[0], 0)
    hend[0] = min(hend[0], g.height)
    wend[0] = min(wend[0], g.width)


cdef inline bint _whole_2x2(const Geometry* g) noexcept nogil:
    """2x2 windows at stride 2, no pad, tiling the plane exactly (pcd_max2x2_plane's case)."""
    return g.kernel_h == 2 and g.kernel_w == 2 and g.stride_h == 2 and g.stride_w == 2 and g.pad_h == 0 and \
        g.pad_w == 0 and g.height == 2 * g.pooled_h and g.width == 2 * g.pooled_w


cdef inline bint _unpadded_3x3_stride2(const Geometry* g) noexcept nogil:
    """3x3 windows at stride 2, no pad, rows of 8 outputs or more (pcd_max3x3s2_plane's, pcd_ave3x3s2_plane's and
    pcd_ave3x3s2_backward_plane's case: narrower rows run faster interleaved, 8 planes side by side)."""
    return g.kernel_h == 3 and g.kernel_w == 3 and g.stride_h == 2 and g.stride_w == 2 and g.pad_h == 0 and \
        g.pad_w == 0 and g.pooled_w >= 8


# --- blocks of planes, interleaved -----------------------------------------------------------------------------

cdef inline int _lanes(Py_ssize_t block, Py_ssize_t planes) noexcept nogil:
    """How many planes block `block` holds (LANES but in the last block)."""
    return <int>min(<Py_ssize_t>LANES, planes - block * LANES)


cdef void _interleave(const real* x, Py_ssize_t size, int lanes, real* buf) noexcept nogil:
    """buf[e * LANES + l] = element e of plane l of x (planes of `size`); lanes past `lanes` are zeros."""
    cdef Py_ssize_t e
    cdef int l
    if lanes == LANES:   # a full block, in the loop order that gcc vectorizes (as 4 x 4 transposes)
        for e in range(size):
            for l in range(LANES):
                buf[e * LANES + l] = x[l * size + e]
        return
    for l in range(LANES):
        for e in range(size):
            buf[e * LANES + l] = x[l * size + e] if l < lanes else 0


cdef void _deinterleave(const real* buf, Py_ssize_t size, int lanes, real* x) noexcept nogil:
    """The inverse of _interleave, for the first `lanes` planes."""
    cdef Py_ssize_t e
    cdef int l
    if lanes == LANES:
        for e in range(size):
            for l in range(LANES):
                x[l * size + e] = buf[e * LANES + l]
        return
    for l in range(lanes):
        for e in range(size):
            x[l * size + e] = buf[e * LANES + l]


cdef object _scratch(const Geometry* g, dtype):
    """Per thread: a block of planes, interleaved."""
    return np.empty((openmp.omp_get_max_threads(), <Py_ssize_t>g.height * g.width * LANES), dtype)


# --- MAX ---------------------------------------------------------------------------------------------------

cdef void _max_block(const real* x, real* buf, real* y, int* mask, int lanes, const Geometry* g) noexcept nogil:
    cdef Py_ssize_t size = <Py_ssize_t>g.height * g.width, out_size = <Py_ssize_t>g.pooled_h * g.pooled_w, o
    cdef int ph, pw, h, w, l, hstart, hend, wstart, wend, pool_size, i, better
    cdef real best[LANES]
    cdef int arg[LANES]
    cdef const real* v
    cdef real a
    _interleave(x, size, lanes, buf)
    for ph in range(g.pooled_h):
        for pw in range(g.pooled_w):
            _window(ph, pw, g, &hstart, &hend, &wstart, &wend, &pool_size)
            if real is float:
                pcd_max_window8(buf, g.width, hstart, hend, wstart, wend, best, arg)
            else:
                # Caffe starts from -FLT_MAX and keeps the first strict maximum in row-major order.
                for l in range(LANES):
                    best[l] = -FLT_MAX
                    arg[l] = -1
                for h in range(hstart, hend):
                    for w in range(wstart, wend):
                        i = h * g.width + w
                        v = buf + <Py_ssize_t>i * LANES
                        for l in range(LANES):
                            a = v[l]
                            better = a > best[l]
                            arg[l] ^= (arg[l] ^ i) & -better   # a select, not a branch (random data mispredicts)
                            best[l] = a if better else best[l]
            o = ph * g.pooled_w + pw
            for l in range(lanes):
                y[l * out_size + o] = best[l]
                mask[l * out_size + o] = arg[l]


def max_forward(const real[:, ::1] x, real[:, ::1] y, int[:, ::1] mask, tuple geometry):
    """y = the maximum of each window; mask = its position (the first one in row-major order on ties)."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], y.shape[0], y.shape[1], &g)
    if mask.shape[0] != y.shape[0] or mask.shape[1] != y.shape[1]:
        raise ValueError("max_forward: the mask must be shaped like the output")
    cdef Py_ssize_t b, planes = y.shape[0]
    if planes == 0 or y.shape[1] == 0:
        return
    if real is float and _whole_2x2(&g):
        with nogil:
            for b in prange(planes, schedule="static"):
                pcd_max2x2_plane(&x[b, 0], g.width, g.pooled_h, g.pooled_w, &y[b, 0], &mask[b, 0])
        return
    if real is float and _unpadded_3x3_stride2(&g):
        with nogil:
            for b in prange(planes, schedule="static"):
                pcd_max3x3s2_plane(&x[b, 0], g.height, g.width, g.pooled_h, g.pooled_w, &y[b, 0], &mask[b, 0])
        return
    cdef real[:, ::1] scratch = _scratch(&g, np.asarray(y).dtype)
    with nogil:
        for b in prange((planes + LANES - 1) // LANES, schedule="static"):
            _max_block(&x[b * LANES, 0], &scratch[threadid(), 0], &y[b * LANES, 0], &mask[b * LANES, 0],
                       _lanes(b, planes), &g)


cdef void _scatter_plane(const real* dy, const int* mask, real* dx, Py_ssize_t n_out, Py_ssize_t n_in,
                         bint accumulate) noexcept nogil:
    cdef Py_ssize_t i
    cdef int j
    if not accumulate:
        for i in range(n_in):
            dx[i] = 0
    for i in range(n_out):
        j = mask[i]
        if 0 <= j < n_in:   # -1: the window chose nothing (all -FLT_MAX or NaN); Caffe would write out of bounds
            dx[j] += dy[i]


def mask_backward(const real[:, ::1] dy, const int[:, ::1] mask, real[:, ::1] dx, bint accumulate=False,
                  tuple geometry=None):
    """dx[mask[i]] += dy[i] plane by plane (MAX and STOCHASTIC TRAIN); dx is zeroed first unless accumulate.
    With the forward's `geometry` (optional), whole 2x2 stride-2 windows take a faster path."""
    if mask.shape[0] != dy.shape[0] or mask.shape[1] != dy.shape[1] or dx.shape[0] != dy.shape[0]:
        raise ValueError("mask_backward: shapes %r, mask %r, input %r do not match"
                         % (tuple(dy.shape)[:2], tuple(mask.shape)[:2], tuple(dx.shape)[:2]))
    cdef Py_ssize_t p
    cdef Geometry g
    if dx.shape[1] == 0:
        return
    if geometry is not None:
        _geometry(geometry, dx.shape[0], dx.shape[1], dy.shape[0], dy.shape[1], &g)
        if real is float and _whole_2x2(&g):
            with nogil:
                for p in prange(dx.shape[0], schedule="static"):
                    pcd_max2x2_backward_plane(&dy[p, 0], &mask[p, 0], &dx[p, 0], g.width, g.pooled_h, g.pooled_w,
                                              accumulate)
            return
    with nogil:
        for p in prange(dx.shape[0], schedule="static"):
            _scatter_plane(&dy[p, 0], &mask[p, 0], &dx[p, 0], dy.shape[1], dx.shape[1], accumulate)


# --- AVE ---------------------------------------------------------------------------------------------------

cdef void _ave_block(const real* x, real* buf, real* y, int lanes, const Geometry* g) noexcept nogil:
    cdef Py_ssize_t size = <Py_ssize_t>g.height * g.width, out_size = <Py_ssize_t>g.pooled_h * g.pooled_w, o
    cdef int ph, pw, h, w, l, hstart, hend, wstart, wend, pool_size
    cdef real total[LANES]
    cdef const real* v
    _interleave(x, size, lanes, buf)
    for ph in range(g.pooled_h):
        for pw in range(g.pooled_w):
            _window(ph, pw, g, &hstart, &hend, &wstart, &wend, &pool_size)
            for l in range(LANES):
                total[l] = 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    v = buf + (<Py_ssize_t>h * g.width + w) * LANES
                    for l in range(LANES):
                        total[l] = total[l] + v[l]
            o = ph * g.pooled_w + pw
            for l in range(lanes):
                y[l * out_size + o] = total[l] / pool_size


def ave_forward(const real[:, ::1] x, real[:, ::1] y, tuple geometry):
    """y = the sum of each window / its size within the padded image (padding counts as zeros)."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], y.shape[0], y.shape[1], &g)
    cdef Py_ssize_t b, planes = y.shape[0]
    if planes == 0 or y.shape[1] == 0:
        return
    if real is float and _unpadded_3x3_stride2(&g):
        with nogil:
            for b in prange(planes, schedule="static"):
                pcd_ave3x3s2_plane(&x[b, 0], g.height, g.width, g.pooled_h, g.pooled_w, &y[b, 0])
        return
    cdef real[:, ::1] scratch = _scratch(&g, np.asarray(y).dtype)
    with nogil:
        for b in prange((planes + LANES - 1) // LANES, schedule="static"):
            _ave_block(&x[b * LANES, 0], &scratch[threadid(), 0], &y[b * LANES, 0], _lanes(b, planes), &g)


cdef void _ave_backward_block(const real* dy, real* dx, real* buf, int lanes, const Geometry* g,
                              bint accumulate) noexcept nogil:
    # Caffe adds each window's share to its inputs, window after window; so do we, LANES planes at a time.
    cdef Py_ssize_t size = <Py_ssize_t>g.height * g.width, out_size = <Py_ssize_t>g.pooled_h * g.pooled_w, o, e
    cdef int ph, pw, h, w, l, hstart, hend, wstart, wend, pool_size
    cdef real share[LANES]
    cdef real* d
    if accumulate:
        _interleave(dx, size, lanes, buf)
    else:
        for e in range(size * LANES):
            buf[e] = 0
    for ph in range(g.pooled_h):
        for pw in range(g.pooled_w):
            _window(ph, pw, g, &hstart, &hend, &wstart, &wend, &pool_size)
            o = ph * g.pooled_w + pw
            for l in range(LANES):
                share[l] = dy[l * out_size + o] / pool_size if l < lanes else 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    d = buf + (<Py_ssize_t>h * g.width + w) * LANES
                    for l in range(LANES):
                        d[l] += share[l]
    _deinterleave(buf, size, lanes, dx)


def ave_backward(const real[:, ::1] dy, real[:, ::1] dx, tuple geometry, bint accumulate=False):
    """dx += each window's dy / its size, spread over the window; dx is zeroed first unless accumulate."""
    cdef Geometry g
    _geometry(geometry, dx.shape[0], dx.shape[1], dy.shape[0], dy.shape[1], &g)
    cdef Py_ssize_t b, planes = dx.shape[0]
    if planes == 0 or dx.shape[1] == 0:
        return
    if real is float and _unpadded_3x3_stride2(&g):
        with nogil:
            for b in prange(planes, schedule="static"):
                pcd_ave3x3s2_backward_plane(&dy[b, 0], &dx[b, 0], g.height, g.width, g.pooled_h, g.pooled_w,
                                            accumulate)
        return
    cdef real[:, ::1] scratch = _scratch(&g, np.asarray(dx).dtype)
    with nogil:
        for b in prange((planes + LANES - 1) // LANES, schedule="static"):
            _ave_backward_block(&dy[b * LANES, 0], &dx[b * LANES, 0], &scratch[threadid(), 0], _lanes(b, planes),
                                &g, accumulate)


# --- STOCHASTIC --------------------------------------------------------------------------------------------

cdef void _stochastic_plane(const real* x, const real* u, real* y, int* mask, const Geometry* g) noexcept nogil:
    cdef int ph, pw, h, w, hstart, hend, wstart, wend, o
    cdef real total, threshold
    for ph in range(g.pooled_h):
        hstart = ph * g.stride_h
        hend = min(hstart + g.kernel_h, g.height)
        for pw in range(g.pooled_w):
            wstart = pw * g.stride_w
            wend = min(wstart + g.kernel_w, g.width)
            o = ph * g.pooled_w + pw
            total = 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    total = total + x[h * g.width + w]
            threshold = u[o] * total
            # Caffe's StoPoolForwardTrain: the first position whose running sum reaches u * sum. None does only
            # with negative inputs or an empty window; Caffe then leaves the output unset, we output 0.
            y[o] = 0
            mask[o] = -1
            total = 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    total = total + x[h * g.width + w]
                    if total >= threshold:
                        y[o] = x[h * g.width + w]
                        mask[o] = h * g.width + w
                        break
                if mask[o] >= 0:
                    break


def stochastic_forward(const real[:, ::1] x, const real[:, ::1] uniform, real[:, ::1] y, int[:, ::1] mask,
                       tuple geometry):
    """TRAIN: each window outputs one of its inputs, drawn with probability proportional to it (inputs are
    meant to be nonnegative) by `uniform` (one draw in [0, 1] per output); mask = the drawn position."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], y.shape[0], y.shape[1], &g)
    if mask.shape[0] != y.shape[0] or mask.shape[1] != y.shape[1] or uniform.shape[0] != y.shape[0] \
            or uniform.shape[1] != y.shape[1]:
        raise ValueError("stochastic_forward: the draws and the mask must be shaped like the output")
    cdef Py_ssize_t p
    if y.shape[1] == 0:
        return
    with nogil:
        for p in prange(y.shape[0], schedule="static"):
            _stochastic_plane(&x[p, 0], &uniform[p, 0], &y[p, 0], &mask[p, 0], &g)


cdef void _stochastic_test_plane(const real* x, real* y, const real* dy, real* dx, const Geometry* g,
                                 bint backward, bint accumulate) noexcept nogil:
    cdef int ph, pw, h, w, hstart, hend, wstart, wend, i, o
    cdef real total, squares, v, out, scale
    if backward and not accumulate:
        for i in range(g.height * g.width):
            dx[i] = 0
    for ph in range(g.pooled_h):
        hstart = ph * g.stride_h
        hend = min(hstart + g.kernel_h, g.height)
        for pw in range(g.pooled_w):
            wstart = pw * g.stride_w
            wend = min(wstart + g.kernel_w, g.width)
            o = ph * g.pooled_w + pw
            # Caffe's StoPoolForwardTest starts the sum at FLT_MIN, so that an all-zero window gives 0.
            total = FLT_MIN
            squares = 0
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    v = x[h * g.width + w]
                    total = total + v
                    squares = squares + v * v
            out = squares / total
            if not backward:
                y[o] = out
                continue
            # d(sum x^2 / sum x)/dx_i = (2 x_i - out) / sum x
            scale = dy[o] / total
            for h in range(hstart, hend):
                for w in range(wstart, wend):
                    i = h * g.width + w
                    dx[i] += scale * (2 * x[i] - out)


def stochastic_forward_test(const real[:, ::1] x, real[:, ::1] y, tuple geometry):
    """TEST: each window outputs its inputs weighted by themselves, sum(x^2) / sum(x)."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], y.shape[0], y.shape[1], &g)
    cdef Py_ssize_t p
    if y.shape[1] == 0:
        return
    with nogil:
        for p in prange(y.shape[0], schedule="static"):
            _stochastic_test_plane(&x[p, 0], &y[p, 0], NULL, NULL, &g, False, False)


def stochastic_test_backward(const real[:, ::1] x, const real[:, ::1] dy, real[:, ::1] dx, tuple geometry,
                             bint accumulate=False):
    """The exact gradient of stochastic_forward_test (Caffe's GPU backward reuses stale TRAIN draws instead)."""
    cdef Geometry g
    _geometry(geometry, x.shape[0], x.shape[1], dy.shape[0], dy.shape[1], &g)
    if dx.shape[0] != x.shape[0] or dx.shape[1] != x.shape[1]:
        raise ValueError("stochastic_test_backward: the input diff must be shaped like the input")
    cdef Py_ssize_t p
    if dx.shape[1] == 0:
        return
    with nogil:
        for p in prange(dx.shape[0], schedule="static"):
            _stochastic_test_plane(&x[p, 0], NULL, &dy[p, 0], &dx[p, 0], &g, True, accumulate)
