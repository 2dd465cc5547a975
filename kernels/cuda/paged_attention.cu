// Paged attention for any mix of prefill and decode tokens (the AttentionPlan), GQA-aware and split
// along the context (flash-decoding): block (token, kv_head, split) serves the `group` query heads
// that share the KV head, so each K/V row is read once for all of them. Within a split, positions
// go in tiles of kTile with an online softmax; with more than one split, each writes its
// unnormalised output and (max, sum) to the workspace and combine_kernel merges them. The cache is
// f32 or f16 (read directly, converted in registers).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 128;             // positions per tile (scores in shared memory)
constexpr int kMaxItemsPerThread = 8;  // group * head_dim ≤ kThreads * this
constexpr int kTargetBlocks = 264;     // about two blocks per SM on a 132-SM H100/H200
constexpr int kMinSplitLen = 256;      // shorter splits cost more in merging than they gain
constexpr size_t kMaxSharedBytes = 48 * 1024;

struct Split {
  int32_t n = 1;    // splits per (token, kv head)
  int32_t len = 0;  // positions per split, a multiple of kTile
};

Split plan_splits(int32_t n_tokens, int32_t n_kv_heads, int32_t max_context) {
  Split s;
  const int64_t base = static_cast<int64_t>(n_tokens) * n_kv_heads;
  if (base < kTargetBlocks) {
    const int64_t want = (kTargetBlocks + base - 1) / base;
    const int64_t most = (max_context + kMinSplitLen - 1) / kMinSplitLen;
    s.n = static_cast<int32_t>(std::max<int64_t>(1, std::min(want, most)));
  }
  const int32_t per = (max_context + s.n - 1) / s.n;
  s.len = (per + kTile - 1) / kTile * kTile;
  s.n = (max_context + s.len - 1) / s.len;
  return s;
}

size_t shared_bytes(int32_t group, int32_t head_dim) {
  const int32_t gh = group * head_dim;
  return sizeof(float) * (gh + static_cast<size_t>(group) * kTile + std::max(kThreads, gh) + 3 * group) +
         sizeof(int32_t) * kTile;
}

template <typename T>  // the cache's element: float, __half or __nv_fp8_e4m3
struct AttentionArgs {
  const float* q;           // [n_tokens, n_heads, head_dim]
  const T* k_cache;         // [n_blocks, block_size, n_kv_heads, head_dim]
  const T* v_cache;
  const int32_t* token_seq;
  const int32_t* positions;
  const int32_t* block_tables;
  int32_t max_blocks_per_seq;
  int32_t block_size;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
  float scale;
  int32_t split_len;
  int32_t n_splits;
  float* out;        // [n_tokens, n_heads, head_dim], when n_splits == 1
  float* part_out;   // [n_tokens * n_heads, n_splits, head_dim], when n_splits > 1
  float* part_ml;    // [n_tokens * n_heads, n_splits, 2]: running max, sum of exponentials
};

template <typename T>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs<T> a) {
  const int32_t t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int32_t hd = a.head_dim, group = a.n_heads / a.n_kv_heads, gh = group * hd;
  const int32_t h0 = kvh * group;  // first query head of this KV head
  const int32_t ctx = a.positions[t] + 1;
  const int32_t p_begin = split * a.split_len;
  const int32_t p_end = min(ctx, p_begin + a.split_len);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n_warps = blockDim.x / 32;

  extern __shared__ float smem[];
  float* q_s = smem;                       // [group, hd]
  float* scores = q_s + gh;                // [group, kTile] scores, then exp(score - max)
  float* red = scores + group * kTile;     // [max(blockDim, gh)] slice partial outputs
  float* m_s = red + max(static_cast<int32_t>(blockDim.x), gh);  // [group] running max
  float* l_s = m_s + group;                // [group] running sum of exponentials
  float* alpha_s = l_s + group;            // [group] rescale of the old sums for this tile
  int32_t* slot_s = reinterpret_cast<int32_t*>(alpha_s + group);  // [kTile] cache slots

  const float* qt = a.q + (static_cast<int64_t>(t) * a.n_heads + h0) * hd;
  for (int32_t i = tid; i < gh; i += blockDim.x) q_s[i] = qt[i];
  for (int32_t g = tid; g < group; g += blockDim.x) {
    m_s[g] = -INFINITY;
    l_s[g] = 0.0f;
  }
  const int32_t* table = a.block_tables + static_cast<int64_t>(a.token_seq[t]) * a.max_blocks_per_seq;
  const int64_t kv_row = static_cast<int64_t>(a.n_kv_heads) * hd;
  const T* k_head = a.k_cache + static_cast<int64_t>(kvh) * hd;
  const T* v_head = a.v_cache + static_cast<int64_t>(kvh) * hd;

  // V accumulation: thread → (slice of the tile's positions, up to kMaxItemsPerThread (g, d) items).
  const int32_t stride_items = min(gh, static_cast<int32_t>(blockDim.x));
  const int32_t n_slices = blockDim.x / stride_items;
  const int32_t slice = tid / stride_items, first_item = tid % stride_items;
  float acc[kMaxItemsPerThread];
#pragma unroll
  for (int c = 0; c < kMaxItemsPerThread; ++c) acc[c] = 0.0f;
  __syncthreads();

  for (int32_t tile0 = p_begin; tile0 < p_end; tile0 += kTile) {
    const int32_t tile_n = min(kTile, p_end - tile0);
    for (int32_t j = tid; j < tile_n; j += blockDim.x) {
      const int32_t p = tile0 + j;
      slot_s[j] = table[p / a.block_size] * a.block_size + p % a.block_size;
    }
    __syncthreads();
    // scores: one warp per position, lanes across head_dim
    for (int32_t j = warp; j < tile_n; j += n_warps) {
      const T* kp = k_head + slot_s[j] * kv_row;
      for (int32_t g = 0; g < group; ++g) {
        float s = 0.0f;
        for (int32_t d = lane; d < hd; d += 32) s += q_s[g * hd + d] * cuda::load_kv(kp + d);
        s = cuda::warp_sum(s);
        if (lane == 0) scores[g * kTile + j] = s * a.scale;
      }
    }
    __syncthreads();
    // online softmax: one warp per query head
    for (int32_t g = warp; g < group; g += n_warps) {
      float* sg = scores + g * kTile;
      float mx = -INFINITY;
      for (int32_t j = lane; j < tile_n; j += 32) mx = fmaxf(mx, sg[j]);
      mx = cuda::warp_max(mx);
      const float m_new = fmaxf(m_s[g], mx);
      float sum = 0.0f;
      for (int32_t j = lane; j < tile_n; j += 32) {
        const float e = expf(sg[j] - m_new);
        sg[j] = e;
        sum += e;
      }
      sum = cuda::warp_sum(sum);
      if (lane == 0) {
        const float alpha = expf(m_s[g] - m_new);  // 0 on the first tile (m_s = -inf)
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
    if (slice < n_slices) {
#pragma unroll
      for (int c = 0; c < kMaxItemsPerThread; ++c) {
        const int32_t item = first_item + c * stride_items;
        if (item < gh) {
          const int32_t g = item / hd, d = item % hd;
          float o = acc[c] * alpha_s[g];
          const float* sg = scores + g * kTile;
          for (int32_t j = slice; j < tile_n; j += n_slices) o += sg[j] * cuda::load_kv(v_head + slot_s[j] * kv_row + d);
          acc[c] = o;
        }
      }
    }
    __syncthreads();  // scores and slots are rewritten by the next tile
  }

  // sum the slices, then normalise (one split) or hand over to combine_kernel
  if (slice < n_slices) {
#pragma unroll
    for (int c = 0; c < kMaxItemsPerThread; ++c) {
      const int32_t item = first_item + c * stride_items;
      if (item < gh) red[slice * gh + item] = acc[c];
    }
  }
  __syncthreads();
  for (int32_t item = tid; item < gh; item += blockDim.x) {
    float o = 0.0f;
    for (int32_t s = 0; s < n_slices; ++s) o += red[s * gh + item];
    const int32_t g = item / hd, d = item % hd;
    const int64_t head_item = static_cast<int64_t>(t) * a.n_heads + h0 + g;
    if (a.n_splits == 1) {
      a.out[head_item * hd + d] = l_s[g] > 0.0f ? o / l_s[g] : 0.0f;
    } else {
      const int64_t part = head_item * a.n_splits + split;
      a.part_out[part * hd + d] = o;
      if (d == 0) {
        a.part_ml[2 * part] = m_s[g];
        a.part_ml[2 * part + 1] = l_s[g];
      }
    }
  }
}

// out = Σ_i e^(m_i − M) o_i / Σ_i e^(m_i − M) l_i over the splits i of one (token, head).
__global__ void combine_kernel(const float* part_out, const float* part_ml, int32_t n_splits,
                               int32_t head_dim, float* out) {
  const int64_t item = blockIdx.x;
  const float* ml = part_ml + item * n_splits * 2;
  float m = -INFINITY;
  for (int32_t i = 0; i < n_splits; ++i) m = fmaxf(m, ml[2 * i]);
  float l = 0.0f;
  for (int32_t i = 0; i < n_splits; ++i) l += ml[2 * i + 1] * expf(ml[2 * i] - m);
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int32_t i = 0; i < n_splits; ++i) {
      const float w = ml[2 * i + 1] > 0.0f ? expf(ml[2 * i] - m) : 0.0f;  // empty splits: m = -inf
      o += w * part_out[(item * n_splits + i) * head_dim + d];
    }
    out[item * head_dim + d] = o * inv;
  }
}

}  // namespace

int64_t paged_attention_workspace_floats(int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                         int32_t head_dim, int32_t max_context) {
  if (n_tokens <= 0 || n_kv_heads <= 0 || max_context <= 0) return 0;
  const Split s = plan_splits(n_tokens, n_kv_heads, max_context);
  if (s.n == 1) return 0;
  return static_cast<int64_t>(n_tokens) * n_heads * s.n * (head_dim + 2);
}

int launch_paged_attention(const float* q, const PagedKV& cache, const AttentionPlan& plan,
                           int32_t n_heads, float scale, int32_t max_context, float* workspace,
                           float* out, void* stream) {
  if (plan.n_tokens <= 0) return 0;
  if (cache.n_kv_heads <= 0 || n_heads % cache.n_kv_heads != 0 || max_context <= 0 ||
      cache.head_dim <= 0 ||
      (cache.type != KvType::kF32 && cache.type != KvType::kF16 && cache.type != KvType::kFp8E4M3)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int32_t group = n_heads / cache.n_kv_heads;
  const size_t smem = shared_bytes(group, cache.head_dim);
  if (group * cache.head_dim > kThreads * kMaxItemsPerThread || smem > kMaxSharedBytes) {
    return static_cast<int>(cudaErrorInvalidConfiguration);
  }
  const Split s = plan_splits(plan.n_tokens, cache.n_kv_heads, max_context);
  if (s.n > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t n_items = static_cast<int64_t>(plan.n_tokens) * n_heads;
  float* part_out = workspace;
  float* part_ml = workspace ? workspace + n_items * s.n * cache.head_dim : nullptr;
  const dim3 grid(plan.n_tokens, cache.n_kv_heads, s.n);
  const cudaStream_t st = cuda::as_stream(stream);
  auto launch = [&](auto* k_cache, auto* v_cache) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(k_cache)>>;
    AttentionArgs<T> a{q, k_cache, v_cache, plan.token_seq, plan.positions, plan.block_tables,
                       plan.max_blocks_per_seq, cache.block_size, n_heads, cache.n_kv_heads,
                       cache.head_dim, scale, s.len, s.n, out, part_out, part_ml};
    attention_kernel<T><<<grid, kThreads, smem, st>>>(a);
  };
  if (cache.type == KvType::kF16) {
    launch(static_cast<const __half*>(cache.k), static_cast<const __half*>(cache.v));
  } else if (cache.type == KvType::kFp8E4M3) {
    launch(static_cast<const __nv_fp8_e4m3*>(cache.k), static_cast<const __nv_fp8_e4m3*>(cache.v));
  } else {
    launch(static_cast<const float*>(cache.k), static_cast<const float*>(cache.v));
  }
  if (const int err = cuda::launch_status(); err != 0 || s.n == 1) return err;
  const int threads = std::min(256, (cache.head_dim + 31) / 32 * 32);
  combine_kernel<<<static_cast<unsigned>(n_items), threads, 0, st>>>(part_out, part_ml, s.n, cache.head_dim, out);
  return cuda::launch_status();
}

}  // namespace helios::kernels
