/* A stand-in libcudnn for machines without a GPU (tests/gpu/test_cudnn_gpu.py builds it as libcudnn.so.9).
 *
 * It has the prototypes of cuDNN 9's legacy API that pycaffe_dist/backend/cudnn.py binds, and computes what the
 * documentation says each call computes, naively, on host memory (the emulated device's "device memory"), for
 * packed float32 NCHW tensors. Every call checks what a real cuDNN would refuse: descriptors of the wrong kind or
 * not set, alpha not 1, beta not 0 or 1, a convolution run without CUDNN_FMA_MATH or with an algorithm Find did
 * not report as usable or a smaller workspace than it reported. So the bindings' argument orders, the structs and
 * the engine's use of them are checked here; what remains for a real GPU is cuDNN itself.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

typedef int cudnnStatus_t;
enum { OK = 0, NOT_INITIALIZED = 1001, BAD_PARAM = 2000, NOT_SUPPORTED = 3000 };
enum { TENSOR = 1, FILTER, CONV, POOL, LRN, ACT };

typedef struct { int kind, set, a[9]; double d[3]; } Desc;     /* one layout for every descriptor kind */
typedef struct { int algo, status; float time; size_t memory; int determinism, mathType, reserved[3]; } Perf;

static int handle_object;
#define FIND_ALGO 1      /* no transform in any direction */
#define FIND_BYTES 4096
#define TRANSFORM_ALGO 4 /* a transform in every direction: FFT forward, Winograd backward */
#define TRANSFORM_BYTES 16

static cudnnStatus_t create(void **out, int kind) {
    Desc *d = calloc(1, sizeof(Desc));
    d->kind = kind;
    *out = d;
    return OK;
}
static int is(const void *p, int kind) { return p && ((const Desc *)p)->kind == kind && ((const Desc *)p)->set; }
static int alpha_beta(const void *alpha, const void *beta) {
    float a = *(const float *)alpha, b = *(const float *)beta;
    return a == 1.0f && (b == 0.0f || b == 1.0f);
}
static float blend(float value, float beta, float old) { return beta == 0.0f ? value : value + beta * old; }
#define T(p) ((const Desc *)(p))->a      /* n, c, h, w of a tensor; k, c, h, w of a filter (after format) */

size_t cudnnGetVersion(void) { return 91000; }
const char *cudnnGetErrorString(cudnnStatus_t s) {
    return s == OK ? "CUDNN_STATUS_SUCCESS" : s == BAD_PARAM ? "CUDNN_STATUS_BAD_PARAM" :
           s == NOT_SUPPORTED ? "CUDNN_STATUS_NOT_SUPPORTED" : "CUDNN_STATUS_NOT_INITIALIZED";
}
cudnnStatus_t cudnnCreate(void **handle) { *handle = &handle_object; return OK; }
cudnnStatus_t cudnnSetStream(void *handle, void *stream) {
    (void)stream;
    return handle == &handle_object ? OK : BAD_PARAM;
}
#define HANDLE if (handle != &handle_object) return NOT_INITIALIZED

#define DESCRIPTOR(Name, KIND) \
    cudnnStatus_t cudnnCreate##Name##Descriptor(void **d) { return create(d, KIND); } \
    cudnnStatus_t cudnnDestroy##Name##Descriptor(void *d) { if (!d || ((Desc *)d)->kind != KIND) return BAD_PARAM; \
                                                            free(d); return OK; }
DESCRIPTOR(Tensor, TENSOR)
DESCRIPTOR(Filter, FILTER)
DESCRIPTOR(Convolution, CONV)
DESCRIPTOR(Pooling, POOL)
DESCRIPTOR(LRN, LRN)
DESCRIPTOR(Activation, ACT)

cudnnStatus_t cudnnSetTensor4dDescriptor(void *p, int format, int dtype, int n, int c, int h, int w) {
    Desc *d = p;
    if (d->kind != TENSOR || format != 0 || dtype != 0 || n <= 0 || c <= 0 || h <= 0 || w <= 0) return BAD_PARAM;
    d->a[0] = n; d->a[1] = c; d->a[2] = h; d->a[3] = w; d->set = 1;
    return OK;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(void *p, int dtype, int format, int k, int c, int h, int w) {
    Desc *d = p;
    if (d->kind != FILTER || format != 0 || dtype != 0 || k <= 0 || c <= 0 || h <= 0 || w <= 0) return BAD_PARAM;
    d->a[0] = k; d->a[1] = c; d->a[2] = h; d->a[3] = w; d->set = 1;
    return OK;
}
/* a: pad_h, pad_w, u, v, dilation_h, dilation_w, group, math */
cudnnStatus_t cudnnSetConvolution2dDescriptor(void *p, int ph, int pw, int u, int v, int dh, int dw, int mode,
                                              int compute) {
    Desc *d = p;
    if (d->kind != CONV || mode != 1 || compute != 0 || u <= 0 || v <= 0 || dh != 1 || dw != 1) return BAD_PARAM;
    d->a[0] = ph; d->a[1] = pw; d->a[2] = u; d->a[3] = v; d->a[4] = dh; d->a[5] = dw; d->a[6] = 1; d->a[7] = 0;
    d->set = 1;
    return OK;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(void *p, int g) { if (!is(p, CONV) || g <= 0) return BAD_PARAM;
                                                              ((Desc *)p)->a[6] = g; return OK; }
cudnnStatus_t cudnnSetConvolutionMathType(void *p, int m) { if (!is(p, CONV) || m < 0 || m > 3) return BAD_PARAM;
                                                            ((Desc *)p)->a[7] = m; return OK; }
cudnnStatus_t cudnnGetConvolutionMathType(void *p, int *m) { if (!is(p, CONV)) return BAD_PARAM;
                                                             *m = ((Desc *)p)->a[7]; return OK; }

static int conv_dims(const void *conv, const void *x, const void *w, int *out) {
    const int *c = T(conv), *xs = T(x), *ws = T(w);
    int g = c[6];
    if (xs[1] % g || ws[0] % g || xs[1] / g != ws[1]) return 0;
    out[0] = xs[0]; out[1] = ws[0];
    out[2] = (xs[2] + 2 * c[0] - ws[2]) / c[2] + 1;
    out[3] = (xs[3] + 2 * c[1] - ws[3]) / c[3] + 1;
    return out[2] > 0 && out[3] > 0;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const void *conv, const void *x, const void *w, int *n, int *c,
                                                    int *h, int *ww) {
    int o[4];
    if (!is(conv, CONV) || !is(x, TENSOR) || !is(w, FILTER) || !conv_dims(conv, x, w, o)) return BAD_PARAM;
    *n = o[0]; *c = o[1]; *h = o[2]; *ww = o[3];
    return OK;
}
/* x, w, conv, y as a convolution of these shapes? */
static int conv_ok(const void *x, const void *w, const void *conv, const void *y) {
    int o[4];
    return is(x, TENSOR) && is(w, FILTER) && is(conv, CONV) && is(y, TENSOR) && conv_dims(conv, x, w, o) &&
           !memcmp(o, T(y), sizeof o);
}
static cudnnStatus_t max_count(void *handle, int *count) { HANDLE; *count = 4; return OK; }
cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(void *handle, int *n) { return max_count(handle, n); }
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(void *handle, int *n) { return max_count(handle, n); }
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(void *handle, int *n) { return max_count(handle, n); }

/* Find, fastest first: one that failed and one on TF32 tensor cores, to be passed over; TRANSFORM_ALGO, taken
 * where transforms are allowed; then FIND_ALGO with FIND_BYTES of workspace. */
static cudnnStatus_t find(void *handle, int ok, int requested, int *returned, Perf *perf) {
    HANDLE;
    if (!ok || requested < 4) return BAD_PARAM;
    memset(perf, 0, 4 * sizeof(Perf));
    perf[0].algo = 0; perf[0].status = NOT_SUPPORTED; perf[0].mathType = 3; perf[0].time = 0.1f;
    perf[1].algo = 0; perf[1].status = OK; perf[1].mathType = 1; perf[1].time = 0.2f; perf[1].memory = 16;
    perf[2].algo = TRANSFORM_ALGO; perf[2].status = OK; perf[2].mathType = 3; perf[2].time = 0.3f;
    perf[2].memory = TRANSFORM_BYTES;
    perf[3].algo = FIND_ALGO; perf[3].status = OK; perf[3].mathType = 3; perf[3].time = 0.4f;
    perf[3].memory = FIND_BYTES;
    *returned = 4;
    return OK;
}
cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(void *handle, const void *x, const void *w, const void *conv,
                                                   const void *y, int req, int *ret, Perf *perf) {
    return find(handle, conv_ok(x, w, conv, y), req, ret, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(void *handle, const void *w, const void *dy,
                                                        const void *conv, const void *dx, int req, int *ret,
                                                        Perf *perf) {
    return find(handle, conv_ok(dx, w, conv, dy), req, ret, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(void *handle, const void *x, const void *dy,
                                                          const void *conv, const void *dw, int req, int *ret,
                                                          Perf *perf) {
    return find(handle, conv_ok(x, dw, conv, dy), req, ret, perf);
}
static cudnnStatus_t size(void *handle, int ok, int algo, size_t *bytes) {
    HANDLE;
    if (!ok) return BAD_PARAM;
    *bytes = algo == FIND_ALGO ? FIND_BYTES : algo == TRANSFORM_ALGO ? TRANSFORM_BYTES : 0;
    return OK;
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(void *handle, const void *x, const void *w, const void *conv,
                                                      const void *y, int algo, size_t *bytes) {
    return size(handle, conv_ok(x, w, conv, y), algo, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(void *handle, const void *w, const void *dy,
                                                           const void *conv, const void *dx, int algo, size_t *b) {
    return size(handle, conv_ok(dx, w, conv, dy), algo, b);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(void *handle, const void *x, const void *dy,
                                                             const void *conv, const void *dw, int algo, size_t *b) {
    return size(handle, conv_ok(x, dw, conv, dy), algo, b);
}
static int run_ok(const void *conv, int algo, const void *ws, size_t bytes) {
    return T(conv)[7] == 3 && ws != NULL &&
           ((algo == FIND_ALGO && bytes >= FIND_BYTES) || (algo == TRANSFORM_ALGO && bytes >= TRANSFORM_BYTES));
}

/* The convolution's taps: calls f(x index, w index, y index) for every product of y = w * x. */
#define FOR_TAPS(xD, wD, convD, BODY) do { \
    const int *X = T(xD), *W = T(wD), *C = T(convD); int o[4]; conv_dims(convD, xD, wD, o); \
    int G = C[6], Kg = W[0] / G, Cg = W[1]; \
    for (int n = 0; n < X[0]; n++) for (int k = 0; k < W[0]; k++) for (int oh = 0; oh < o[2]; oh++) \
    for (int ow = 0; ow < o[3]; ow++) for (int c = 0; c < Cg; c++) for (int i = 0; i < W[2]; i++) \
    for (int j = 0; j < W[3]; j++) { \
        int h = oh * C[2] - C[0] + i, w_ = ow * C[3] - C[1] + j, xc = (k / Kg) * Cg + c; \
        if (h < 0 || h >= X[2] || w_ < 0 || w_ >= X[3]) continue; \
        size_t xi = (((size_t)n * X[1] + xc) * X[2] + h) * X[3] + w_; \
        size_t wi = (((size_t)k * Cg + c) * W[2] + i) * W[3] + j; \
        size_t yi = (((size_t)n * o[1] + k) * o[2] + oh) * o[3] + ow; \
        BODY; } } while (0)

static size_t count(const void *t) { const int *a = T(t); return (size_t)a[0] * a[1] * a[2] * a[3]; }
static void finish(float *out, const float *acc, size_t n, const void *beta) {
    float b = *(const float *)beta;
    for (size_t i = 0; i < n; i++) out[i] = blend(acc[i], b, out[i]);
}

cudnnStatus_t cudnnConvolutionForward(void *handle, const void *alpha, const void *xD, const void *x,
                                      const void *wD, const void *w, const void *convD, int algo, void *ws,
                                      size_t bytes, const void *beta, const void *yD, void *y) {
    HANDLE;
    if (!conv_ok(xD, wD, convD, yD) || !alpha_beta(alpha, beta) || !run_ok(convD, algo, ws, bytes)) return BAD_PARAM;
    float *acc = calloc(count(yD), sizeof(float));
    FOR_TAPS(xD, wD, convD, acc[yi] += ((const float *)x)[xi] * ((const float *)w)[wi]);
    finish(y, acc, count(yD), beta);
    free(acc);
    return OK;
}
cudnnStatus_t cudnnConvolutionBackwardData(void *handle, const void *alpha, const void *wD, const void *w,
                                           const void *dyD, const void *dy, const void *convD, int algo, void *ws,
                                           size_t bytes, const void *beta, const void *dxD, void *dx) {
    HANDLE;
    if (!conv_ok(dxD, wD, convD, dyD) || !alpha_beta(alpha, beta) || !run_ok(convD, algo, ws, bytes))
        return BAD_PARAM;
    float *acc = calloc(count(dxD), sizeof(float));
    FOR_TAPS(dxD, wD, convD, acc[xi] += ((const float *)dy)[yi] * ((const float *)w)[wi]);
    finish(dx, acc, count(dxD), beta);
    free(acc);
    return OK;
}
cudnnStatus_t cudnnConvolutionBackwardFilter(void *handle, const void *alpha, const void *xD, const void *x,
                                             const void *dyD, const void *dy, const void *convD, int algo, void *ws,
                                             size_t bytes, const void *beta, const void *dwD, void *dw) {
    HANDLE;
    if (!conv_ok(xD, dwD, convD, dyD) || !alpha_beta(alpha, beta) || !run_ok(convD, algo, ws, bytes))
        return BAD_PARAM;
    float *acc = calloc(count(dwD), sizeof(float));
    FOR_TAPS(xD, dwD, convD, acc[wi] += ((const float *)x)[xi] * ((const float *)dy)[yi]);
    finish(dw, acc, count(dwD), beta);
    free(acc);
    return OK;
}
cudnnStatus_t cudnnConvolutionBackwardBias(void *handle, const void *alpha, const void *dyD, const void *dy,
                                           const void *beta, const void *dbD, void *db) {
    HANDLE;
    const int *Y = T(dyD), *B = T(dbD);
    if (!is(dyD, TENSOR) || !is(dbD, TENSOR) || !alpha_beta(alpha, beta) || B[0] != 1 || B[1] != Y[1] ||
        B[2] != 1 || B[3] != 1) return BAD_PARAM;
    float *acc = calloc(B[1], sizeof(float));
    for (size_t i = 0; i < count(dyD); i++) acc[i / ((size_t)Y[2] * Y[3]) % Y[1]] += ((const float *)dy)[i];
    finish(db, acc, B[1], beta);
    free(acc);
    return OK;
}
cudnnStatus_t cudnnAddTensor(void *handle, const void *alpha, const void *aD, const void *A, const void *beta,
                             const void *cD, void *Cp) {
    HANDLE;
    const int *a = T(aD), *c = T(cD);
    if (!is(aD, TENSOR) || !is(cD, TENSOR) || !alpha_beta(alpha, beta) || *(const float *)beta != 1.0f ||
        a[0] != 1 || a[1] != c[1] || a[2] != 1 || a[3] != 1) return BAD_PARAM;
    for (size_t i = 0; i < count(cD); i++) ((float *)Cp)[i] += ((const float *)A)[i / ((size_t)c[2] * c[3]) % c[1]];
    return OK;
}

/* pooling, a: mode, nan, wh, ww, vpad, hpad, vstride, hstride */
cudnnStatus_t cudnnSetPooling2dDescriptor(void *p, int mode, int nan, int wh, int ww, int vp, int hp, int vs, int hs) {
    Desc *d = p;
    if (d->kind != POOL || mode < 0 || mode > 3 || nan < 0 || nan > 1 || wh <= 0 || ww <= 0 || vs <= 0 || hs <= 0)
        return BAD_PARAM;
    int v[8] = {mode, nan, wh, ww, vp, hp, vs, hs};
    memcpy(d->a, v, sizeof v);
    d->set = 1;
    return OK;
}
cudnnStatus_t cudnnGetPooling2dForwardOutputDim(const void *p, const void *x, int *n, int *c, int *h, int *w) {
    if (!is(p, POOL) || !is(x, TENSOR)) return BAD_PARAM;
    const int *P = T(p), *X = T(x);
    *n = X[0]; *c = X[1];
    *h = (X[2] + 2 * P[4] - P[2]) / P[6] + 1;
    *w = (X[3] + 2 * P[5] - P[3]) / P[7] + 1;
    return OK;
}
static int pool_ok(const void *p, const void *x, const void *y) {
    int o[4];
    return is(p, POOL) && is(x, TENSOR) && is(y, TENSOR) && T(p)[0] == 1 &&
           cudnnGetPooling2dForwardOutputDim(p, x, o, o + 1, o + 2, o + 3) == OK && !memcmp(o, T(y), sizeof o);
}
/* AVE counting the padding: every window's sum over the image, divided by the window's size */
#define FOR_WINDOWS(pD, xD, yD, BODY) do { \
    const int *P = T(pD), *X = T(xD), *Y = T(yD); float area = (float)(P[2] * P[3]); \
    for (size_t nc = 0; nc < (size_t)X[0] * X[1]; nc++) for (int oh = 0; oh < Y[2]; oh++) \
    for (int ow = 0; ow < Y[3]; ow++) for (int i = 0; i < P[2]; i++) for (int j = 0; j < P[3]; j++) { \
        int h = oh * P[6] - P[4] + i, w = ow * P[7] - P[5] + j; \
        if (h < 0 || h >= X[2] || w < 0 || w >= X[3]) continue; \
        size_t xi = (nc * X[2] + h) * X[3] + w, yi = (nc * Y[2] + oh) * Y[3] + ow; BODY; } } while (0)

cudnnStatus_t cudnnPoolingForward(void *handle, const void *pD, const void *alpha, const void *xD, const void *x,
                                  const void *beta, const void *yD, void *y) {
    HANDLE;
    if (!pool_ok(pD, xD, yD) || !alpha_beta(alpha, beta)) return BAD_PARAM;
    float *acc = calloc(count(yD), sizeof(float));
    FOR_WINDOWS(pD, xD, yD, acc[yi] += ((const float *)x)[xi] / area);
    finish(y, acc, count(yD), beta);
    free(acc);
    return OK;
}
cudnnStatus_t cudnnPoolingBackward(void *handle, const void *pD, const void *alpha, const void *yD, const void *y,
                                   const void *dyD, const void *dy, const void *xD, const void *x, const void *beta,
                                   const void *dxD, void *dx) {
    HANDLE;
    (void)y; (void)x;
    if (!pool_ok(pD, xD, yD) || !pool_ok(pD, dxD, dyD) || !alpha_beta(alpha, beta)) return BAD_PARAM;
    float *acc = calloc(count(dxD), sizeof(float));
    FOR_WINDOWS(pD, dxD, dyD, acc[xi] += ((const float *)dy)[yi] / area);
    finish(dx, acc, count(dxD), beta);
    free(acc);
    return OK;
}

/* LRN: n in a[0]; alpha, beta, k in d[] */
cudnnStatus_t cudnnSetLRNDescriptor(void *p, unsigned n, double alpha, double beta, double k) {
    Desc *d = p;
    if (d->kind != LRN || n < 1 || n > 16 || k < 1e-5 || beta < 0.01) return BAD_PARAM;
    d->a[0] = (int)n; d->d[0] = alpha; d->d[1] = beta; d->d[2] = k; d->set = 1;
    return OK;
}
static float lrn_scale(const Desc *L, const int *X, const float *x, size_t n, int c, size_t pixel) {
    int size = L->a[0], behind = (size - 1) / 2;
    float sum = 0;
    for (int cc = c - behind; cc <= c + size - 1 - behind; cc++)
        if (cc >= 0 && cc < X[1]) { float v = x[(n * X[1] + cc) * X[2] * X[3] + pixel]; sum += v * v; }
    return (float)L->d[2] + (float)L->d[0] / size * sum;
}
cudnnStatus_t cudnnLRNCrossChannelForward(void *handle, const void *lD, int mode, const void *alpha, const void *xD,
                                          const void *x, const void *beta, const void *yD, void *y) {
    HANDLE;
    if (!is(lD, LRN) || mode != 0 || !is(xD, TENSOR) || !is(yD, TENSOR) || memcmp(T(xD), T(yD), 4 * sizeof(int)) ||
        !alpha_beta(alpha, beta)) return BAD_PARAM;
    const int *X = T(xD);
    const Desc *L = lD;
    size_t pixels = (size_t)X[2] * X[3];
    float *acc = calloc(count(xD), sizeof(float));
    for (size_t n = 0; n < (size_t)X[0]; n++) for (int c = 0; c < X[1]; c++) for (size_t p = 0; p < pixels; p++) {
        size_t i = (n * X[1] + c) * pixels + p;
        acc[i] = ((const float *)x)[i] * powf(lrn_scale(L, X, x, n, c, p), (float)-L->d[1]);
    }
    finish(y, acc, count(xD), beta);
    free(acc);
    return OK;
}
cudnnStatus_t cudnnLRNCrossChannelBackward(void *handle, const void *lD, int mode, const void *alpha,
                                           const void *yD, const void *y, const void *dyD, const void *dy,
                                           const void *xD, const void *x, const void *beta, const void *dxD,
                                           void *dx) {
    HANDLE;
    if (!is(lD, LRN) || mode != 0 || !is(xD, TENSOR) || !is(yD, TENSOR) || !is(dyD, TENSOR) || !is(dxD, TENSOR) ||
        !alpha_beta(alpha, beta)) return BAD_PARAM;
    const int *X = T(xD);
    const Desc *L = lD;
    int size = L->a[0], behind = (size - 1) / 2, ahead = size - 1 - behind;
    size_t pixels = (size_t)X[2] * X[3];
    const float *xf = x, *yf = y, *dyf = dy;
    float *acc = calloc(count(xD), sizeof(float));
    float ratio = (float)(2.0 * L->d[0] * L->d[1] / size);
    for (size_t n = 0; n < (size_t)X[0]; n++) for (int c = 0; c < X[1]; c++) for (size_t p = 0; p < pixels; p++) {
        size_t i = (n * X[1] + c) * pixels + p;
        float sum = 0;   /* over the channels whose windows hold c */
        for (int cc = c - ahead; cc <= c + behind; cc++) if (cc >= 0 && cc < X[1]) {
            size_t j = (n * X[1] + cc) * pixels + p;
            sum += dyf[j] * yf[j] / lrn_scale(L, X, xf, n, cc, p);
        }
        acc[i] = dyf[i] * powf(lrn_scale(L, X, xf, n, c, p), (float)-L->d[1]) - ratio * xf[i] * sum;
    }
    finish(dx, acc, count(xD), beta);
    free(acc);
    return OK;
}

/* softmax over C at every (n, h, w) */
static cudnnStatus_t softmax_ok(int algo, int mode, const void *a, const void *b, const void *alpha,
                                const void *beta) {
    return algo == 1 && mode == 1 && is(a, TENSOR) && is(b, TENSOR) && !memcmp(T(a), T(b), 4 * sizeof(int)) &&
           alpha_beta(alpha, beta) && *(const float *)beta == 0.0f ? OK : BAD_PARAM;
}
cudnnStatus_t cudnnSoftmaxForward(void *handle, int algo, int mode, const void *alpha, const void *xD, const void *x,
                                  const void *beta, const void *yD, void *y) {
    HANDLE;
    if (softmax_ok(algo, mode, xD, yD, alpha, beta) != OK) return BAD_PARAM;
    const int *X = T(xD);
    size_t inner = (size_t)X[2] * X[3];
    for (size_t n = 0; n < (size_t)X[0]; n++) for (size_t p = 0; p < inner; p++) {
        const float *xs = (const float *)x + n * X[1] * inner + p;
        float *ys = (float *)y + n * X[1] * inner + p, top = xs[0], sum = 0;
        for (int c = 1; c < X[1]; c++) top = fmaxf(top, xs[c * inner]);
        for (int c = 0; c < X[1]; c++) { ys[c * inner] = expf(xs[c * inner] - top); sum += ys[c * inner]; }
        for (int c = 0; c < X[1]; c++) ys[c * inner] /= sum;
    }
    return OK;
}
cudnnStatus_t cudnnSoftmaxBackward(void *handle, int algo, int mode, const void *alpha, const void *yD,
                                   const void *y, const void *dyD, const void *dy, const void *beta,
                                   const void *dxD, void *dx) {
    HANDLE;
    if (softmax_ok(algo, mode, yD, dxD, alpha, beta) != OK || !is(dyD, TENSOR)) return BAD_PARAM;
    const int *X = T(yD);
    size_t inner = (size_t)X[2] * X[3];
    for (size_t n = 0; n < (size_t)X[0]; n++) for (size_t p = 0; p < inner; p++) {
        size_t base = n * X[1] * inner + p;
        const float *ys = (const float *)y + base, *ds = (const float *)dy + base;
        float dot = 0;
        for (int c = 0; c < X[1]; c++) dot += ys[c * inner] * ds[c * inner];
        for (int c = 0; c < X[1]; c++) ((float *)dx)[base + c * inner] = ys[c * inner] * (ds[c * inner] - dot);
    }
    return OK;
}

/* activations: a: mode, nan */
cudnnStatus_t cudnnSetActivationDescriptor(void *p, int mode, int nan, double coef) {
    Desc *d = p;
    (void)coef;
    if (d->kind != ACT || mode < 0 || mode > 6 || nan < 0 || nan > 1) return BAD_PARAM;
    d->a[0] = mode; d->a[1] = nan; d->set = 1;
    return OK;
}
cudnnStatus_t cudnnActivationForward(void *handle, const void *aD, const void *alpha, const void *xD, const void *x,
                                     const void *beta, const void *yD, void *y) {
    HANDLE;
    if (!is(aD, ACT) || !is(xD, TENSOR) || xD != yD || !alpha_beta(alpha, beta)) return BAD_PARAM;
    int mode = T(aD)[0];
    for (size_t i = 0; i < count(xD); i++) {
        float v = ((const float *)x)[i];
        ((float *)y)[i] = mode == 1 ? (v > 0 ? v : 0) : mode == 0 ? 1 / (1 + expf(-v)) : tanhf(v);
    }
    return OK;
}
cudnnStatus_t cudnnActivationBackward(void *handle, const void *aD, const void *alpha, const void *yD, const void *y,
                                      const void *dyD, const void *dy, const void *xD, const void *x,
                                      const void *beta, const void *dxD, void *dx) {
    HANDLE;
    if (!is(aD, ACT) || !is(yD, TENSOR) || yD != dyD || yD != xD || yD != dxD || !alpha_beta(alpha, beta))
        return BAD_PARAM;
    int mode = T(aD)[0];
    for (size_t i = 0; i < count(yD); i++) {
        float v = ((const float *)y)[i], d = ((const float *)dy)[i];
        ((float *)dx)[i] = mode == 1 ? (((const float *)x)[i] > 0 ? d : 0) : mode == 0 ? d * v * (1 - v)
                                                                                   : d * (1 - v * v);
    }
    return OK;
}
