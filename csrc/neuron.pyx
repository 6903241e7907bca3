# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Element-wise CPU kernels of the neuron layers, after the loops of Caffe's Forward_cpu / Backward_cpu: one pass
where numpy needs several. Wrappers and the choice between these and numpy: pycaffe_dist/backend/neuron.py.

Arrays are flat and C-contiguous, all of one dtype (float32 or float64, fused `real`). Each loop reads element i
of its inputs before it writes element i of its output, so an output may be one of the inputs (in-place layers; a
top diff that is also the bottom diff). Arithmetic is in the arrays' dtype; parameters come as Python floats and
are rounded to the dtype first, as Caffe holds them as Dtype. Loop bodies select between values that are already
computed (`dy * (1 if x > 0 else slope)`, std::max as `0 if v < 0 else v`), a form the C compiler turns into SIMD
selects: a branch on random signs would mispredict every other element. (Caffe's `dy * ((x > 0) + slope * (x <= 0))`
gives the same values except for a NaN x, where it gives 0.) There are no libm calls: exp / tanh / log / pow come
from numpy's SIMD loops (a scalar expf is several times slower), these kernels fuse what surrounds them.
Arrays longer than GRAIN are split over the OpenMP threads.
"""
from cython.parallel cimport prange

ctypedef fused real:
    float
    double

cdef enum:
    GRAIN = 32768   # elements below which one thread does the loop: starting the team would cost more


# Literals are cast to `real`: Cython writes a bare 0 or 1 as a C double, which would turn float arithmetic into
# double arithmetic (different rounding from Caffe's, and no SIMD).

cdef inline real _max0(real v) noexcept nogil:
    """std::max(v, 0)."""
    return <real>0 if v < 0 else v


cdef inline real _min0(real v) noexcept nogil:
    """std::min(v, 0)."""
    return <real>0 if 0 < v else v


# --- ReLU, PReLU, ELU -------------------------------------------------------------------------------------------

def relu_forward(const real[::1] x, real[::1] y, double negative_slope):
    """y = max(x, 0) + negative_slope * min(x, 0), with std::max / std::min's comparisons."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real s = <real>negative_slope, v
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        v = x[i]
        y[i] = _max0(v) + s * _min0(v)


def relu_backward(const real[::1] x, const real[::1] dy, real[::1] dx, double negative_slope):
    """dx = dy * ((x > 0) + negative_slope * (x <= 0))."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real s = <real>negative_slope
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        dx[i] = dy[i] * (<real>1 if x[i] > 0 else s)


def prelu_forward(const real[::1] x, real[::1] y, const real[::1] slope, Py_ssize_t channels, Py_ssize_t dim):
    """x, y: (num, channels, dim) flattened; y = max(x, 0) + slope[c] * min(x, 0), one slope per channel, or
    slope[0] for every channel when `slope` has one element (channel_shared)."""
    cdef Py_ssize_t rows = x.shape[0] // dim if dim else 0, r, i
    cdef bint shared = slope.shape[0] == 1
    cdef real a, v
    for r in prange(rows, nogil=True, schedule="static", use_threads_if=x.shape[0] > GRAIN):
        a = slope[0 if shared else r % channels]
        for i in range(r * dim, (r + 1) * dim):
            v = x[i]
            y[i] = _max0(v) + a * _min0(v)


def prelu_backward(const real[::1] x, const real[::1] dy, const real[::1] slope, real[::1] dx, Py_ssize_t channels,
                   Py_ssize_t dim):
    """dx = dy * ((x > 0) + slope[c] * (x <= 0)), slopes as in prelu_forward."""
    cdef Py_ssize_t rows = x.shape[0] // dim if dim else 0, r, i
    cdef bint shared = slope.shape[0] == 1
    cdef real a
    for r in prange(rows, nogil=True, schedule="static", use_threads_if=x.shape[0] > GRAIN):
        a = slope[0 if shared else r % channels]
        for i in range(r * dim, (r + 1) * dim):
            dx[i] = dy[i] * (<real>1 if x[i] > 0 else a)


def elu_forward(const real[::1] x, const real[::1] e, real[::1] y, double alpha):
    """y = max(x, 0) + alpha * (e - 1), where e = exp(min(x, 0)) comes from numpy."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real a = <real>alpha, v
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        v = x[i]
        y[i] = _max0(v) + a * (e[i] - <real>1)


def elu_backward(const real[::1] x, const real[::1] y, const real[::1] dy, real[::1] dx, double alpha):
    """dx = dy * ((x > 0) + (alpha + y) * (x <= 0))."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real a = <real>alpha, t
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        t = a + y[i]
        dx[i] = dy[i] * (<real>1 if x[i] > 0 else t)


# --- Sigmoid, TanH, Swish, BNLL -------------------------------------------------------------------------------

def sigmoid_backward(const real[::1] y, const real[::1] dy, real[::1] dx):
    """dx = dy * y * (1 - y)."""
    cdef Py_ssize_t i, n = y.shape[0]
    cdef real v
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        v = y[i]
        dx[i] = dy[i] * v * (<real>1 - v)


def tanh_backward(const real[::1] y, const real[::1] dy, real[::1] dx):
    """dx = dy * (1 - y^2)."""
    cdef Py_ssize_t i, n = y.shape[0]
    cdef real v
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        v = y[i]
        dx[i] = dy[i] * (<real>1 - v * v)


def swish_backward(const real[::1] y, const real[::1] sig, const real[::1] dy, real[::1] dx, double beta):
    """dx = dy * (beta * y + sig * (1 - beta * y)), sig = sigmoid(beta * x) kept by the forward."""
    cdef Py_ssize_t i, n = y.shape[0]
    cdef real b = <real>beta, by
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        by = b * y[i]
        dx[i] = dy[i] * (by + sig[i] * (<real>1 - by))


def bnll_forward(const real[::1] x, const real[::1] e, const real[::1] log_1pe, real[::1] y):
    """y = max(x, 0) + log1p(e), Caffe's x > 0 ? x + log(1 + e^-x) : log(1 + e^x) in one formula, given
    e = exp(-|x|) and log_1pe = log(1 + e) from numpy (whose log1p has no SIMD loop). log1p(e) is recovered
    from the log as l * e / ((1 + e) - 1), exact to a few ulps (Goldberg), and is e where 1 + e rounds to 1."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real u, v, d, q
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        u = x[i]    # loaded first: GCC then selects without a branch (the loop has divisions, it is not SIMD)
        v = e[i]
        d = (<real>1 + v) - <real>1
        q = log_1pe[i] * (v / (<real>1 if d == 0 else d))
        q = v if d == 0 else q
        y[i] = _max0(u) + q


def bnll_backward(const real[::1] e, const real[::1] dy, real[::1] dx):
    """dx = dy * e / (e + 1), given e = exp(min(x, 50)) (Caffe's kBNLL_THRESHOLD) from numpy."""
    cdef Py_ssize_t i, n = e.shape[0]
    cdef real v
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        v = e[i]
        dx[i] = dy[i] * v / (v + <real>1)


# --- AbsVal, Clip -----------------------------------------------------------------------------------------------

def absval_backward(const real[::1] x, const real[::1] dy, real[::1] dx):
    """dx = dy * sign(x), sign(0) = 0 (caffe_cpu_sign)."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real v
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        v = x[i]
        dx[i] = dy[i] * ((0 < v) - (v < 0))


def clip_forward(const real[::1] x, real[::1] y, double lo, double hi):
    """y = std::max(lo, std::min(x, hi)), in std's comparison order (so NaN gives lo, as in Caffe)."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real a = <real>lo, b = <real>hi, v
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        v = x[i]
        v = b if b < v else v
        y[i] = v if a < v else a


def clip_backward(const real[::1] x, const real[::1] dy, real[::1] dx, double lo, double hi):
    """dx = dy * (lo <= x <= hi)."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real a = <real>lo, b = <real>hi, v
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        v = x[i]
        dx[i] = dy[i] * ((v >= a) & (v <= b))


# --- Power, Exp, Log ------------------------------------------------------------------------------------------

def power_backward(const real[::1] x, const real[::1] y, const real[::1] dy, real[::1] dx, double power,
                   double scale, double shift):
    """dx = dy * d/dx (scale * x + shift) ^ power, by Caffe's formulas, with diff_scale = power * scale:
    power 2: (diff_scale * scale) * x + diff_scale * shift; shift 0: power * y / x; else
    diff_scale * y / (scale * x + shift). (Power 1 and diff_scale 0 have constant derivatives: numpy does them.)"""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real p = <real>power, a = <real>scale, b = <real>shift
    cdef real diff_scale = p * a, linear = diff_scale * a, constant = diff_scale * b
    if p == 2:
        for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
            dx[i] = dy[i] * (linear * x[i] + constant)
    elif b == 0:
        for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
            dx[i] = dy[i] * (p * (y[i] / x[i]))
    else:
        for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
            dx[i] = dy[i] * (diff_scale * (y[i] / (a * x[i] + b)))


def log_backward(const real[::1] x, const real[::1] dy, real[::1] dx, double scale, double shift,
                 double numerator):
    """dx = dy * (numerator * (scale * x + shift) ^ -1)."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef real a = <real>scale, b = <real>shift, c = <real>numerator
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        dx[i] = dy[i] * (c * (<real>1 / (a * x[i] + b)))


def scaled_product(const real[::1] u, const real[::1] v, real[::1] out, double scale):
    """out = u * v * scale (Exp's backward: top * top diff * inner scale)."""
    cdef Py_ssize_t i, n = u.shape[0]
    cdef real s = <real>scale
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        out[i] = u[i] * v[i] * s


# --- Dropout ----------------------------------------------------------------------------------------------------

def dropout(const real[::1] x, const float[::1] rand, real[::1] y, double keep, double scale):
    """y = x * mask * scale with mask = (rand < keep): Caffe's Bernoulli(keep) mask from uniform draws in [0, 1).
    The forward (x = bottom data) and the backward (x = top diff) use the same draws."""
    cdef Py_ssize_t i, n = x.shape[0]
    cdef float k = <float>keep
    cdef real s = <real>scale
    for i in prange(n, nogil=True, schedule="static", use_threads_if=n > GRAIN):
        y[i] = x[i] * (s if rand[i] < k else <real>0)
