#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

// The pair whose wavelength turns n_rotations times over n_ctx_orig positions (YaRN's paper, eq. 17),
// in llama.cpp's float arithmetic.
float yarn_corr_dim(int32_t n_rot, int32_t n_ctx_orig, float n_rotations, float base) {
  return static_cast<float>(n_rot) * std::log(static_cast<float>(n_ctx_orig) / (n_rotations * 2 * static_cast<float>(M_PI))) /
         (2 * std::log(base));
}

}  // namespace

void yarn_correction_range(int32_t n_ctx_orig, float beta_fast, float beta_slow, RopeParams& rope) {
  rope.corr_low = std::max(0.0f, std::floor(yarn_corr_dim(rope.n_rot, n_ctx_orig, beta_fast, rope.freq_base)));
  rope.corr_high = std::min(static_cast<float>(rope.n_rot - 1),
                            std::ceil(yarn_corr_dim(rope.n_rot, n_ctx_orig, beta_slow, rope.freq_base)));
}

void ref_rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
              const RopeParams& r) {
  const int32_t half = r.n_rot / 2;
  // theta_i = pos · base^(-2i/n_rot), built by repeated multiplication as llama.cpp does, so that
  // both agree to the last bit on long contexts.
  const float theta_scale = std::pow(r.freq_base, -2.0f / r.n_rot);
  for (int32_t t = 0; t < n_tokens; ++t) {
    float theta = static_cast<float>(positions[t]);
    for (int32_t i = 0; i < half; ++i, theta *= theta_scale) {
      const float unscaled = r.freq_factors ? theta / r.freq_factors[i] : theta;
      float angle = unscaled * r.freq_scale;
      if (r.ext_factor != 0.0f) {  // YaRN: 1 up to corr_low, 0 from corr_high
        const float y = (static_cast<float>(i) - r.corr_low) / std::max(0.001f, r.corr_high - r.corr_low);
        const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * r.ext_factor;
        // One fused multiply-add, spelled out: left to the compiler, whether and where it fuses
        // depends on the flags, and the CUDA kernel must round the same way.
        angle = std::fma(angle, 1.0f - mix, unscaled * mix);
      }
      const float c = std::cos(angle) * r.mscale, s = std::sin(angle) * r.mscale;
      const int32_t a = r.interleaved ? 2 * i : i;
      const int32_t b = r.interleaved ? 2 * i + 1 : i + half;
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
