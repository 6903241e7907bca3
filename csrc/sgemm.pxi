# sgemm.h's GEMM for the modules that call it (conv_fused.pyx, gemm.pyx): its declarations, the operand and result
# builders, and the choice of its vector path (each module that includes sgemm.h holds its own pcd_simd:
# pycaffe_dist/backend/simd.py sets them all).
from libc.stddef cimport ptrdiff_t


cdef extern from "sgemm.h" nogil:
    ctypedef struct pcd_operand:
        const float* base
        const ptrdiff_t* row
        const ptrdiff_t* col
    ctypedef struct pcd_result:
        float* base
        const ptrdiff_t* row
        const ptrdiff_t* col
        const float* row_bias
        int accumulate
    enum: PCD_SGEMM, PCD_SGEMM_AVX512, PCD_NR_ALIGN, PCD_SIMD_AVX2, PCD_SIMD_AVX512
    int pcd_simd   # the path pcd_sgemm takes in this module
    size_t PCD_SGEMM_PACK_FLOATS
    void pcd_sgemm(int m, int n, int k, pcd_operand a, const float* a_packed, pcd_operand b, pcd_result c,
                   float* pack)
    size_t pcd_packed_a_floats(int m, int k)
    void pcd_pack_a_all(int m, int k, pcd_operand a, float* dst)


def simd_paths():
    """The vector paths this build holds ("avx2", and "avx512" where it was compiled for AVX-512), widest last."""
    if not PCD_SGEMM:
        return ()
    return ("avx2", "avx512") if PCD_SGEMM_AVX512 else ("avx2",)


def simd():
    """The path the kernels take now: the widest built, unless set_simd chose another."""
    return "avx512" if PCD_SGEMM and pcd_simd == PCD_SIMD_AVX512 else "avx2"


def set_simd(name):
    """Makes this module's kernels take `name` (one of simd_paths()): the tests check every path a build holds
    (pycaffe_dist.backend.simd.use sets every module's). Returns the previous one."""
    global pcd_simd
    if name not in simd_paths():
        raise ValueError("set_simd: %r is not built here (paths: %s)" % (name, ", ".join(simd_paths())))
    before = simd()
    pcd_simd = PCD_SIMD_AVX512 if name == "avx512" else PCD_SIMD_AVX2
    return before


cdef inline pcd_operand _operand(const float* base, const ptrdiff_t* row, const ptrdiff_t* col) noexcept nogil:
    cdef pcd_operand o
    o.base = base
    o.row = row
    o.col = col
    return o


cdef inline pcd_result _result(float* base, const ptrdiff_t* row, const ptrdiff_t* col, const float* bias,
                               int accumulate) noexcept nogil:
    cdef pcd_result r
    r.base = base
    r.row = row
    r.col = col
    r.row_bias = bias
    r.accumulate = accumulate
    return r
