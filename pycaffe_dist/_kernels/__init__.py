"""Compiled Cython kernels (built from csrc/*.pyx by setup.py)."""
