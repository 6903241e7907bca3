"""The vector path of the CPU kernels built on csrc/sgemm.h (the float32 convolutions of conv_fused and the float32
GEMMs of gemm, for InnerProduct): AVX-512 where the build targets it, else AVX2 (setup.py's PCD_SIMD=avx2 builds
without AVX-512). A build with AVX-512 holds both paths; `use` switches every module, so that the tests check
both, and the bench can say which one ran."""
from .._kernels import conv_fused as _fused
from .._kernels import gemm as _gemm

_MODULES = (_fused, _gemm)


def paths():
    """The paths this build holds, widest last: ("avx2", "avx512"), ("avx2",), or () without AVX2/FMA."""
    return _fused.simd_paths()


def current():
    """The path the kernels take now ("avx512" or "avx2"; None without AVX2/FMA)."""
    return _fused.simd() if paths() else None


def use(name):
    """Makes every sgemm.h module take path `name` (one of paths()); returns the previous one."""
    before = current()
    for module in _MODULES:
        module.set_simd(name)
    return before
