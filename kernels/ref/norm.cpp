#include <cmath>

#include "kernels/kernels.h"

namespace helios::kernels {

void ref_rmsnorm(const float* x, const float* weight, int32_t n_rows, int32_t dim, float eps,
                 float* out) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    float* o = out + static_cast<int64_t>(r) * dim;
    // Float squares summed in double, as llama.cpp does: a 4096-wide float sum loses digits.
    double sum_sq = 0;
    for (int32_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i] * xr[i]);
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / dim) + eps);
    for (int32_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

}  // namespace helios::kernels
