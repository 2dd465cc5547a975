#include <cmath>

#include "kernels/kernels.h"

namespace helios::kernels {

void ref_rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
              int32_t n_rot, float freq_base, float freq_scale, const float* freq_factors, bool interleaved) {
  const int32_t half = n_rot / 2;
  // theta_i = pos · base^(-2i/n_rot), built by repeated multiplication as llama.cpp does, so that
  // both agree to the last bit on long contexts.
  const float theta_scale = std::pow(freq_base, -2.0f / n_rot);
  for (int32_t t = 0; t < n_tokens; ++t) {
    float theta = static_cast<float>(positions[t]);
    for (int32_t i = 0; i < half; ++i, theta *= theta_scale) {
      const float angle = (freq_factors ? theta / freq_factors[i] : theta) * freq_scale;  // llama.cpp's order
      const float c = std::cos(angle), s = std::sin(angle);
      const int32_t a = interleaved ? 2 * i : i;
      const int32_t b = interleaved ? 2 * i + 1 : i + half;
      for (int32_t h = 0; h < n_heads; ++h) {
        float* v = x + (static_cast<int64_t>(t) * n_heads + h) * head_dim;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

}  // namespace helios::kernels
