// Paged attention, written to be obviously right: walk the block table one position at a time.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

// q·k over n values in 8 lanes of fused multiply-adds, the lanes summed in a fixed tree; the
// plain loop below and the AVX2 code give the same bits.
inline float dot_lanes(const float* a, const float* b, int32_t n) {
  int32_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  __m128 x = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  float sum = _mm_cvtss_f32(x);
#else
  float lanes[8] = {};
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] = std::fma(a[i + l], b[i + l], lanes[l]);
  const float a0 = lanes[0] + lanes[4], a1 = lanes[1] + lanes[5], a2 = lanes[2] + lanes[6],
              a3 = lanes[3] + lanes[7];
  float sum = (a0 + a2) + (a1 + a3);
#endif
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

}  // namespace

void ref_kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                  const PagedKV& cache) {
  const int64_t row = static_cast<int64_t>(cache.n_kv_heads) * cache.head_dim;
  for (int32_t t = 0; t < n_tokens; ++t) {
    std::memcpy(cache.k + slots[t] * row, k + t * row, sizeof(float) * row);
    std::memcpy(cache.v + slots[t] * row, v + t * row, sizeof(float) * row);
  }
}

void ref_paged_attention(const float* q, const PagedKV& cache, const AttentionPlan& plan,
                         int32_t n_heads, float scale, int64_t item_begin, int64_t item_end,
                         float* out) {
  const int32_t hd = cache.head_dim;
  const int32_t group = n_heads / cache.n_kv_heads;  // query heads per KV head
  const int64_t kv_row = static_cast<int64_t>(cache.n_kv_heads) * hd;
  std::vector<float> scores;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int32_t t = static_cast<int32_t>(item / n_heads), h = static_cast<int32_t>(item % n_heads);
    const int32_t* table = plan.block_tables +
                           static_cast<int64_t>(plan.token_seq[t]) * plan.max_blocks_per_seq;
    const int32_t n_ctx = plan.positions[t] + 1;  // causal: positions 0..p
    scores.resize(n_ctx);
    const float* qh = q + (static_cast<int64_t>(t) * n_heads + h) * hd;
    const int32_t kvh = h / group;
    float max_score = -INFINITY;
    for (int32_t p = 0; p < n_ctx; ++p) {
      const int64_t slot = static_cast<int64_t>(table[p / cache.block_size]) * cache.block_size +
                           p % cache.block_size;
      const float* kp = cache.k + slot * kv_row + kvh * hd;
      scores[p] = dot_lanes(qh, kp, hd) * scale;
      max_score = std::max(max_score, scores[p]);
    }
    float sum = 0;
    for (int32_t p = 0; p < n_ctx; ++p) {
      scores[p] = std::exp(scores[p] - max_score);
      sum += scores[p];
    }
    float* oh = out + (static_cast<int64_t>(t) * n_heads + h) * hd;
    std::fill(oh, oh + hd, 0.0f);
    for (int32_t p = 0; p < n_ctx; ++p) {
      const int64_t slot = static_cast<int64_t>(table[p / cache.block_size]) * cache.block_size +
                           p % cache.block_size;
      const float* vp = cache.v + slot * kv_row + kvh * hd;
      const float w = scores[p] / sum;
      for (int32_t i = 0; i < hd; ++i) oh[i] += w * vp[i];
    }
  }
}

}  // namespace helios::kernels
