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

}  // namespace helios::kernels
