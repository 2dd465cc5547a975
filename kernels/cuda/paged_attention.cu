// Paged attention for any mix of prefill and decode tokens (the AttentionPlan), GQA-aware, with
// queries in tiles and the context in splits. Block (query tile, kv_head × head chunk, split)
// serves the query heads of that KV head for the tile's tokens (consecutive tokens of one
// sequence: a prefill chunk's, or a decode's one), so each K/V row it reads is used by all of
// them: FlashAttention's query tiling, with GQA's sharing on top. A group too wide for one block
// (multi-query: Falcon-7B's 71 heads over 1) goes in equal chunks, each reading the K/V itself.
// Within a split, positions go in tiles of kTile with an online softmax; each query row masks
// the positions past its own (causal). With more than one split, each writes its unnormalised
// output and (max, sum) to the workspace and combine_kernel merges them (flash-decoding). The
// split length is one for the launch, from the tiles' total context; each tile takes as many
// splits as its own context needs. The cache is f32, f16 or fp8 E4M3 (read directly, converted
// in registers).
//
// Two ways to read the cache. The general one takes a K row per warp, a value per lane, and a
// V value per thread: 1-4 bytes a load. Where a row is a power of two of 16-byte chunks up to a
// warp's 32 (head_dim 64-256 in f16, 64-128 in f32, 128-256 in fp8) and the block's rows are few
// (decode: one token's heads), the wide one takes every load 16 bytes at a time: a K row per
// `lanes` lanes, several rows a warp, four loads in flight per lane; and for V each thread keeps
// its chunk's sums for all the block's rows in registers, so a V chunk is read once per block.
// Decode attention streams the cache, so the bytes in flight per SM, not the arithmetic, set its
// speed.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 128;             // positions per tile (scores in shared memory)
constexpr int kMaxItemsPerThread = 8;  // rows * head_dim ≤ kThreads * this
constexpr int kMaxRows = 32;           // query rows (tokens × heads of a group) per block
constexpr int kMaxHeadDim = 256;       // a lane holds head_dim / 32 values of a K row
constexpr int kTargetBlocks = 264;     // about two blocks per SM on a 132-SM H100/H200
constexpr int kMinSplitLen = 256;      // shorter splits cost more in merging than they gain
// (token, split) pairs whose partial outputs one launch may keep: a pass of many tokens (a
// prefill chunk beside a long decode) takes longer splits instead, its tiles filling the GPU
// anyway, so the workspace has a bound to reserve (paged_attention_workspace_bound).
constexpr int64_t kMaxTokenSplits = 4096;
constexpr size_t kMaxSharedBytes = 48 * 1024;

// The wide path: 16-byte chunks of kChunk<T> elements; a thread's sums for up to kWideRows<T>
// rows × kChunk<T> values in registers; kWideMaxItems rows × head_dim, so that the 8 warps'
// partial outputs fit in shared memory.
template <typename T>
constexpr int kChunk = 16 / static_cast<int>(sizeof(T));
constexpr int kWideValues = 64;
template <typename T>
constexpr int kWideRows = kWideValues / kChunk<T>;  // f32 16, f16 8, fp8 4
constexpr int kWideMaxItems = 1024;
constexpr int kWideUnroll = 4;  // K rows a lane has in flight

struct Split {
  int32_t n = 1;    // splits of the longest context (grid depth); shorter ones leave theirs empty
  int32_t len = 0;  // positions per split, a multiple of kTile
};

// About kTargetBlocks blocks of real work over the tiles' total context, at least kMinSplitLen
// positions each, and at most kMaxTokenSplits (token, split) pairs: the split length is the same
// for every tile, the number of splits each one's. head_blocks: blocks per tile and split.
Split plan_splits(int32_t n_tokens, int32_t head_blocks, ContextSpan span) {
  const int64_t longest = std::max<int64_t>(span.longest, 1);
  const int64_t per_block = (std::max<int64_t>(span.total, 1) * head_blocks + kTargetBlocks - 1) / kTargetBlocks;
  const int64_t max_splits = std::max<int64_t>(1, kMaxTokenSplits / std::max(n_tokens, 1));
  const int64_t len = std::min(std::max({per_block, int64_t{kMinSplitLen}, (longest + max_splits - 1) / max_splits}),
                               longest);
  Split s;
  s.len = static_cast<int32_t>((len + kTile - 1) / kTile * kTile);
  s.n = static_cast<int32_t>((longest + s.len - 1) / s.len);
  return s;
}

// Query rows a block may serve for this head_dim.
int32_t max_rows(int32_t head_dim) { return std::min(kMaxRows, kThreads * kMaxItemsPerThread / std::max(head_dim, 1)); }

// The partial outputs before their sum: the general path's position slices (at most a block's
// threads or one row set of items), or the wide path's one per warp.
size_t shared_bytes(int32_t rows, int32_t head_dim, bool wide = false) {
  const int32_t items = rows * head_dim;
  const size_t partials = wide ? static_cast<size_t>(kThreads / 32) * items : std::max(kThreads, items);
  return sizeof(float) * (items + static_cast<size_t>(rows) * kTile + partials + 4 * rows) +
         sizeof(int32_t) * (kTile + rows);
}

// The wide path's rows (a power of two from 1 to kWideRows) for a block of `rows` query rows, or
// 0 where it does not apply: chunks that split a row evenly over a power of two of lanes up to a
// warp, few enough rows for their sums in registers and their partials in shared memory.
int32_t wide_rows(KvType type, int32_t rows, int32_t head_dim) {
  const int32_t chunk = 16 / kv_type_bytes(type);
  if (head_dim % chunk != 0) return 0;
  const int32_t lanes = head_dim / chunk;
  if (lanes > 32 || (lanes & (lanes - 1)) != 0 || rows * head_dim > kWideMaxItems) return 0;
  int32_t bucket = 1;
  while (bucket < rows) bucket *= 2;
  return bucket * chunk <= kWideValues && shared_bytes(rows, head_dim, true) <= kMaxSharedBytes ? bucket : 0;
}

bool rows_fit(int32_t rows, int32_t head_dim) {
  return rows * head_dim <= kThreads * kMaxItemsPerThread && shared_bytes(rows, head_dim) <= kMaxSharedBytes;
}

// A KV head's query heads as a block takes them: all of them where one token's fit, else the
// fewest equal chunks that do (the last may be smaller).
struct HeadChunks {
  int32_t per_block = 1;
  int32_t n = 1;
};
HeadChunks head_chunks(int32_t group, int32_t head_dim) {
  if (rows_fit(group, head_dim)) return {group, 1};
  int32_t fit = std::min(group, kThreads * kMaxItemsPerThread / std::max(head_dim, 1));
  while (fit > 1 && !rows_fit(fit, head_dim)) --fit;
  HeadChunks c;
  c.n = (group + fit - 1) / fit;
  c.per_block = (group + c.n - 1) / c.n;
  return c;
}

// A 16-byte chunk of the cache as floats (every conversion exact, as load_kv's).
__device__ __forceinline__ void unpack(const uint4& raw, float (&out)[4]) {
  out[0] = __uint_as_float(raw.x), out[1] = __uint_as_float(raw.y);
  out[2] = __uint_as_float(raw.z), out[3] = __uint_as_float(raw.w);
}
__device__ __forceinline__ void unpack(const uint4& raw, float (&out)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] & 0xFFFFu)));
    out[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] >> 16)));
  }
}
__device__ __forceinline__ void unpack(const uint4& raw, float (&out)[16]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    __nv_fp8_e4m3 v;
    v.__x = static_cast<__nv_fp8_storage_t>((words[i / 4] >> (8 * (i % 4))) & 0xFFu);
    out[i] = static_cast<float>(v);
  }
}
template <typename T>
__device__ __forceinline__ uint4 load_chunk(const T* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

template <typename T>  // the cache's element: float, __half or __nv_fp8_e4m3
struct AttentionArgs {
  const float* q;           // [n_tokens, n_heads, head_dim]
  const T* k_cache;         // [n_blocks, block_size, n_kv_heads, head_dim]
  const T* v_cache;
  const int32_t* token_seq;
  const int32_t* positions;
  const int32_t* block_tables;
  const int32_t* tile_first;  // [n_tiles + 1]; null: one token per tile
  int32_t max_blocks_per_seq;
  int32_t block_size;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
  int32_t heads_per_block;  // of a KV head's group (HeadChunks)
  int32_t head_chunks;
  float scale;
  int32_t split_len;
  int32_t n_splits;
  float* out;        // [n_tokens, n_heads, head_dim], when n_splits == 1
  float* part_out;   // [n_tokens * n_heads, n_splits, head_dim], when n_splits > 1
  float* part_ml;    // [n_tokens * n_heads, n_splits, 2]: running max, sum of exponentials
};

// Row r of a block: token tile_first + r / heads, query head h0 + r % heads. kWide: 0 for the
// general path, else the wide path with sums for kWide rows (at least the block's rows). One
// block per SM at least: left to pick, ptxas held some wide variants to 64 registers and spilled;
// their sums take up to ~150.
template <typename T, int kWide>
__global__ void __launch_bounds__(kThreads, 1) attention_kernel(AttentionArgs<T> a) {
  cuda::inputs_ready();
  const int32_t tile = blockIdx.x, split = blockIdx.z;
  const int32_t kvh = blockIdx.y / a.head_chunks, chunk = blockIdx.y % a.head_chunks;
  const int32_t t0 = a.tile_first ? a.tile_first[tile] : tile;
  const int32_t n_tok = a.tile_first ? a.tile_first[tile + 1] - t0 : 1;
  const int32_t hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  const int32_t heads = min(a.heads_per_block, group - chunk * a.heads_per_block);
  const int32_t rows = n_tok * heads, items = rows * hd;
  const int32_t h0 = kvh * group + chunk * a.heads_per_block;  // the block's first query head
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n_warps = blockDim.x / 32;

  extern __shared__ float smem[];
  float* q_s = smem;                        // [rows, hd]
  float* scores = q_s + items;              // [rows, kTile] scores, then exp(score - max)
  float* red = scores + rows * kTile;       // partial outputs (shared_bytes)
  float* m_s = red + (kWide ? n_warps * items : max(static_cast<int32_t>(blockDim.x), items));  // [rows] running max
  float* l_s = m_s + rows;                  // [rows] running sum of exponentials
  float* alpha_s = l_s + rows;              // [rows] rescale of the old sums for this tile
  float* spare = alpha_s + rows;            // [rows] (keeps the int arrays 4-byte aligned)
  int32_t* slot_s = reinterpret_cast<int32_t*>(spare + rows);  // [kTile] cache slots
  int32_t* ctx_s = slot_s + kTile;          // [rows] each row's context (its position + 1)

  for (int32_t i = tid; i < items; i += blockDim.x) {
    const int32_t r = i / hd, d = i % hd;
    const int32_t t = t0 + r / heads, h = h0 + r % heads;
    q_s[i] = a.q[(static_cast<int64_t>(t) * a.n_heads + h) * hd + d];
  }
  for (int32_t r = tid; r < rows; r += blockDim.x) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.0f;
    ctx_s[r] = a.positions[t0 + r / heads] + 1;
  }
  int32_t tile_ctx = 0;  // the tile's longest context: its last token's, positions rising
  for (int32_t i = 0; i < n_tok; ++i) tile_ctx = max(tile_ctx, a.positions[t0 + i] + 1);
  const int32_t p_begin = split * a.split_len;
  const int32_t p_end = min(tile_ctx, p_begin + a.split_len);  // empty past this tile's own splits
  const int32_t* table = a.block_tables + static_cast<int64_t>(a.token_seq[t0]) * a.max_blocks_per_seq;
  const int64_t kv_row = static_cast<int64_t>(a.n_kv_heads) * hd;
  const T* k_head = a.k_cache + static_cast<int64_t>(kvh) * hd;
  const T* v_head = a.v_cache + static_cast<int64_t>(kvh) * hd;

  // General path, V: thread → (slice of the tile's positions, up to kMaxItemsPerThread (r, d) items).
  const int32_t stride_items = min(items, static_cast<int32_t>(blockDim.x));
  const int32_t n_slices = blockDim.x / stride_items;
  const int32_t slice = tid / stride_items, first_item = tid % stride_items;
  // Wide path: `lanes` lanes per cache row, each its 16-byte chunk c; a warp takes per_warp rows
  // at once (lane group g), the block wide_step.
  constexpr int kC = kChunk<T>;
  const int32_t lanes = kWide ? hd / kC : 32, per_warp = 32 / lanes;  // (the general path: unused)
  const int32_t g = lane / lanes, c = lane % lanes;
  const int32_t wide_step = n_warps * per_warp, wide_first = warp * per_warp + g;
  constexpr int kAcc = kWide ? kWide * kC : kMaxItemsPerThread;
  float acc[kAcc];  // general: the items' sums; wide: row r's sums for chunk c at [r * kC, r * kC + kC)
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  __syncthreads();

  for (int32_t tile0 = p_begin; tile0 < p_end; tile0 += kTile) {
    const int32_t tile_n = min(kTile, p_end - tile0);
    for (int32_t j = tid; j < tile_n; j += blockDim.x) {
      const int32_t p = tile0 + j;
      slot_s[j] = table[p / a.block_size] * a.block_size + p % a.block_size;
    }
    __syncthreads();
    if constexpr (kWide != 0) {
      // scores: kWideUnroll K chunks loaded per lane before any is used, then each against every row
      for (int32_t j0 = wide_first; j0 - g < tile_n; j0 += kWideUnroll * wide_step) {
        uint4 raw[kWideUnroll];
#pragma unroll
        for (int u = 0; u < kWideUnroll; ++u) {
          const int32_t j = j0 + u * wide_step;
          raw[u] = j < tile_n ? load_chunk(k_head + slot_s[j] * kv_row + c * kC) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kWideUnroll; ++u) {
          const int32_t j = j0 + u * wide_step;
          float k[kC];
          unpack(raw[u], k);
          for (int32_t r = 0; r < rows; ++r) {
            const float* qr = q_s + r * hd + c * kC;
            float sum = 0.0f;
#pragma unroll
            for (int e = 0; e < kC; ++e) sum += qr[e] * k[e];
            for (int off = lanes / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (c == 0 && j < tile_n) scores[r * kTile + j] = tile0 + j < ctx_s[r] ? sum * a.scale : -INFINITY;
          }
        }
      }
    } else {
      // scores: one warp per position, its K row in registers (lanes across head_dim), every row
      for (int32_t j = warp; j < tile_n; j += n_warps) {
        const T* kp = k_head + slot_s[j] * kv_row;
        float k_reg[kMaxHeadDim / 32];
#pragma unroll
        for (int e = 0; e < kMaxHeadDim / 32; ++e) {
          const int32_t d = lane + 32 * e;
          k_reg[e] = d < hd ? cuda::load_kv(kp + d) : 0.0f;
        }
        const int32_t p = tile0 + j;
        for (int32_t r = 0; r < rows; ++r) {
          float sum = 0.0f;
#pragma unroll
          for (int e = 0; e < kMaxHeadDim / 32; ++e) {
            const int32_t d = lane + 32 * e;
            if (d < hd) sum += q_s[r * hd + d] * k_reg[e];
          }
          sum = cuda::warp_sum(sum);
          if (lane == 0) scores[r * kTile + j] = p < ctx_s[r] ? sum * a.scale : -INFINITY;  // causal
        }
      }
    }
    __syncthreads();
    // online softmax: one warp per query row
    for (int32_t r = warp; r < rows; r += n_warps) {
      float* sr = scores + r * kTile;
      float mx = -INFINITY;
      for (int32_t j = lane; j < tile_n; j += 32) mx = fmaxf(mx, sr[j]);
      mx = cuda::warp_max(mx);
      const float m_new = fmaxf(m_s[r], mx);
      float sum = 0.0f;
      for (int32_t j = lane; j < tile_n; j += 32) {
        const float e = m_new == -INFINITY ? 0.0f : expf(sr[j] - m_new);  // no position of its yet
        sr[j] = e;
        sum += e;
      }
      sum = cuda::warp_sum(sum);
      if (lane == 0) {
        const float alpha = m_new == -INFINITY ? 1.0f : expf(m_s[r] - m_new);  // 0 after m_s = -inf
        alpha_s[r] = alpha;
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = m_new;
      }
    }
    __syncthreads();
    if constexpr (kWide != 0) {
      // V: each position's chunk c read once, weighed into every row that attends to it (a masked
      // position weighs nothing and is skipped: 0 × an inf in V would be NaN)
#pragma unroll
      for (int r = 0; r < kWide; ++r) {
        const float alpha = r < rows ? alpha_s[r] : 1.0f;
#pragma unroll
        for (int e = 0; e < kC; ++e) acc[r * kC + e] *= alpha;
      }
#pragma unroll 4  // kWideUnroll
      for (int32_t j = wide_first; j < tile_n; j += wide_step) {
        float v[kC];
        unpack(load_chunk(v_head + slot_s[j] * kv_row + c * kC), v);
#pragma unroll
        for (int r = 0; r < kWide; ++r) {
          if (r < rows && tile0 + j < ctx_s[r]) {
            const float w = scores[r * kTile + j];
#pragma unroll
            for (int e = 0; e < kC; ++e) acc[r * kC + e] += w * v[e];
          }
        }
      }
    } else if (slice < n_slices) {
#pragma unroll
      for (int e = 0; e < kMaxItemsPerThread; ++e) {
        const int32_t item = first_item + e * stride_items;
        if (item < items) {
          const int32_t r = item / hd, d = item % hd;
          float o = acc[e] * alpha_s[r];
          const float* sr = scores + r * kTile;
          // The row's own positions only: a masked one weighs 0, but 0 × an inf in V would be NaN.
          const int32_t own = min(tile_n, ctx_s[r] - tile0);
          for (int32_t j = slice; j < own; j += n_slices) o += sr[j] * cuda::load_kv(v_head + slot_s[j] * kv_row + d);
          acc[e] = o;
        }
      }
    }
    __syncthreads();  // scores and slots are rewritten by the next tile
  }

  // sum the partial outputs, then normalise (one split) or hand over to combine_kernel
  int32_t n_partials = n_slices;
  if constexpr (kWide != 0) {
    // a warp's lane groups first (lanes of one chunk lie `lanes` apart), then one partial per warp
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      for (int off = lanes; off < 32; off *= 2) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], off);
    }
    if (g == 0) {
#pragma unroll
      for (int r = 0; r < kWide; ++r) {
        if (r < rows) {
#pragma unroll
          for (int e = 0; e < kC; ++e) red[warp * items + r * hd + c * kC + e] = acc[r * kC + e];
        }
      }
    }
    n_partials = n_warps;
  } else if (slice < n_slices) {
#pragma unroll
    for (int e = 0; e < kMaxItemsPerThread; ++e) {
      const int32_t item = first_item + e * stride_items;
      if (item < items) red[slice * items + item] = acc[e];
    }
  }
  __syncthreads();
  for (int32_t item = tid; item < items; item += blockDim.x) {
    float o = 0.0f;
    for (int32_t s = 0; s < n_partials; ++s) o += red[s * items + item];
    const int32_t r = item / hd, d = item % hd;
    const int64_t head_item = static_cast<int64_t>(t0 + r / heads) * a.n_heads + h0 + r % heads;
    if (a.n_splits == 1) {
      a.out[head_item * hd + d] = l_s[r] > 0.0f ? o / l_s[r] : 0.0f;
    } else {
      const int64_t part = head_item * a.n_splits + split;
      a.part_out[part * hd + d] = o;
      if (d == 0) {
        a.part_ml[2 * part] = m_s[r];
        a.part_ml[2 * part + 1] = l_s[r];
      }
    }
  }
}

// out = Σ_i e^(m_i − M) o_i / Σ_i e^(m_i − M) l_i over the splits i of one (token, head).
__global__ void combine_kernel(const float* part_out, const float* part_ml, int32_t n_splits,
                               int32_t head_dim, float* out) {
  cuda::inputs_ready();
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

bool paged_attention_supports(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim) {
  return n_kv_heads > 0 && n_heads > 0 && n_heads % n_kv_heads == 0 && head_dim > 0 && head_dim <= kMaxHeadDim;
}

int32_t attention_tile_tokens(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim) {
  if (!paged_attention_supports(n_heads, n_kv_heads, head_dim)) return 1;
  return std::max(1, max_rows(head_dim) / head_chunks(n_heads / n_kv_heads, head_dim).per_block);
}

bool paged_attention_reads_wide(KvType type, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                int32_t tile_tokens) {
  if (!paged_attention_supports(n_heads, n_kv_heads, head_dim) || tile_tokens <= 0) return false;
  const int32_t rows = head_chunks(n_heads / n_kv_heads, head_dim).per_block * tile_tokens;
  return rows_fit(rows, head_dim) && wide_rows(type, rows, head_dim) != 0;
}

int64_t paged_attention_workspace_floats(int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                         int32_t head_dim, ContextSpan span) {
  if (n_tokens <= 0 || span.longest <= 0 || !paged_attention_supports(n_heads, n_kv_heads, head_dim)) return 0;
  const Split s = plan_splits(n_tokens, n_kv_heads * head_chunks(n_heads / n_kv_heads, head_dim).n, span);
  if (s.n == 1) return 0;
  return static_cast<int64_t>(n_tokens) * n_heads * s.n * (head_dim + 2);
}

int64_t paged_attention_workspace_bound(int32_t n_heads, int32_t head_dim) {
  return kMaxTokenSplits * std::max(n_heads, 0) * (std::max(head_dim, 0) + 2);
}

int launch_paged_attention(const float* q, const PagedKV& cache, const AttentionPlan& plan,
                           int32_t n_heads, float scale, const AttentionTiles& tiles, float* workspace,
                           float* out, void* stream) {
  if (plan.n_tokens <= 0) return 0;
  if (cache.n_kv_heads <= 0 || n_heads <= 0 || n_heads % cache.n_kv_heads != 0 || tiles.span.longest <= 0 ||
      cache.head_dim <= 0 || (tiles.first != nullptr && tiles.tile_tokens <= 0) ||
      (cache.type != KvType::kF32 && cache.type != KvType::kF16 && cache.type != KvType::kFp8E4M3)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (cache.head_dim > kMaxHeadDim) return static_cast<int>(cudaErrorInvalidConfiguration);
  const HeadChunks chunks = head_chunks(n_heads / cache.n_kv_heads, cache.head_dim);
  const int32_t rows = chunks.per_block * (tiles.first ? tiles.tile_tokens : 1);
  if (!rows_fit(rows, cache.head_dim)) return static_cast<int>(cudaErrorInvalidConfiguration);
  const bool aligned = ((reinterpret_cast<uintptr_t>(cache.k) | reinterpret_cast<uintptr_t>(cache.v)) % 16) == 0;
  const int32_t wide = tiles.general_loads || !aligned ? 0 : wide_rows(cache.type, rows, cache.head_dim);
  const size_t smem = shared_bytes(rows, cache.head_dim, wide != 0);
  const int32_t n_tiles = tiles.first ? tiles.n_tiles : plan.n_tokens;
  const Split s = plan_splits(plan.n_tokens, cache.n_kv_heads * chunks.n, tiles.span);
  if (s.n > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t n_items = static_cast<int64_t>(plan.n_tokens) * n_heads;
  float* part_out = workspace;
  float* part_ml = workspace ? workspace + n_items * s.n * cache.head_dim : nullptr;
  const dim3 grid(n_tiles, cache.n_kv_heads * chunks.n, s.n);
  const cudaStream_t st = cuda::as_stream(stream);
  auto launch = [&](auto* k_cache, auto* v_cache) {
    using T = std::remove_pointer_t<decltype(k_cache)>;
    AttentionArgs<T> a{q, k_cache, v_cache, plan.token_seq, plan.positions, plan.block_tables, tiles.first,
                       plan.max_blocks_per_seq, cache.block_size, n_heads, cache.n_kv_heads,
                       cache.head_dim, chunks.per_block, chunks.n, scale, s.len, s.n, out, part_out, part_ml};
    auto run = [&](auto kernel) { return cuda::launch_chained("attention_kernel", kernel, grid, kThreads, smem, st, a); };
    switch (wide) {  // the wide path's rows, a power of two up to kWideRows<T>
      case 0: return run(attention_kernel<T, 0>);
      case 1: return run(attention_kernel<T, 1>);
      case 2: return run(attention_kernel<T, 2>);
      case 4: return run(attention_kernel<T, 4>);
      default:
        if constexpr (kWideRows<T> >= 8) {
          if (wide == 8) return run(attention_kernel<T, 8>);
        }
        if constexpr (kWideRows<T> >= 16) {
          if (wide == 16) return run(attention_kernel<T, 16>);
        }
        return static_cast<int>(cudaErrorInvalidConfiguration);
    }
  };
  if (const int err = cuda::with_kv_elements(cache, launch); err != 0 || s.n == 1) return err;
  const int threads = std::min(256, (cache.head_dim + 31) / 32 * 32);
  return cuda::launch_chained("combine_kernel", combine_kernel, static_cast<unsigned>(n_items), threads, 0, st, part_out,
                              part_ml, s.n, cache.head_dim, out);
}

}  // namespace helios::kernels
