#include <cmath>
#include <cstring>

#include "kernels/kernels.h"

namespace helios::kernels {

void ref_embedding(const int32_t* tokens, int32_t n_tokens, const float* table, int32_t dim,
                   float* out) {
  for (int32_t t = 0; t < n_tokens; ++t) {
    std::memcpy(out + static_cast<int64_t>(t) * dim, table + static_cast<int64_t>(tokens[t]) * dim,
                sizeof(float) * dim);
  }
}

void ref_swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void ref_add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void ref_add_rows(float* rows, const float* v, int32_t n_rows, int32_t dim) {
  for (int32_t r = 0; r < n_rows; ++r) ref_add(rows + static_cast<int64_t>(r) * dim, v, dim);
}

}  // namespace helios::kernels
