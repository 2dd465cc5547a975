// RoPE in place, one thread per (token, pair) looping over heads. The angle is built by the same
// repeated float multiplication as ref_rope, from a scale computed on the host, so the angles
// agree bit for bit; sincosf and fused multiply-adds may differ from the host's by an ulp or two.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

__global__ void rope_kernel(float* x, const int32_t* positions, int32_t n_heads, int32_t head_dim,
                            int32_t n_rot, float theta_scale, float freq_scale, const float* freq_factors,
                            bool interleaved) {
  const int32_t t = blockIdx.x;
  const int32_t half = n_rot / 2;
  for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
    float theta = static_cast<float>(positions[t]);
    for (int32_t j = 0; j < i; ++j) theta *= theta_scale;
    if (freq_factors) theta /= freq_factors[i];  // Llama 3's scaling, then linear: as ref_rope
    theta *= freq_scale;
    float s, c;
    sincosf(theta, &s, &c);
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

}  // namespace

int launch_rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads,
                int32_t head_dim, int32_t n_rot, float freq_base, float freq_scale, const float* freq_factors,
                bool interleaved, void* stream) {
  if (n_tokens <= 0 || n_rot < 2) return 0;
  const float theta_scale = std::pow(freq_base, -2.0f / n_rot);
  const int threads = n_rot / 2 < 128 ? ((n_rot / 2 + 31) / 32) * 32 : 128;
  rope_kernel<<<n_tokens, threads, 0, cuda::as_stream(stream)>>>(x, positions, n_heads, head_dim,
                                                                 n_rot, theta_scale, freq_scale, freq_factors,
                                                                 interleaved);
  return cuda::launch_status();
}

}  // namespace helios::kernels
