"""The compute backends, below everything that holds data: the CPU kernels (numpy, our Cython kernels of
pycaffe_dist._kernels, BLAS) and the GPU devices (device.py: the interface; cuda.py: pycuda and nvcc's kernels;
emulated.py: the same kernels on the host, for tests) with select.py, which opens the process's device."""
