# cython: language_level=3
"""The OpenMP thread count of the kernels (pycaffe_dist.common.set_num_threads sets it with the BLAS's)."""
cimport openmp


def set_num_threads(int n):
    openmp.omp_set_num_threads(max(1, n))


def get_num_threads():
    return openmp.omp_get_max_threads()
