"""Builds the Cython CPU kernels under csrc/ as extension modules of pycaffe_dist._kernels (see pyproject.toml).

The kernels use OpenMP (prange over images and channels, and over blocks of a GEMM: csrc/gemm.pyx);
pycaffe_dist.common.set_num_threads sets the thread count. PYCAFFE_DIST_KERNELS=a,b limits a build to those modules (tools/build_kernel.sh).

The kernels are compiled for the building machine's CPU (-march=native: AVX2/AVX-512 where it has them), as the
package is built where it runs. PYCAFFE_DIST_MARCH sets another target, e.g. x86-64-v2 for a wheel that other
machines install. PCD_SIMD=avx2 builds without AVX-512 (-mno-avx512f) on a machine that has it: the kernels then
take their AVX2 paths only, as on an AVX2 machine (to measure or test those; a build with AVX-512 holds the AVX2
GEMM too, and conv_fused.set_simd switches between them at run time). -ffp-contract=off keeps a * b + c two
roundings, as Caffe's x86-64 build computes it, so that FMA does not move results away from Caffe's.

The CUDA kernels (csrc/cuda/*.cu) are built after the extensions by pycaffe_dist/backend/kernel_source.py: always
for the host (the emulated device of the tests), and with nvcc into fatbins where nvcc is found (set
PYCAFFE_DIST_NVCC=0 to skip that). Without nvcc the package still installs and computes on the CPU.
"""
import importlib.util
import os
import pathlib
import re

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CSRC = pathlib.Path(__file__).parent / "csrc"
only = {s for s in os.environ.get("PYCAFFE_DIST_KERNELS", "").split(",") if s}
march = os.environ.get("PYCAFFE_DIST_MARCH", "native")
simd = os.environ.get("PCD_SIMD", "")
if simd not in ("", "native", "avx2"):
    raise SystemExit("setup.py: PCD_SIMD=%r: use avx2 (no AVX-512), or leave it unset" % simd)
simd_flags = ["-mno-avx512f"] if simd == "avx2" else []


def _headers(pyx):
    """The csrc headers a module reaches: named in its .pyx or in a .pxi it includes, or included by such a header.
    They are the extension's depends, so that editing one rebuilds the modules that use it (cythonize adds only the
    headers named in the Cython sources)."""
    found, todo = set(), [pyx]
    while todo:
        for name in re.findall(r'(?:include|extern from)\s+"([^"]+)"', todo.pop().read_text()):
            path = CSRC / name
            if path.exists() and path not in found:
                found.add(path)
                todo.append(path)
    return sorted(str(path.relative_to(CSRC.parent)) for path in found if path.suffix == ".h")


extensions = [
    Extension("pycaffe_dist._kernels.%s" % pyx.stem, [str(pyx.relative_to(CSRC.parent))],
              include_dirs=[np.get_include(), str(CSRC)], depends=_headers(pyx),
              extra_compile_args=["-O3", "-fopenmp", "-march=" + march, "-ffp-contract=off"] + simd_flags,
              extra_link_args=["-fopenmp"],
              define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])
    for pyx in sorted(CSRC.glob("*.pyx")) if not only or pyx.stem in only
]



def _kernel_source():
    path = pathlib.Path(__file__).parent / "pycaffe_dist" / "backend" / "kernel_source.py"
    spec = importlib.util.spec_from_file_location("kernel_source", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithCudaKernels(build_ext):
    def run(self):
        super().run()
        ks = _kernel_source()
        out = ks.BUILD_DIR if self.inplace else pathlib.Path(self.build_lib) / "pycaffe_dist" / "_kernels" / "cuda"
        print("building the CUDA kernels for the host (emulated device) into %s" % out)
        ks.build_host_library(out / ks.HOST_LIBRARY.name)
        nvcc = ks.find_nvcc() if os.environ.get("PYCAFFE_DIST_NVCC", "1") != "0" else None
        if nvcc:
            print("building the CUDA kernels with %s for sm_%s" % (nvcc, ", sm_".join(map(str, ks.nvcc_archs(nvcc)))))
            ks.build_fatbins(out, nvcc)
        else:
            print("nvcc not found: the CUDA kernels are not built; the package computes on the CPU")


setup(ext_modules=cythonize(extensions, language_level=3, compiler_directives={
    "boundscheck": False, "wraparound": False, "cdivision": True, "initializedcheck": False}),
      cmdclass={"build_ext": BuildWithCudaKernels})
