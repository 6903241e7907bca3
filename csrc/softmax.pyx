# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Softmax over the channel axis of a C-contiguous (outer, channels, inner) array, as Caffe's softmax_layer.cpp:

    forward   y = exp(x - max_c x) / sum_c exp(x - max_c x)
    backward  dx = (dy - sum_c(dy * y)) * y

With inner == 1 (scores of shape (N, C)) each task is one contiguous row. Otherwise a task is one outer index
and up to BLOCK consecutive inner positions, so the channel loop runs over contiguous runs of `inner` values (as
Caffe's does) and the per-position max / sum / dot stay on the stack. Tasks run in parallel under OpenMP. In
place (y is x, dx is dy) is safe: every element is read before it is written.

exp is libm's expf / exp one element at a time, which is what Caffe's CPU build without MKL runs (caffe_exp ->
std::exp); numpy's SIMD exp is faster on long rows but differs in the last bits.
Python wrapper: pycaffe_dist/backend/softmax.py.
"""
from cython.parallel cimport prange
from libc.float cimport FLT_MIN as FLT_MIN_
from libc.math cimport exp, expf, log, logf

ctypedef fused real:
    float
    double

cdef enum:
    BLOCK = 256            # inner positions per task
    MIN_PARALLEL = 32768   # below this many elements one thread is faster than waking the others


cdef inline real _exp(real v) noexcept nogil:
    if real is float:
        return expf(v)
    else:
        return exp(v)


cdef inline real _log(real v) noexcept nogil:
    if real is float:
        return logf(v)
    else:
        return log(v)


cdef void _forward_row(const real* x, real* y, Py_ssize_t channels) noexcept nogil:
    cdef Py_ssize_t c
    cdef real top = x[0], total = 0, v
    for c in range(1, channels):
        if top < x[c]:         # std::max(top, x[c]), NaN handling included
            top = x[c]
    for c in range(channels):
        v = _exp(x[c] - top)
        y[c] = v
        total += v
    for c in range(channels):
        y[c] /= total


cdef void _backward_row(const real* y, const real* dy, real* dx, Py_ssize_t channels) noexcept nogil:
    cdef Py_ssize_t c
    cdef real dot = 0
    for c in range(channels):
        dot += dy[c] * y[c]
    for c in range(channels):
        dx[c] = (dy[c] - dot) * y[c]


cdef void _forward_block(const real* x, real* y, Py_ssize_t channels, Py_ssize_t inner,
                         Py_ssize_t n) noexcept nogil:
    cdef real top[BLOCK]
    cdef real total[BLOCK]
    cdef Py_ssize_t c, k
    cdef real v
    for k in range(n):
        top[k] = x[k]
        total[k] = 0
    for c in range(1, channels):
        for k in range(n):
            v = x[c * inner + k]
            if top[k] < v:     # std::max(top, v), NaN handling included
                top[k] = v
    for c in range(channels):
        for k in range(n):
            v = _exp(x[c * inner + k] - top[k])
            y[c * inner + k] = v
            total[k] += v
    for c in range(channels):
        for k in range(n):
            y[c * inner + k] /= total[k]


cdef void _backward_block(const real* y, const real* dy, real* dx, Py_ssize_t channels, Py_ssize_t inner,
                          Py_ssize_t n) noexcept nogil:
    cdef real dot[BLOCK]
    cdef Py_ssize_t c, k
    for k in range(n):
        dot[k] = 0
    for c in range(channels):
        for k in range(n):
            dot[k] += dy[c * inner + k] * y[c * inner + k]
    for c in range(channels):
        for k in range(n):
            dx[c * inner + k] = (dy[c * inner + k] - dot[k]) * y[c * inner + k]


def _check(name, shape, expected):
    if tuple(shape[:3]) != tuple(expected[:3]):
        raise ValueError("softmax: %s has shape %s, expected %s" % (name, tuple(shape[:3]), tuple(expected[:3])))


def forward(const real[:, :, ::1] x, real[:, :, ::1] y):
    """y = softmax of x over axis 1; x and y may be the same array."""
    _check("y", y.shape, x.shape)
    cdef Py_ssize_t outer = x.shape[0], channels = x.shape[1], inner = x.shape[2]
    if outer == 0 or channels == 0 or inner == 0:
        return
    cdef Py_ssize_t blocks = (inner + BLOCK - 1) // BLOCK, t, off, k0, plane = channels * inner
    cdef const real* xp = &x[0, 0, 0]
    cdef real* yp = &y[0, 0, 0]
    for t in prange(outer * blocks, nogil=True, schedule="static",
                  use_threads_if=outer * plane >= MIN_PARALLEL):
        k0 = (t % blocks) * BLOCK
        off = (t // blocks) * plane + k0
        if inner == 1:
            _forward_row(xp + off, yp + off, channels)
        else:
            _forward_block(xp + off, yp + off, channels, inner, min(<Py_ssize_t>BLOCK, inner - k0))


def backward(const real[:, :, ::1] y, const real[:, :, ::1] dy, real[:, :, ::1] dx):
    """dx = (dy - sum over axis 1 of dy * y) * y; dx may be the same array as dy."""
    _check("dy", dy.shape, y.shape)
    _check("dx", dx.shape, y.shape)
    cdef Py_ssize_t outer = y.shape[0], channels = y.shape[1], inner = y.shape[2]
    if outer == 0 or channels == 0 or inner == 0:
        return
    cdef Py_ssize_t blocks = (inner + BLOCK - 1) // BLOCK, t, off, k0, plane = channels * inner
    cdef const real* yp = &y[0, 0, 0]
    cdef const real* dyp = &dy[0, 0, 0]
    cdef real* dxp = &dx[0, 0, 0]
    for t in prange(outer * blocks, nogil=True, schedule="static",
                  use_threads_if=outer * plane >= MIN_PARALLEL):
        k0 = (t % blocks) * BLOCK
        off = (t // blocks) * plane + k0
        if inner == 1:
            _backward_row(yp + off, dyp + off, dxp + off, channels)
        else:
            _backward_block(yp + off, dyp + off, dxp + off, channels, inner, min(<Py_ssize_t>BLOCK, inner - k0))


cdef inline int _label(real value, Py_ssize_t channels, bint has_ignore, int ignore) noexcept nogil:
    # static_cast<int>(value) as Caffe reads a label; -1 for ignore_label, -2 for one outside [0, channels)
    if not (value > -2147483649.0 and value < 2147483648.0):    # NaN or beyond int: refused, not cast
        return -2
    cdef int label = <int>value
    if has_ignore and label == ignore:
        return -1
    return label if 0 <= label < channels else -2


def _check_labels(name, Py_ssize_t labels, Py_ssize_t positions):
    if labels != positions:
        raise ValueError("%s: %d labels for %d positions" % (name, labels, positions))


def loss_forward(const real[:, :, ::1] prob, const real[::1] labels, bint has_ignore, int ignore):
    """SoftmaxWithLoss's forward sum (softmax_loss_layer.cpp): loss -= log(max(prob[i, label, j], FLT_MIN)) over
    positions i (outer), j (inner) in Caffe's order and precision, skipping ignore_label. Returns (loss, count of
    positions counted, position of the first label outside [0, channels) or -1); at a bad label it stops."""
    cdef Py_ssize_t outer = prob.shape[0], channels = prob.shape[1], inner = prob.shape[2], i, j, bad = -1
    cdef Py_ssize_t count = 0
    cdef real loss = 0, p
    cdef int label
    _check_labels("loss_forward", labels.shape[0], outer * inner)
    with nogil:
        for i in range(outer):
            for j in range(inner):
                label = _label(labels[i * inner + j], channels, has_ignore, ignore)
                if label == -2:
                    bad = i * inner + j
                    break
                if label == -1:
                    continue
                p = prob[i, label, j]
                loss -= _log(<real>FLT_MIN_ if p < FLT_MIN_ else p)     # std::max(p, FLT_MIN), NaN kept
                count += 1
            if bad >= 0:
                break
    return loss, count, bad


def loss_backward(const real[:, :, ::1] prob, const real[::1] labels, bint has_ignore, int ignore,
                  real[:, :, ::1] diff):
    """diff = prob, minus 1 at each position's label, all channels 0 at ignored positions (softmax_loss_layer.cpp's
    Backward_cpu before its scaling). Labels were checked by loss_forward. Returns the count of positions counted."""
    _check("diff", diff.shape, prob.shape)
    cdef Py_ssize_t outer = prob.shape[0], channels = prob.shape[1], inner = prob.shape[2], i, j, c, count = 0
    cdef int label
    _check_labels("loss_backward", labels.shape[0], outer * inner)
    with nogil:
        for i in range(outer):
            for c in range(channels):
                for j in range(inner):
                    diff[i, c, j] = prob[i, c, j]
            for j in range(inner):
                label = _label(labels[i * inner + j], channels, has_ignore, ignore)
                if label >= 0:
                    diff[i, label, j] -= 1
                    count += 1
                else:
                    for c in range(channels):
                        diff[i, c, j] = 0
    return count
