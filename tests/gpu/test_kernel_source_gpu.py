"""nvcc compiles every csrc/cuda source into a fatbin for every architecture we ship (where nvcc exists)."""
import pytest

from pycaffe_dist.backend import kernel_source

NVCC = kernel_source.find_nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed: the GPU build cannot be checked here")
def test_nvcc_compiles_every_kernel_source(tmp_path):
    built = kernel_source.build_fatbins(tmp_path, NVCC)
    assert sorted(p.stem for p in built) == sorted(p.stem for p in kernel_source.sources())
    for fatbin in built:
        assert fatbin.stat().st_size > 0
    archs = kernel_source.nvcc_archs(NVCC)
    assert archs and max(archs) == 90, "sm_90 (H100) must be among the architectures built: %s" % archs
