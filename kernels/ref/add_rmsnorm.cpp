#include <cmath>

#include "kernels/kernels.h"

namespace helios::kernels {

void ref_add_rmsnorm(float* x, const float* y, const float* weight, int32_t n_rows, int32_t dim,
                     float eps, float* out) {
  for (int32_t r = 0; r < n_rows; ++r) {
    float* xr = x + static_cast<int64_t>(r) * dim;
    const float* yr = y + static_cast<int64_t>(r) * dim;
    float* o = out + static_cast<int64_t>(r) * dim;
    double sum_sq = 0;  // in double, as ref_rmsnorm
    for (int32_t i = 0; i < dim; ++i) {
      xr[i] += yr[i];
      sum_sq += static_cast<double>(xr[i] * xr[i]);
    }
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / dim) + eps);
    for (int32_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

}  // namespace helios::kernels
