# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""float32 2-D convolution passes whose GEMMs read the images and the output diffs in place (sgemm.h): no unrolled
column buffer and no layout transposes in the forward and the weight gradient.

run() makes conv_im2col.run's passes (the same arguments but force_nd, and the same meaning: see that module's
docstring); pycaffe_dist/backend/conv.py sends float32 2-D geometries here where fused_available(), everything
else to conv_im2col. sgemm.h's GEMM addresses its operands through offset tables, built once per geometry and
chunk (_tables). Layers with few weight columns per output sum their forward and weight gradient straight from the
images instead (conv_direct.h). The input diff is either W^T y's columns folded into the image as col2im does
(conv_pass.pxi's _fold; fold8.h's registers for maps of up to 8 output columns), or, for stride-1 convolutions
where that is cheaper, the padded output diff correlated with the flipped kernel. Threads take whole chunks; one
chunk (a batch of one, or few large images) has its GEMMs' columns split between them instead.
"""
from cython.parallel cimport prange, threadid
from libc.stdlib cimport free, malloc
import numpy as np

ctypedef fused real:   # conv_pass.pxi's helpers, in float32 only here
    float

include "im2col_geometry.pxi"
include "conv_pass.pxi"


include "sgemm.pxi"


cdef extern from "conv_direct.h" nogil:
    ctypedef struct pcd_dw_sums:
        const float* y
        const float* im
        const ptrdiff_t* tap
        ptrdiff_t y_image, y_channel, im_image, im_row
        int images, rows, cols
    void pcd_dw_direct(const pcd_dw_sums* s, int m_count, int t_lo, int t_hi, float* dw, ptrdiff_t dw_row)
    ctypedef struct pcd_forward_sums:
        const float* w
        const float* bias
        const float* im
        const ptrdiff_t* tap
        float* y
        ptrdiff_t y_image, y_channel, im_image, im_row
        int outputs, kg, rows, cols
    void pcd_forward_direct(const pcd_forward_sums* s, int images)


cdef extern from "thread_buffer.h" nogil:
    # this thread's buffer of at least `floats` floats, kept for the thread's life (slot 0: sgemm.h's packing
    # space, slot 1: padded images, slot 2: padded output diffs)
    float* pcd_thread_buffer(int slot, size_t floats)


def fused_available():
    """Whether this build has sgemm.h's AVX2/FMA GEMM (else float32 convolutions take conv_im2col's BLAS path)."""
    return bool(PCD_SGEMM)


cdef struct Fused:
    # The tables of one call: element (i, j) of an operand is base[row[i] + col[j]] (sgemm.h).
    const ptrdiff_t* iota          # 0, 1, 2, ...
    const ptrdiff_t* im_row        # im2col row r = (c, kh, kw): its offset in a (padded) image
    const ptrdiff_t* im_col        # im2col column n = (image i of the chunk, output position): its offset
    const ptrdiff_t* out_row       # output channel m: m * P
    const ptrdiff_t* out_col       # column n: i * out_channels * P + position
    const ptrdiff_t* w_row         # weight row m of a group: m * kg
    const ptrdiff_t* col_row       # row r of the column buffer: r * col_ld
    const float* w_packed          # forward: each group's W, packed; backward: each group's W^T (or flipped W)
    Py_ssize_t w_packed_group, col_ld   # col_ld: chunk * P (a chunk's columns), or P (one image's at a time)
    int mg, kg, group, out_channels, positions
    # the input diff as a correlation of the padded output diff with the flipped kernel (_dx_direct)
    const ptrdiff_t* dy_row        # row (o, kh, kw): o * Hq * Wq + kh * Wq + kw in the padded output diff
    const ptrdiff_t* dy_col        # column n = (image i, h, w): i * out_channels * Hq * Wq + h * Wq + w
    const ptrdiff_t* dx_row        # input channel c of a group: c * H * W
    const ptrdiff_t* dx_col        # column n: i * C * H * W + h * W + w
    int cg, taps                   # input channels per group, kernel taps
    Py_ssize_t dx_group            # cg * H * W
    # the forward and dW summed straight from the images (conv_direct.h) instead of by the GEMM
    bint fwd_direct, dw_direct
    int out_h, out_w               # output rows and columns of an image
    Py_ssize_t im_image, im_step   # offsets of the next (padded) image, and of the next output row's window


cdef void _dx_direct(const Fused* f, const float* dy_padded, float* dx, Py_ssize_t n_lo, Py_ssize_t n_hi,
                     float* pack) noexcept nogil:
    # dX[c, h, w] = sum over o, kh, kw of dy_padded[o, h + kh, w + kw] W[o, c, K - 1 - kh, K - 1 - kw] for one
    # chunk's input columns [n_lo, n_hi): a stride-1 convolution's input diff with no columns and no col2im
    # (dx: the chunk's input diffs, overwritten; dy_padded: its output diffs with a K - 1 - pad border)
    cdef int g
    if n_hi <= n_lo:
        return
    for g in range(f.group):
        pcd_sgemm(f.cg, <int>(n_hi - n_lo), f.mg * f.taps, _operand(NULL, NULL, NULL),
                  f.w_packed + g * f.w_packed_group,
                  _operand(dy_padded, f.dy_row + g * f.mg * f.taps, f.dy_col + n_lo),
                  _result(dx + g * f.dx_group, f.dx_row, f.dx_col + n_lo, NULL, 0), pack)


cdef void _dw_direct(const Fused* f, const float* im, const float* y, int images, int g, Py_ssize_t r_lo,
                     Py_ssize_t r_hi, float* dw) noexcept nogil:
    # dW_g[:, r_lo:r_hi] += y_g col_g^T for a chunk's images, without packing (conv_direct.h); the chunk starts at
    # its first image (n_lo = 0)
    cdef pcd_dw_sums sums
    sums.y, sums.im, sums.tap = y, im, f.im_row + g * f.kg
    sums.y_image, sums.y_channel = <ptrdiff_t>f.out_channels * f.positions, f.positions
    sums.im_image, sums.im_row = f.im_image, f.im_step
    sums.images, sums.rows, sums.cols = images, f.out_h, f.out_w
    pcd_dw_direct(&sums, f.mg, <int>r_lo, <int>r_hi, dw, f.kg)


cdef void _forward_direct(const Fused* f, const float* im, const float* w, const float* bias, float* out, int g,
                          Py_ssize_t i_lo, Py_ssize_t i_hi) noexcept nogil:
    # out_g = W_g col_g (+ bias) for the chunk's images [i_lo, i_hi), without packing (conv_direct.h)
    cdef pcd_forward_sums sums
    sums.w, sums.bias, sums.tap = w, bias, f.im_row + g * f.kg
    sums.im, sums.im_image, sums.im_row = im + i_lo * f.im_image, f.im_image, f.im_step
    sums.y_image, sums.y_channel = <ptrdiff_t>f.out_channels * f.positions, f.positions
    sums.y = out + i_lo * sums.y_image
    sums.outputs, sums.kg, sums.rows, sums.cols = f.mg, f.kg, f.out_h, f.out_w
    pcd_forward_direct(&sums, <int>(i_hi - i_lo))


cdef void _fused_columns(const Fused* f, const float* im, const float* y, const float* w, const float* bias,
                         float* out, float* dw, float* col, Py_ssize_t col_first, Py_ssize_t n_lo, Py_ssize_t n_hi,
                         Py_ssize_t r_lo, Py_ssize_t r_hi, float* pack) noexcept nogil:
    # One chunk's GEMMs on its columns [n_lo, n_hi) (forward, dcol) and dW's columns [r_lo, r_hi) of each group:
    # out = W col (+ bias) if out; dW += y col^T if dw; col buffer = W^T y if col (which _fold sums into the
    # image diff: summing in the GEMM's stores instead was slower, its overlapping row stores stall), its column
    # 0 holding the chunk's column col_first. im: the chunk's (padded) images, y / out: its output-side arrays.
    cdef int g, mg = f.mg, kg = f.kg
    cdef Py_ssize_t out_group = <Py_ssize_t>mg * f.positions
    for g in range(f.group):
        if out != NULL and n_hi > n_lo and f.fwd_direct and n_lo % f.positions == 0 and n_hi % f.positions == 0:
            _forward_direct(f, im, w + g * mg * kg, bias + g * mg if bias else NULL, out + g * out_group, g,
                            n_lo // f.positions, n_hi // f.positions)
        elif out != NULL and n_hi > n_lo:
            pcd_sgemm(mg, <int>(n_hi - n_lo), kg, _operand(w, f.w_row, f.iota), f.w_packed + g * f.w_packed_group,
                      _operand(im, f.im_row + g * kg, f.im_col + n_lo),
                      _result(out + g * out_group, f.out_row, f.out_col + n_lo, bias + g * mg if bias else NULL, 0),
                      pack)
        if dw != NULL and r_hi > r_lo and f.dw_direct:
            _dw_direct(f, im, y + g * out_group, <int>((n_hi - n_lo) // f.positions), g, r_lo, r_hi,
                       dw + g * mg * kg)
        elif dw != NULL and r_hi > r_lo:
            pcd_sgemm(mg, <int>(r_hi - r_lo), <int>(n_hi - n_lo),
                      _operand(y + g * out_group, f.out_row, f.out_col + n_lo), NULL,
                      _operand(im, f.im_col + n_lo, f.im_row + g * kg + r_lo),
                      _result(dw + g * mg * kg, f.w_row, f.iota + r_lo, NULL, 1), pack)
        if col != NULL and n_hi > n_lo:
            pcd_sgemm(kg, <int>(n_hi - n_lo), mg, _operand(w, f.iota, f.w_row), f.w_packed + g * f.w_packed_group,
                      _operand(y + g * out_group, f.out_row, f.out_col + n_lo),
                      _result(col + g * kg * f.col_ld, f.col_row, f.iota + (n_lo - col_first), NULL, 0), pack)


cdef bint _direct_dx_pays(Fused* f, int* c_im, int* c_col, int* k, int* p, int* s, int* dl):
    # The input diff of a stride-1 convolution can also be computed as a correlation of the output diff, padded
    # by K - 1 - pad, with the flipped kernel: no columns to fold, but its GEMM has the input channels of a group
    # as rows and the input positions as columns. Taken where its multiplies, tile rows rounded up to 6, are no
    # more than W^T y's with the fold counted as 30 % more: "same" convolutions with a few input channels or
    # more (CIFAR-10 quick's conv2 and conv3); not LeNet's unpadded ones (2.25 times more input positions) or
    # a 3-channel first layer.
    cdef double direct_cost = <double>((f.cg + 5) // 6 * 6) * f.mg * f.taps * c_im[1] * c_im[2]
    cdef double columns_cost = 1.3 * ((f.kg + 5) // 6 * 6) * f.mg * f.positions
    return s[0] == 1 and s[1] == 1 and dl[0] == 1 and dl[1] == 1 and k[0] - 1 - p[0] >= 0 and \
        k[1] - 1 - p[1] >= 0 and direct_cost <= columns_cost


cdef int DIRECT_MAX_COLUMNS = 100
cdef int DIRECT16_FEW_COLUMNS = 32
cdef Py_ssize_t DIRECT16_MAX_IMAGE = 32768
cdef bint _few_columns(Fused* f, int* s):
    # conv_direct.h for layers with few weight columns per group (LeNet's conv1: 25, CIFAR-10 quick's: 75), where
    # a GEMM would use each packed value only a few dozen times; its weight gradient ran 0.5x (LeNet conv1) and
    # 0.8x (CIFAR conv1) the GEMM's time, and 1.6x on LeNet's conv2 (500 columns). Its vector loads need output
    # columns that are consecutive image columns (stride 1 along the width) and rows of 8 or more.
    # On the AVX-512 path the GEMM runs twice as fast, the direct sums less so: there they take rows of 16 or more
    # only (conv_direct_avx512.h; SqueezeNet's 13 x 13 expand1x1 ran 2.3x and 1.7x the GEMM's time on the AVX2
    # sums).
    if pcd_simd == PCD_SIMD_AVX512 and f.out_w < 16:
        return False
    return s[1] == 1 and f.kg <= DIRECT_MAX_COLUMNS and f.out_w >= 8


cdef bint _direct_forward(Fused* f, int* s):
    # The forward's direct sums read the whole image once per block of outputs (8 on the AVX-512 path): there,
    # beyond 32 columns, only where an image stays in L2 (CIFAR-10 quick's conv1, 3 x 36 x 36; not GoogLeNet's
    # conv2/3x3_reduce, 64 x 56 x 56, which the GEMM ran in 0.8x the time).
    if not _few_columns(f, s):
        return False
    return pcd_simd != PCD_SIMD_AVX512 or f.kg <= DIRECT16_FEW_COLUMNS or f.im_image <= DIRECT16_MAX_IMAGE


def plan(im_shape, kernel, pad, stride, dilation, int group, int out_channels):
    """How run() computes a float32 2-D geometry's passes, as _run_fused decides (for the bench's tables):
    {"forward": "gemm" or "direct" (conv_direct.h), "dW": the same, "dX": "correlation" (the flipped kernel's
    GEMM), "fold8" (the GEMM's columns summed by fold8.h) or "col2im" (summed row by row)}. With one chunk split
    over threads, a "direct" forward whose thread blocks do not end at an image's end takes the GEMM."""
    cdef int c_im[MAX_AXES]
    cdef int c_col[MAX_AXES]
    cdef int k[MAX_AXES]
    cdef int p[MAX_AXES]
    cdef int s[MAX_AXES]
    cdef int dl[MAX_AXES]
    if _geometry(tuple(im_shape), tuple(kernel), tuple(pad), tuple(stride), tuple(dilation), c_im, c_col, k, p, s,
                 dl) != 2:
        raise ValueError("conv_fused.plan: 2-D images only (C, H, W), got image shape %r" % (tuple(im_shape),))
    cdef Fused f
    f.mg, f.kg, f.group, f.out_channels = out_channels // group, c_col[0] // group, group, out_channels
    f.positions, f.cg, f.taps = c_col[1] * c_col[2], c_im[0] // group, k[0] * k[1]
    f.out_h, f.out_w = c_col[1], c_col[2]
    f.im_image = <Py_ssize_t>c_im[0] * (c_im[1] + 2 * p[0]) * (c_im[2] + 2 * p[1])
    forward = "direct" if _direct_forward(&f, s) else "gemm"
    dw = "direct" if _few_columns(&f, s) else "gemm"
    if _direct_dx_pays(&f, c_im, c_col, k, p, s, dl):
        dx = "correlation"
    elif pcd_fold8_fits(c_col[2], s[1], c_im[2] + 2 * p[1]):
        dx = "fold8"
    else:
        dx = "col2im"
    return {"forward": forward, "dW": dw, "dX": dx}


_TABLES = {}
_TABLES_KEPT = 64   # geometry x chunk entries; a net has a few of each


cdef dict _tables(int* c_im, int* c_col, int* k, int* p, int* s, int* dl, int group, int out_channels,
                  Py_ssize_t chunk, bint direct_dx):
    """_run_fused's offset tables (np.intp: ptrdiff_t here) for one geometry and chunk, built on first use: every
    call of a layer shares them."""
    key = (tuple(c_im[i] for i in range(3)), tuple(c_col[i] for i in range(3)), (k[0], k[1]), (p[0], p[1]),
           (s[0], s[1]), (dl[0], dl[1]), group, out_channels, chunk, direct_dx)
    found = _TABLES.get(key)
    if found is not None:
        return found
    cdef int channels = c_im[0], height = c_im[1], width = c_im[2]
    cdef int padded_h = height + 2 * p[0], padded_w = width + 2 * p[1], oh = c_col[1], ow = c_col[2]
    cdef Py_ssize_t positions = <Py_ssize_t>oh * ow, rows = c_col[0], mg = out_channels // group
    cdef Py_ssize_t im_count = <Py_ssize_t>channels * height * width, ld = chunk * positions
    cdef Py_ssize_t image_stride = <Py_ssize_t>channels * padded_h * padded_w if p[0] or p[1] else im_count
    cdef Py_ssize_t out_count = out_channels * positions, kg = rows // group, cg = channels // group
    taps = (np.arange(channels)[:, None, None] * (padded_h * padded_w)
            + np.arange(k[0])[None, :, None] * (dl[0] * padded_w) + np.arange(k[1])[None, None, :] * dl[1])
    places = (np.arange(oh)[:, None] * (s[0] * padded_w) + np.arange(ow)[None, :] * s[1]).reshape(-1)
    t = {"im_row": taps.reshape(-1).astype(np.intp),
         "im_col": (np.arange(chunk)[:, None] * image_stride + places[None, :]).reshape(-1).astype(np.intp),
         "out_col": (np.arange(chunk)[:, None] * out_count + np.arange(positions)[None, :]).reshape(-1).astype(np.intp),
         "out_row": np.arange(out_channels, dtype=np.intp) * positions,
         "w_row": np.arange(mg, dtype=np.intp) * kg,
         "col_row": np.arange(max(rows, 1), dtype=np.intp) * ld,
         "col_row_image": np.arange(max(rows, 1), dtype=np.intp) * positions,
         "iota": np.arange(max(rows, ld, mg) + 1, dtype=np.intp)}
    if direct_dx:
        # the padded output diff's taps and places, the input diff's rows and columns, and the flipped W of a
        # group as A (cg x mg * taps): element (c, (o, kh, kw)) = W[o, c, K-1-kh, K-1-kw]
        q_height, q_width = oh + 2 * (k[0] - 1 - p[0]), ow + 2 * (k[1] - 1 - p[1])
        t["dy_row"] = (np.arange(out_channels)[:, None, None] * (q_height * q_width)
                       + np.arange(k[0])[None, :, None] * q_width + np.arange(k[1])[None, None, :]
                       ).reshape(-1).astype(np.intp)
        t["dy_col"] = (np.arange(chunk)[:, None, None] * (out_channels * q_height * q_width)
                       + np.arange(height)[None, :, None] * q_width + np.arange(width)[None, None, :]
                       ).reshape(-1).astype(np.intp)
        t["dx_row"] = np.arange(max(cg, 1), dtype=np.intp) * (height * width)
        t["dx_col"] = (np.arange(chunk)[:, None] * im_count
                       + np.arange(height * width)[None, :]).reshape(-1).astype(np.intp)
        t["flip_row"] = np.arange(max(cg, 1), dtype=np.intp) * (k[0] * k[1])
        t["flip_col"] = (np.arange(mg)[:, None, None] * kg + (k[0] - 1 - np.arange(k[0]))[None, :, None] * k[1]
                         + (k[1] - 1 - np.arange(k[1]))[None, None, :]).reshape(-1).astype(np.intp)
    if len(_TABLES) >= _TABLES_KEPT:
        _TABLES.clear()
    _TABLES[key] = t
    return t


cdef _run_fused(const float[::1] im_in, const float[::1] y_in, const float[::1] w, const float[::1] bias,
                float[::1] out, float[::1] im_out, float[::1] dw_partials, float[::1] scratch, Py_ssize_t num,
                int* c_im, int* c_col, int* k, int* p, int* s, int* dl, int group, int out_channels,
                Py_ssize_t chunk, int threads, Py_ssize_t per_thread):
    # run()'s passes for float32 2-D geometries, the GEMMs reading images and outputs in place (sgemm.h); the
    # input diff either correlates the output diff with the flipped kernel (direct_dx below) or writes columns
    # (W^T y) that _fold sums into the image diff.
    cdef int channels = c_im[0], height = c_im[1], width = c_im[2], ph = p[0], pw = p[1]
    cdef int padded_h = height + 2 * ph, padded_w = width + 2 * pw
    cdef Py_ssize_t positions = <Py_ssize_t>c_col[1] * c_col[2], rows = <Py_ssize_t>c_col[0]
    cdef Py_ssize_t im_count = <Py_ssize_t>channels * height * width
    cdef Py_ssize_t padded_count = <Py_ssize_t>channels * padded_h * padded_w
    cdef Py_ssize_t out_count = out_channels * positions, ld = chunk * positions
    cdef bint has_pad = ph or pw
    cdef bint want_col = im_in.shape[0] > 0, want_dw = dw_partials.shape[0] > 0, want_out = out.shape[0] > 0
    cdef bint want_im = im_out.shape[0] > 0
    cdef Fused f
    f.mg, f.kg, f.group, f.out_channels = out_channels // group, <int>(rows // group), group, out_channels
    f.positions, f.col_ld = <int>positions, ld
    f.cg, f.taps = channels // group, k[0] * k[1]
    f.out_h, f.out_w = c_col[1], c_col[2]
    f.im_image, f.im_step = padded_count if has_pad else im_count, <Py_ssize_t>s[0] * padded_w
    f.fwd_direct = want_out and _direct_forward(&f, s)
    f.dw_direct = want_dw and _few_columns(&f, s)
    # the tables (np.intp is ptrdiff_t here), built once per geometry and chunk
    cdef bint direct_dx = want_im and _direct_dx_pays(&f, c_im, c_col, k, p, s, dl)
    tables = _tables(c_im, c_col, k, p, s, dl, group, out_channels, chunk, direct_dx)
    cdef Py_ssize_t[::1] im_row = tables["im_row"], im_col = tables["im_col"], out_col = tables["out_col"]
    cdef Py_ssize_t[::1] out_row = tables["out_row"], w_row = tables["w_row"], col_row
    cdef Py_ssize_t[::1] iota = tables["iota"]
    cdef Py_ssize_t chunks = (num + chunk - 1) // chunk, ci, n0, nb, i, t, lo, hi, r_lo, r_hi
    cdef bint by_chunks = chunks > 1 or threads == 1
    # The column buffer (input diff by col2im): where threads take whole chunks, it holds one image's columns at
    # a time, rows P apart: a chunk's rows chunk * P apart put the rows of one image on a few cache sets (1 KB
    # apart for LeNet's conv2), which then missed in L1 and L2 for the GEMM's stores and the fold's loads.
    if by_chunks:
        col_row, f.col_ld = tables["col_row_image"], positions
    else:
        col_row = tables["col_row"]
    f.iota, f.im_row, f.im_col = <ptrdiff_t*>&iota[0], <ptrdiff_t*>&im_row[0], <ptrdiff_t*>&im_col[0]
    f.out_row, f.out_col, f.w_row = <ptrdiff_t*>&out_row[0], <ptrdiff_t*>&out_col[0], <ptrdiff_t*>&w_row[0]
    f.col_row = <ptrdiff_t*>&col_row[0]
    cdef int qh = k[0] - 1 - ph, qw = k[1] - 1 - pw, oh = c_col[1], ow = c_col[2]
    cdef Py_ssize_t dy_count = <Py_ssize_t>out_channels * (oh + 2 * qh) * (ow + 2 * qw)
    cdef Py_ssize_t in_positions = <Py_ssize_t>height * width
    cdef bint dy_pad = qh > 0 or qw > 0
    cdef Py_ssize_t[::1] dy_row, dy_col, dx_row, dx_col, flip_row, flip_col
    f.dx_group = <Py_ssize_t>f.cg * in_positions
    if direct_dx:
        dy_row, dy_col, dx_row, dx_col = tables["dy_row"], tables["dy_col"], tables["dx_row"], tables["dx_col"]
        flip_row, flip_col = tables["flip_row"], tables["flip_col"]
        f.dy_row, f.dy_col = <ptrdiff_t*>&dy_row[0], <ptrdiff_t*>&dy_col[0]
        f.dx_row, f.dx_col = <ptrdiff_t*>&dx_row[0], <ptrdiff_t*>&dx_col[0]
    # W (forward), W^T (backward's column pass) or the flipped W (direct_dx), packed once for every chunk
    cdef int g
    cdef float[::1] packed = None
    f.w_packed, f.w_packed_group = NULL, 0
    if want_out or want_im:
        f.w_packed_group = pcd_packed_a_floats(f.mg, f.kg) if want_out else (
            pcd_packed_a_floats(f.cg, f.mg * f.taps) if direct_dx else pcd_packed_a_floats(f.kg, f.mg))
        packed = np.empty(max(1, group * f.w_packed_group), np.float32)
        for g in range(group):
            if want_out:
                pcd_pack_a_all(f.mg, f.kg, _operand(&w[0] + g * f.mg * f.kg, f.w_row, f.iota),
                               &packed[0] + g * f.w_packed_group)
            elif direct_dx:
                pcd_pack_a_all(f.cg, f.mg * f.taps, _operand(&w[0] + g * f.mg * f.kg, <ptrdiff_t*>&flip_row[0],
                               <ptrdiff_t*>&flip_col[0]), &packed[0] + g * f.w_packed_group)
            else:
                pcd_pack_a_all(f.kg, f.mg, _operand(&w[0] + g * f.mg * f.kg, f.iota, f.w_row),
                               &packed[0] + g * f.w_packed_group)
        f.w_packed = &packed[0]
    cdef const float* y = &y_in[0] if y_in.shape[0] > 0 else NULL
    cdef const float* b = &bias[0] if bias.shape[0] > 0 else NULL
    cdef float* o = &out[0] if want_out else NULL
    cdef float* dwp = &dw_partials[0] if want_dw else NULL
    cdef int tid
    cdef const float* im
    cdef const float* dyp
    cdef float* col
    cdef float* fold_pad
    if by_chunks:
        # threads take whole chunks
        for ci in prange(chunks, nogil=True, schedule="dynamic", num_threads=threads, use_threads_if=threads > 1):
            tid = threadid()
            n0 = ci * chunk
            nb = min(chunk, num - n0)
            col = &scratch[0] + tid * per_thread
            fold_pad = col + (rows + out_channels) * ld
            im = NULL
            if want_col:
                im = &im_in[0] + n0 * im_count
                if has_pad:
                    _pad_chunk(im, pcd_thread_buffer(1, nb * padded_count), nb, channels, height, width, ph, pw)
                    im = pcd_thread_buffer(1, nb * padded_count)
            _fused_columns(&f, im, y + n0 * out_count if y != NULL else NULL, &w[0], b,
                           o + n0 * out_count if o != NULL else NULL, dwp + tid * w.shape[0] if dwp != NULL else NULL,
                           NULL, 0, 0, nb * positions, 0, f.kg, pcd_thread_buffer(0, PCD_SGEMM_PACK_FLOATS))
            if direct_dx:
                dyp = y + n0 * out_count
                if dy_pad:
                    _pad_chunk(dyp, pcd_thread_buffer(2, nb * dy_count), nb, out_channels, oh, ow, qh, qw)
                    dyp = pcd_thread_buffer(2, nb * dy_count)
                _dx_direct(&f, dyp, &im_out[0] + n0 * im_count, 0, nb * in_positions,
                           pcd_thread_buffer(0, PCD_SGEMM_PACK_FLOATS))
            elif want_im:
                # an image's columns, then its fold, while they are in L2 (a chunk's would not stay there)
                for i in range(nb):
                    _fused_columns(&f, NULL, y + n0 * out_count, &w[0], NULL, NULL, NULL, col, i * positions,
                                   i * positions, (i + 1) * positions, 0, 0,
                                   pcd_thread_buffer(0, PCD_SGEMM_PACK_FLOATS))
                    _fold(col, &im_out[0] + (n0 + i) * im_count, fold_pad, channels, height, width, ph, pw, k[0],
                          k[1], s[0], s[1], dl[0], dl[1], c_col[1], c_col[2], positions)
        return
    # one chunk (a batch of one, or few large images): the threads split its GEMMs' columns (NR-aligned blocks);
    # dW, whose columns are the weights', is split by those.
    cdef float* padded_im = NULL
    cdef float* padded_dy = NULL
    if want_col and has_pad:
        padded_im = <float*>malloc(num * padded_count * sizeof(float))
        if padded_im == NULL:
            raise MemoryError()
        _pad_chunk(&im_in[0], padded_im, num, channels, height, width, ph, pw)
    if direct_dx and dy_pad:
        padded_dy = <float*>malloc(num * dy_count * sizeof(float))
        if padded_dy == NULL:
            free(padded_im)
            raise MemoryError()
        _pad_chunk(y, padded_dy, num, out_channels, oh, ow, qh, qw)
    dyp = padded_dy if padded_dy != NULL else y
    cdef Py_ssize_t in_cols = num * in_positions
    im = padded_im if padded_im != NULL else (&im_in[0] if want_col else NULL)
    col = &scratch[0]
    cdef Py_ssize_t cols = num * positions
    try:
        for t in prange(threads, nogil=True, schedule="static", num_threads=threads):
            lo = (cols * t // threads) // PCD_NR_ALIGN * PCD_NR_ALIGN
            hi = cols if t == threads - 1 else (cols * (t + 1) // threads) // PCD_NR_ALIGN * PCD_NR_ALIGN
            r_lo = (f.kg * t // threads) // PCD_NR_ALIGN * PCD_NR_ALIGN
            r_hi = f.kg if t == threads - 1 else (f.kg * (t + 1) // threads) // PCD_NR_ALIGN * PCD_NR_ALIGN
            if dwp != NULL:
                _fused_columns(&f, im, y, &w[0], NULL, NULL, dwp, NULL, 0, 0, cols, r_lo, r_hi,
                               pcd_thread_buffer(0, PCD_SGEMM_PACK_FLOATS))
            if o != NULL or (want_im and not direct_dx):
                _fused_columns(&f, im, y, &w[0], b, o, NULL, col if want_im and not direct_dx else NULL, 0, lo,
                               hi, 0, 0, pcd_thread_buffer(0, PCD_SGEMM_PACK_FLOATS))
            if direct_dx:
                _dx_direct(&f, dyp, &im_out[0], (in_cols * t // threads) // PCD_NR_ALIGN * PCD_NR_ALIGN,
                           in_cols if t == threads - 1 else (in_cols * (t + 1) // threads) // PCD_NR_ALIGN * PCD_NR_ALIGN,
                           pcd_thread_buffer(0, PCD_SGEMM_PACK_FLOATS))
    finally:
        free(padded_im)
        free(padded_dy)
    if want_im and not direct_dx:
        fold_pad = col + (rows + out_channels) * ld
        for i in range(num):
            _fold(col + i * positions, &im_out[0] + i * im_count, fold_pad, channels, height, width, ph, pw, k[0],
                  k[1], s[0], s[1], dl[0], dl[1], c_col[1], c_col[2], ld)


def run(const float[::1] im_in, const float[::1] y_in, const float[::1] w, const float[::1] bias,
        float[::1] out, float[::1] im_out, float[::1] dw_partials, float[::1] scratch,
        Py_ssize_t num, im_shape, kernel, pad, stride, dilation,
        int group, int out_channels, Py_ssize_t chunk, int threads):
    """One pass over `num` 2-D images (im_shape (C, H, W)) in chunks of `chunk`: conv_im2col.run's, with the same
    arrays and scratch, multiplied straight from the images and outputs (where fused_available())."""
    cdef Pass ps
    if not PCD_SGEMM:
        raise ValueError("conv_fused.run: this build has no AVX2/FMA GEMM (sgemm.h); see fused_available()")
    if len(im_shape) != 3:
        raise ValueError("conv_fused.run: 2-D images only (C, H, W), got image shape %r" % (tuple(im_shape),))
    if not _pass(&ps, "conv_fused", im_in, y_in, w, bias, out, im_out, dw_partials, scratch, num, im_shape, kernel,
                 pad, stride, dilation, False, group, out_channels, chunk, threads):
        return
    _run_fused(im_in, y_in, w, bias, out, im_out, dw_partials, scratch, num, ps.c_im, ps.c_col, ps.k, ps.p, ps.s,
               ps.dl, group, out_channels, chunk, threads, ps.per_thread)
