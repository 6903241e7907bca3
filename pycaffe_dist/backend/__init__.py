"""Array backends: the CPU one (numpy + the Cython kernels of pycaffe_dist._kernels) and, later, CUDA."""
