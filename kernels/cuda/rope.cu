// RoPE in place, one thread per (token, pair) looping over heads. The angle is built by the same
// repeated float multiplication as ref_rope, from a scale computed on the host, so the angles
// agree bit for bit; sincosf and fused multiply-adds may differ from the host's by an ulp or two.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

__global__ void rope_kernel(float* x, const int32_t* positions, int32_t n_heads, int32_t head_dim,
                            float theta_scale, RopeParams r) {
  const int32_t t = blockIdx.x;
  const int32_t half = r.n_rot / 2;
  for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
    float theta = static_cast<float>(positions[t]);
    for (int32_t j = 0; j < i; ++j) theta *= theta_scale;
    const float unscaled = r.freq_factors ? theta / r.freq_factors[i] : theta;  // Llama 3's, then scaled
    float angle = unscaled * r.freq_scale;
    if (r.ext_factor != 0.0f) {  // YaRN's mix, rounded as ref_rope rounds it: one explicit fused multiply-add
      const float y = (static_cast<float>(i) - r.corr_low) / fmaxf(0.001f, r.corr_high - r.corr_low);
      const float mix = __fmul_rn(1.0f - fminf(1.0f, fmaxf(0.0f, y)), r.ext_factor);
      angle = fmaf(angle, 1.0f - mix, __fmul_rn(unscaled, mix));
    }
    float s, c;
    sincosf(angle, &s, &c);
    c *= r.mscale;
    s *= r.mscale;
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

}  // namespace

int launch_rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads,
                int32_t head_dim, const RopeParams& rope, void* stream) {
  if (n_tokens <= 0 || rope.n_rot < 2) return 0;
  const float theta_scale = std::pow(rope.freq_base, -2.0f / rope.n_rot);
  const int half = rope.n_rot / 2;
  const int threads = half < 128 ? ((half + 31) / 32) * 32 : 128;
  rope_kernel<<<n_tokens, threads, 0, cuda::as_stream(stream)>>>(x, positions, n_heads, head_dim, theta_scale, rope);
  return cuda::launch_status();
}

}  // namespace helios::kernels
