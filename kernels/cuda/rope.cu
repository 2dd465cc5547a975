// RoPE in place, one block per token, one thread per pair looping over heads; and RoPE fused with
// the K/V cache write, the three launches of an attention's inputs in one. The angle is built by
// the same repeated float multiplication as ref_rope, from a scale computed on the host, so the
// angles agree bit for bit; sincosf and fused multiply-adds may differ from the host's by an ulp or
// two. The fused kernel rounds exactly as rope then kv_write do.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kFusedThreads = 128;

// Pair i's cosine and sine at `position`, scaled by mscale.
__device__ float2 pair_turn(int32_t position, int32_t i, float theta_scale, const RopeParams& r) {
  float theta = static_cast<float>(position);
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
  return make_float2(c * r.mscale, s * r.mscale);
}

// The dims pair i turns: (2i, 2i+1) interleaved, else (i, i + n_rot/2).
__device__ int2 pair_dims(int32_t i, const RopeParams& r) {
  return r.interleaved ? make_int2(2 * i, 2 * i + 1) : make_int2(i, i + r.n_rot / 2);
}

__device__ float2 turned(float x0, float x1, float2 cs) { return make_float2(x0 * cs.x - x1 * cs.y, x0 * cs.y + x1 * cs.x); }

__global__ void rope_kernel(float* x, const int32_t* positions, int32_t n_heads, int32_t head_dim,
                            float theta_scale, RopeParams r) {
  cuda::inputs_ready();
  const int32_t t = blockIdx.x;
  for (int32_t i = threadIdx.x; i < r.n_rot / 2; i += blockDim.x) {
    const float2 cs = pair_turn(positions[t], i, theta_scale, r);
    const int2 d = pair_dims(i, r);
    for (int32_t h = 0; h < n_heads; ++h) {
      float* v = x + (static_cast<int64_t>(t) * n_heads + h) * head_dim;
      const float2 y = turned(v[d.x], v[d.y], cs);
      v[d.x] = y.x;
      v[d.y] = y.y;
    }
  }
}

// Block t: turns Q row t (t < n_q) and K row t (t < n_kv) in place, and writes K row t, turned, and
// V row t into slot slots[t]. A thread writes the cache at the dims it turned, and the dims past
// n_rot that nobody turns, so no thread reads another's writes.
template <typename T>
__global__ void rope_kv_write_kernel(float* q, const int32_t* q_positions, int32_t n_q, int32_t n_heads, float* k,
                                     const float* v, const int32_t* kv_positions, const int32_t* slots, int32_t n_kv,
                                     int32_t n_kv_heads, int32_t head_dim, float theta_scale, RopeParams r,
                                     T* cache_k, T* cache_v) {
  cuda::inputs_ready();
  const int32_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(n_kv_heads) * head_dim;
  const int64_t src = t * row, dst = t < n_kv ? slots[t] * row : 0;
  for (int32_t i = threadIdx.x; i < r.n_rot / 2; i += blockDim.x) {
    const int2 d = pair_dims(i, r);
    if (t < n_q) {
      const float2 cs = pair_turn(q_positions[t], i, theta_scale, r);
      for (int32_t h = 0; h < n_heads; ++h) {
        float* x = q + (static_cast<int64_t>(t) * n_heads + h) * head_dim;
        const float2 y = turned(x[d.x], x[d.y], cs);
        x[d.x] = y.x;
        x[d.y] = y.y;
      }
    }
    if (t < n_kv) {
      const float2 cs = pair_turn(kv_positions[t], i, theta_scale, r);
      for (int32_t h = 0; h < n_kv_heads; ++h) {
        const int64_t at = static_cast<int64_t>(h) * head_dim;
        float* x = k + src + at;
        const float2 y = turned(x[d.x], x[d.y], cs);
        x[d.x] = y.x;
        x[d.y] = y.y;
        cuda::store_kv(cache_k + dst + at + d.x, y.x);
        cuda::store_kv(cache_k + dst + at + d.y, y.y);
      }
    }
  }
  if (t >= n_kv) return;
  for (int64_t j = threadIdx.x; j < row; j += blockDim.x) {
    if (j % head_dim >= r.n_rot) cuda::store_kv(cache_k + dst + j, k[src + j]);
    cuda::store_kv(cache_v + dst + j, v[src + j]);
  }
}

float theta_scale_of(const RopeParams& rope) { return std::pow(rope.freq_base, -2.0f / rope.n_rot); }

}  // namespace

int launch_rope(float* x, const int32_t* positions, int32_t n_tokens, int32_t n_heads,
                int32_t head_dim, const RopeParams& rope, void* stream) {
  if (n_tokens <= 0 || rope.n_rot < 2) return 0;
  const int half = rope.n_rot / 2;
  const int threads = half < 128 ? ((half + 31) / 32) * 32 : 128;
  return cuda::launch_chained("rope_kernel", rope_kernel, n_tokens, threads, 0, cuda::as_stream(stream), x, positions,
                              n_heads, head_dim, theta_scale_of(rope), rope);
}

int launch_rope_kv_write(float* q, const int32_t* q_positions, int32_t n_q, int32_t n_heads, float* k, const float* v,
                         const int32_t* kv_positions, const int32_t* slots, int32_t n_kv, const RopeParams& rope,
                         const PagedKV& cache, void* stream) {
  n_q = std::max(n_q, 0);
  n_kv = std::max(n_kv, 0);
  if (n_q == 0 && n_kv == 0) return 0;
  RopeParams r = rope;
  if (r.n_rot < 2) r.n_rot = 0;  // as launch_rope: nothing turned
  const float theta_scale = r.n_rot > 0 ? theta_scale_of(r) : 1.0f;
  const unsigned blocks = static_cast<unsigned>(std::max(n_q, n_kv));
  const cudaStream_t s = cuda::as_stream(stream);
  return cuda::with_kv_elements(cache, [&](auto* cache_k, auto* cache_v) {
    return cuda::launch_chained("rope_kv_write_kernel", rope_kv_write_kernel<std::remove_pointer_t<decltype(cache_k)>>,
                                blocks, kFusedThreads, 0, s, q, q_positions, n_q, n_heads, k, v, kv_positions, slots,
                                n_kv, cache.n_kv_heads, cache.head_dim, theta_scale, r, cache_k, cache_v);
  });
}

}  // namespace helios::kernels
