"""Builds the Cython CPU kernels under csrc/ as extension modules of pycaffe_dist._kernels (see pyproject.toml)."""
import pathlib

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

CSRC = pathlib.Path(__file__).parent / "csrc"
extensions = [
    Extension("pycaffe_dist._kernels.%s" % pyx.stem, [str(pyx.relative_to(CSRC.parent))],
              include_dirs=[np.get_include()], extra_compile_args=["-O3"],
              define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])
    for pyx in sorted(CSRC.glob("*.pyx"))
]

setup(ext_modules=cythonize(extensions, language_level=3, compiler_directives={
    "boundscheck": False, "wraparound": False, "cdivision": True, "initializedcheck": False}))
