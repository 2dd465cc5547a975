// Matrix products through BLAS: a GEMV for one row (decode), a GEMM for several (prefill).
#include <cblas.h>

#include "kernels/kernels.h"

namespace helios::kernels {

void ref_matmul(const float* x, const float* w, int32_t n_rows, int32_t n_in, int32_t n_out,
                float* y) {
  if (n_rows == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n_out, n_in, 1.0f, w, n_in, x, 1, 0.0f, y, 1);
    return;
  }
  // y[n_rows, n_out] = x[n_rows, n_in] · w[n_out, n_in]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_rows, n_out, n_in, 1.0f, x, n_in, w, n_in,
              0.0f, y, n_out);
}

}  // namespace helios::kernels
