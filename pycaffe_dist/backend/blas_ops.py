"""Caffe's row-major GPU BLAS (math_functions.cu: caffe_gpu_gemm, gemv, axpy, scal, dot, asum) on top of a
column-major cuBLAS-like call table, and the composite operations (axpby) both devices share.

A row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T: swap the operands, keep the flags.
"""

NO_TRANS, TRANS = 0, 1     # cublasOperation_t


class RowMajorBlas:
    """Mixin for a Device with `_sgemm(opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`, its strided-batched
    form `_sgemm_batched(..., a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch)`,
    `_sgemv(op, m, n, alpha, a, lda, x, beta, y)` in column-major (cuBLAS's) convention, plus `axpy`, `scal`,
    `dot` and `asum` over DeviceArrays."""

    def gemm(self, trans_a, trans_b, m, n, k, alpha, a, b, beta, c):
        """C (m x n) = alpha op(A) op(B) + beta C, row-major; A is m x k (k x m if trans_a), B k x n (n x k)."""
        if m == 0 or n == 0:
            return
        if k == 0:
            self._scale(m * n, beta, c)
            return
        lda = m if trans_a else k
        ldb = k if trans_b else n
        self._sgemm(TRANS if trans_b else NO_TRANS, TRANS if trans_a else NO_TRANS, n, m, k, alpha,
                    b, ldb, a, lda, beta, c, n)

    def gemm_batched(self, trans_a, trans_b, m, n, k, alpha, a, stride_a, b, stride_b, beta, c, stride_c, batch):
        """C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, X_i starting stride_x elements after X_(i-1)
        (stride 0 reuses one matrix for all): cublasSgemmStridedBatched, row-major."""
        if m == 0 or n == 0 or batch == 0:
            return
        if k == 0:
            if stride_c == m * n:
                self._scale(batch * m * n, beta, c)
            else:       # stride 0: one C for every product, scaled once
                for i in range(batch if stride_c else 1):
                    self._scale(m * n, beta, c.at(i * stride_c))
            return
        lda = m if trans_a else k
        ldb = k if trans_b else n
        self._sgemm_batched(TRANS if trans_b else NO_TRANS, TRANS if trans_a else NO_TRANS, n, m, k, alpha,
                            b, ldb, stride_b, a, lda, stride_a, beta, c, n, stride_c, batch)

    def gemv(self, trans_a, m, n, alpha, a, x, beta, y):
        """y = alpha op(A) x + beta y, A row-major m x n."""
        rows, inner = (n, m) if trans_a else (m, n)
        if rows == 0:
            return
        if inner == 0:
            self._scale(rows, beta, y)
            return
        self._sgemv(NO_TRANS if trans_a else TRANS, n, m, alpha, a, n, x, beta, y)

    def _scale(self, n, beta, c):
        """C = beta C over n elements, as a product over k = 0 leaves it (BLAS: C is not read when beta is 0).
        cuBLAS is not asked: the leading dimensions Caffe's formulas give are 0 there (lda = k), which it refuses."""
        if beta == 0:
            self.memset(c.at(0, n), 0)
        elif beta != 1:
            self.scal(n, beta, c)

    def axpby(self, n, alpha, x, beta, y):
        """Caffe's caffe_gpu_axpby: scal then axpy."""
        self.scal(n, beta, y)
        self.axpy(n, alpha, x, y)
