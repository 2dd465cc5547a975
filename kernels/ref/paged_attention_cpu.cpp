// The CPU backend's paged attention. The same maths as ref_paged_attention, arranged for a CPU:
// one work item per (token, KV head, context split) computes all the query heads that share the
// KV head, so each K and V row is read (and, for an f16 cache, converted) once for the group;
// exponentials are vectorised; splits of a long context are merged afterwards, as on the GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "kernels/kernels.h"
#include "kernels/ref/dot_lanes.h"
#include "kernels/ref/exp_avx2.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/fp8.h"

namespace helios::kernels {
namespace {

// Context positions per split. A token's splits depend on its own context length only, never on
// the batch around it, so its result is the same bits alone, chunked or batched.
constexpr int32_t kSplitLen = 256;

inline int32_t splits_of(int32_t n_ctx) { return (n_ctx + kSplitLen - 1) / kSplitLen; }

// hd values of a K or V row as floats in dst.
inline void load_row(const void* base, KvType type, int64_t offset, int32_t hd, float* dst) {
  if (type == KvType::kF32) {
    std::memcpy(dst, static_cast<const float*>(base) + offset, sizeof(float) * hd);
    return;
  }
  if (type == KvType::kFp8E4M3) {
    const uint8_t* b = static_cast<const uint8_t*>(base) + offset;
    const float* table = fp8_e4m3_table();
    for (int32_t i = 0; i < hd; ++i) dst[i] = table[b[i]];
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(base) + offset;
  int32_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
  for (; i + 8 <= hd; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
#endif
  for (; i < hd; ++i) dst[i] = fp16_to_fp32(h[i]);
}

// y += w * x over n values.
inline void axpy(float w, const float* x, int32_t n, float* y) {
  int32_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 wv = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] = std::fma(w, x[i], y[i]);
}

// s[i] = e^(s[i] - max) over n scores; returns their sum.
inline float exp_and_sum(float* s, int32_t n, float max) {
  int32_t i = 0;
  float sum = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  const __m256 m = _mm256_set1_ps(max);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float l : lanes) sum += l;
#endif
  for (; i < n; ++i) sum += (s[i] = std::exp(s[i] - max));
  return sum;
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// 8 values of a K or V row from element `offset` on.
template <KvType T>
inline __m256 load8(const void* base, int64_t offset) {
  if constexpr (T == KvType::kF32) return _mm256_loadu_ps(static_cast<const float*>(base) + offset);
  if constexpr (T == KvType::kFp8E4M3) {  // 8 codes through the table of their values
    const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(base) + offset));
    return _mm256_i32gather_ps(fp8_e4m3_table(), _mm256_cvtepu8_epi32(codes), 4);
  }
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + offset)));
}

// scores[j][p] = q[j] · K[p] for the G query heads of a group, each K row converted once and the
// G sums kept in registers.  q: [G, hd]; rows: [n] offsets of K rows; scores: [G, n]; hd % 8 == 0.
template <int G, KvType T>
void group_scores(const void* k, const int64_t* rows, int32_t n, const float* q, int32_t hd, float* scores) {
  for (int32_t p = 0; p < n; ++p) {
    __m256 acc[G];
    for (int j = 0; j < G; ++j) acc[j] = _mm256_setzero_ps();
    for (int32_t i = 0; i < hd; i += 8) {
      const __m256 kv = load8<T>(k, rows[p] + i);
      for (int j = 0; j < G; ++j) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * hd + i), kv, acc[j]);
    }
    for (int j = 0; j < G; ++j) scores[j * n + p] = sum_lanes(acc[j]);
  }
}

// out[j] = sum over p of w[j][p] V[p], 8 dimensions at a time so that the G sums stay in registers.
// w: [G, n]; out: [G, hd]; hd % 8 == 0.
template <int G, KvType T>
void group_values(const void* v, const int64_t* rows, int32_t n, const float* w, int32_t hd, float* out) {
  for (int32_t i = 0; i < hd; i += 8) {
    __m256 acc[G];
    for (int j = 0; j < G; ++j) acc[j] = _mm256_setzero_ps();
    for (int32_t p = 0; p < n; ++p) {
      const __m256 vv = load8<T>(v, rows[p] + i);
      for (int j = 0; j < G; ++j) acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(w[j * n + p]), vv, acc[j]);
    }
    for (int j = 0; j < G; ++j) _mm256_storeu_ps(out + j * hd + i, acc[j]);
  }
}

template <KvType T>
bool group_kernels(int32_t group, const void* k, const void* v, const int64_t* rows, int32_t n, const float* q,
                   int32_t hd, float* scores, float* out, bool values) {
  switch (group) {
#define HELIOS_GROUP_CASE(G)                                    \
  case G:                                                       \
    if (values) group_values<G, T>(v, rows, n, scores, hd, out); \
    else group_scores<G, T>(k, rows, n, q, hd, scores);          \
    return true;
    HELIOS_GROUP_CASE(1) HELIOS_GROUP_CASE(2) HELIOS_GROUP_CASE(3) HELIOS_GROUP_CASE(4)
    HELIOS_GROUP_CASE(5) HELIOS_GROUP_CASE(6) HELIOS_GROUP_CASE(7) HELIOS_GROUP_CASE(8)
#undef HELIOS_GROUP_CASE
    default: return false;
  }
}

// The register-blocked kernels for this shape, if there is one: false leaves the work to the
// generic loops. `values` false: scores from K; true: the weighted sum of V.
bool fast_group(const PagedKV& cache, int32_t group, const int64_t* rows, int32_t n, const float* q,
                float* scores, float* out, bool values) {
  if (cache.head_dim % 8 != 0) return false;
  switch (cache.type) {
    case KvType::kF16:
      return group_kernels<KvType::kF16>(group, cache.k, cache.v, rows, n, q, cache.head_dim, scores, out, values);
    case KvType::kFp8E4M3:
      return group_kernels<KvType::kFp8E4M3>(group, cache.k, cache.v, rows, n, q, cache.head_dim, scores, out, values);
    default:
      return group_kernels<KvType::kF32>(group, cache.k, cache.v, rows, n, q, cache.head_dim, scores, out, values);
  }
}
#else
bool fast_group(const PagedKV&, int32_t, const int64_t*, int32_t, const float*, float*, float*, bool) { return false; }
#endif

// Scratch of one thread: the group's scaled queries, scores and accumulators, and a K/V row.
struct Scratch {
  std::vector<float> q, scores, acc, row, max, sum;
  std::vector<int64_t> rows;  // element offset of each position's K/V row
};

// One (token, KV head, split): for each of the `group` query heads, the softmax-weighted sum of V
// over positions [p0, p1) and the softmax's max and sum (what a merge needs). With one split the
// result is final and goes to out; otherwise to the workspace.
void attention_item(const float* q, const PagedKV& cache, const AttentionPlan& plan, int32_t n_heads,
                    float scale, const CpuAttentionWork& work, int64_t item, Scratch& s, float* workspace,
                    float* out) {
  const int32_t hd = cache.head_dim, n_kv = cache.n_kv_heads, group = n_heads / n_kv;
  const int32_t split = static_cast<int32_t>(item % work.n_splits);
  const int32_t kvh = static_cast<int32_t>(item / work.n_splits % n_kv);
  const int32_t t = static_cast<int32_t>(item / work.n_splits / n_kv);
  const int32_t n_ctx = plan.positions[t] + 1, token_splits = splits_of(n_ctx);
  if (split >= token_splits) return;  // a shorter context than the batch's longest
  const int32_t p0 = split * kSplitLen, p1 = std::min(n_ctx, p0 + kSplitLen), n = p1 - p0;
  const int32_t* table = plan.block_tables + static_cast<int64_t>(plan.token_seq[t]) * plan.max_blocks_per_seq;
  const int64_t kv_row = static_cast<int64_t>(n_kv) * hd;

  s.q.resize(static_cast<size_t>(group) * hd);
  s.scores.resize(static_cast<size_t>(group) * std::max(n, 1));
  s.acc.assign(static_cast<size_t>(group) * hd, 0.0f);
  s.row.resize(hd);
  s.rows.resize(std::max(n, 1));
  for (int32_t p = p0; p < p1; ++p) {
    const int64_t slot = static_cast<int64_t>(table[p / cache.block_size]) * cache.block_size + p % cache.block_size;
    s.rows[p - p0] = slot * kv_row + static_cast<int64_t>(kvh) * hd;
  }
  const int32_t h0 = kvh * group;
  for (int32_t j = 0; j < group; ++j)
    for (int32_t i = 0; i < hd; ++i)
      s.q[j * hd + i] = q[(static_cast<int64_t>(t) * n_heads + h0 + j) * hd + i] * scale;

  if (!fast_group(cache, group, s.rows.data(), n, s.q.data(), s.scores.data(), nullptr, false)) {
    for (int32_t p = 0; p < n; ++p) {
      load_row(cache.k, cache.type, s.rows[p], hd, s.row.data());
      for (int32_t j = 0; j < group; ++j) s.scores[j * n + p] = dot_lanes(&s.q[j * hd], s.row.data(), hd);
    }
  }
  s.max.assign(group, -INFINITY);
  s.sum.assign(group, 0.0f);
  for (int32_t j = 0; j < group; ++j) {
    float* sj = &s.scores[j * n];
    for (int32_t i = 0; i < n; ++i) s.max[j] = std::max(s.max[j], sj[i]);
    if (n > 0) s.sum[j] = exp_and_sum(sj, n, s.max[j]);
  }
  if (!fast_group(cache, group, s.rows.data(), n, nullptr, s.scores.data(), s.acc.data(), true)) {
    for (int32_t p = 0; p < n; ++p) {
      load_row(cache.v, cache.type, s.rows[p], hd, s.row.data());
      for (int32_t j = 0; j < group; ++j) axpy(s.scores[j * n + p], s.row.data(), hd, &s.acc[j * hd]);
    }
  }

  for (int32_t j = 0; j < group; ++j) {
    const int64_t pair = static_cast<int64_t>(t) * n_heads + h0 + j;
    if (token_splits == 1) {
      const float inv = 1.0f / s.sum[j];
      for (int32_t i = 0; i < hd; ++i) out[pair * hd + i] = s.acc[j * hd + i] * inv;
      continue;
    }
    // Workspace per (token, head) pair: n_splits rows of hd sums, then n_splits (max, sum) pairs.
    float* part = workspace + pair * work.n_splits * (hd + 2);
    std::memcpy(part + static_cast<int64_t>(split) * hd, &s.acc[j * hd], sizeof(float) * hd);
    float* ml = part + static_cast<int64_t>(work.n_splits) * hd + 2 * split;
    ml[0] = s.max[j];
    ml[1] = s.sum[j];
  }
}

}  // namespace

CpuAttentionWork cpu_attention_work(const AttentionPlan& plan, int32_t n_heads, int32_t n_kv_heads,
                                    int32_t head_dim) {
  CpuAttentionWork w;
  if (plan.n_tokens <= 0 || n_kv_heads <= 0) return w;
  int32_t max_ctx = 0;
  for (int32_t t = 0; t < plan.n_tokens; ++t) max_ctx = std::max(max_ctx, plan.positions[t] + 1);
  const int64_t pairs = static_cast<int64_t>(plan.n_tokens) * n_kv_heads;
  w.n_splits = splits_of(max_ctx);
  w.n_items = pairs * w.n_splits;
  if (w.n_splits > 1) w.workspace_floats = static_cast<int64_t>(plan.n_tokens) * n_heads * w.n_splits * (head_dim + 2);
  return w;
}

void cpu_paged_attention(const float* q, const PagedKV& cache, const AttentionPlan& plan, int32_t n_heads,
                         float scale, const CpuAttentionWork& work, int64_t first, int64_t stride,
                         float* workspace, float* out) {
  thread_local Scratch scratch;
  for (int64_t item = first; item < work.n_items; item += stride)
    attention_item(q, cache, plan, n_heads, scale, work, item, scratch, workspace, out);
}

void cpu_attention_merge(const AttentionPlan& plan, int32_t n_heads, int32_t head_dim,
                         const CpuAttentionWork& work, const float* workspace, int64_t pair_begin,
                         int64_t pair_end, float* out) {
  if (work.n_splits == 1) return;
  const int32_t ns = work.n_splits;
  for (int64_t pair = pair_begin; pair < pair_end; ++pair) {
    const float* part = workspace + pair * ns * (head_dim + 2);
    const float* ml = part + static_cast<int64_t>(ns) * head_dim;
    const int32_t t = static_cast<int32_t>(pair / n_heads);
    const int32_t token_splits = splits_of(plan.positions[t] + 1);
    if (token_splits == 1) continue;  // written whole by its item
    float m = -INFINITY;
    for (int32_t s = 0; s < token_splits; ++s) m = std::max(m, ml[2 * s]);
    float total = 0;
    float* o = out + pair * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    for (int32_t s = 0; s < token_splits; ++s) {
      const float w = std::exp(ml[2 * s] - m);
      total += w * ml[2 * s + 1];
      axpy(w, part + static_cast<int64_t>(s) * head_dim, head_dim, o);
    }
    const float inv = 1.0f / total;
    for (int32_t i = 0; i < head_dim; ++i) o[i] *= inv;
  }
}

}  // namespace helios::kernels
