// Paged attention, written to be obviously right: walk the block table one position at a time.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/kernels.h"
#include "kernels/ref/dot_lanes.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/fp8.h"

namespace helios::kernels {
namespace {

// n values of a cache array from element `offset` on, as floats: the values themselves for f32,
// converted into tmp for f16.
inline const float* cache_values(const void* base, KvType type, int64_t offset, int32_t n, float* tmp) {
  if (type == KvType::kF32) return static_cast<const float*>(base) + offset;
  if (type == KvType::kFp8E4M3) {
    const uint8_t* b = static_cast<const uint8_t*>(base) + offset;
    for (int32_t i = 0; i < n; ++i) tmp[i] = fp8_e4m3_to_fp32(b[i]);
    return tmp;
  }
  const uint16_t* h = static_cast<const uint16_t*>(base) + offset;
  for (int32_t i = 0; i < n; ++i) tmp[i] = fp16_to_fp32(h[i]);
  return tmp;
}

void store_values(const float* x, int64_t n, KvType type, void* base, int64_t offset) {
  if (type == KvType::kF32) {
    std::memcpy(static_cast<float*>(base) + offset, x, sizeof(float) * n);
    return;
  }
  if (type == KvType::kFp8E4M3) {
    uint8_t* b = static_cast<uint8_t*>(base) + offset;
    for (int64_t i = 0; i < n; ++i) b[i] = fp32_to_fp8_e4m3(x[i]);
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(base) + offset;
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  for (; i + 8 <= n; i += 8)  // the same rounding as fp32_to_fp16: to nearest even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
}

}  // namespace

void ref_kv_write(const float* k, const float* v, const int32_t* slots, int32_t n_tokens,
                  const PagedKV& cache) {
  const int64_t row = static_cast<int64_t>(cache.n_kv_heads) * cache.head_dim;
  for (int32_t t = 0; t < n_tokens; ++t) {
    store_values(k + t * row, row, cache.type, cache.k, slots[t] * row);
    store_values(v + t * row, row, cache.type, cache.v, slots[t] * row);
  }
}

void ref_paged_attention(const float* q, const PagedKV& cache, const AttentionPlan& plan,
                         int32_t n_heads, float scale, int64_t item_begin, int64_t item_end,
                         float* out) {
  const int32_t hd = cache.head_dim;
  const int32_t group = n_heads / cache.n_kv_heads;  // query heads per KV head
  const int64_t kv_row = static_cast<int64_t>(cache.n_kv_heads) * hd;
  std::vector<float> scores, row(hd);
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
      const float* kp = cache_values(cache.k, cache.type, slot * kv_row + kvh * hd, hd, row.data());
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
      const float* vp = cache_values(cache.v, cache.type, slot * kv_row + kvh * hd, hd, row.data());
      const float w = scores[p] / sum;
      for (int32_t i = 0; i < hd; ++i) oh[i] += w * vp[i];
    }
  }
}

AttentionTiles attention_tiles(const AttentionPlan& plan, int32_t tile_tokens, std::vector<int32_t>* first) {
  AttentionTiles tiles;
  tiles.tile_tokens = std::max(tile_tokens, 1);
  first->clear();
  int32_t tile_ctx = 0;
  for (int32_t t = 0; t < plan.n_tokens; ++t) {
    const bool starts = first->empty() || t - first->back() == tiles.tile_tokens ||
                        plan.token_seq[t] != plan.token_seq[first->back()];
    if (starts) {
      if (!first->empty()) tiles.span.total += tile_ctx;
      first->push_back(t);
      tile_ctx = 0;
    }
    tile_ctx = std::max(tile_ctx, plan.positions[t] + 1);
    tiles.span.longest = std::max(tiles.span.longest, tile_ctx);
  }
  if (!first->empty()) tiles.span.total += tile_ctx;
  tiles.n_tiles = static_cast<int32_t>(first->size());
  first->push_back(plan.n_tokens);
  int32_t most = 1;  // tokens in the fullest tile: the launch sizes its blocks' rows by it
  for (int32_t i = 0; i < tiles.n_tiles; ++i) most = std::max(most, (*first)[i + 1] - (*first)[i]);
  tiles.tile_tokens = most;
  tiles.first = first->data();
  return tiles;
}

}  // namespace helios::kernels
