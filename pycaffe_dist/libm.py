"""The C math library's pow, powf, exp and expf, for the numbers that must be Caffe's float for float.

Caffe computes its learning rates with std::pow and std::exp, which are the C library's (glibc's libm on the
machines Caffe's goldens came from). numpy's own pow and exp are not: numpy dispatches vectorised versions of
its own (AVX2, AVX-512/SVML) by CPU, which differ from libm by an ulp on some inputs, so a rate computed with
numpy would differ from Caffe's on some CPUs and not on others. Calling libm through ctypes gives the same
float on every x86-64 CPU. One call per iteration, so ctypes' microsecond is nothing.
"""

import ctypes
import ctypes.util

import numpy as np

# find_library("m") names glibc's libm.so.6; where there is none (musl folds libm into libc) the symbols of the
# running process, which links the C library's maths for Python's own math module, hold them.
_LIBM = ctypes.CDLL(ctypes.util.find_library("m") or None)


def _function(name, ctype):
    function = getattr(_LIBM, name)
    function.restype = ctype
    function.argtypes = [ctype] * (2 if name.startswith("pow") else 1)
    return function


_powf, _expf = _function("powf", ctypes.c_float), _function("expf", ctypes.c_float)
_pow, _exp = _function("pow", ctypes.c_double), _function("exp", ctypes.c_double)


def powf(base, exponent):
    """C's powf(float, float) (std::pow of two floats): a float32; inf past the range, NaN for a negative base
    and a fractional exponent, as C (math.pow raises instead)."""
    return np.float32(_powf(float(np.float32(base)), float(np.float32(exponent))))


def expf(x):
    """C's expf(float) (std::exp of a float): a float32."""
    return np.float32(_expf(float(np.float32(x))))


def pow(base, exponent):        # noqa: A001 - C's name, on purpose
    """C's pow(double, double) (also std::pow(float, int), which promotes to double): a Python float."""
    return _pow(float(base), float(exponent))


def exp(x):
    """C's exp(double): a Python float."""
    return _exp(float(x))
