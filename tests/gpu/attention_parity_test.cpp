// KV write and paged attention against their CPU twins, on plans that mix prefill chunks and
// decodes, with ragged lengths, partial last blocks, scattered block ids, GQA ratios 1–8, wide
// multi-query groups and contexts long enough for the split-context path. Cache slots no token
// writes hold NaN: reading one would poison the output.
// Tolerance: 2e-5 relative + 2e-6 absolute: softmax weights and sums in float, in another order.
// f32, f16 and fp8 caches; query tiles of the kernel's size and of one token; the cache read 16
// bytes at a time where the shape allows (decode tiles of few rows) and an element at a time.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "gpu/gpu_test_util.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

using gpu_test::all_near;
using gpu_test::DeviceArray;
using gpu_test::normal_floats;

struct Shape {
  int32_t n_heads, n_kv_heads, head_dim;
};

// Sequences with (cached length, new tokens): the new tokens are computed this step.
struct SeqSpec {
  int32_t cached, new_tokens;
};

// The cache's elements: f32, f16 as 16-bit words (2 to a float of the arrays below), or fp8
// bytes (4 to a float).
int64_t cache_floats_of(int64_t elements, kernels::KvType type) {
  const int64_t per_float = 4 / kernels::kv_type_bytes(type);
  return (elements + per_float - 1) / per_float;
}

void check_attention(const Shape& sh, const std::vector<SeqSpec>& seqs, uint32_t seed,
                     kernels::KvType type = kernels::KvType::kF32) {
  const int32_t block_size = 16;
  int32_t max_blocks = 1, total_blocks = 0;
  for (const auto& s : seqs) {
    const int32_t nb = (s.cached + s.new_tokens + block_size - 1) / block_size;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
  }
  const int32_t n_blocks = total_blocks + 3;
  // Block ids: a seeded shuffle, so a sequence's blocks are not contiguous.
  std::vector<int32_t> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  std::vector<int32_t> tables(seqs.size() * max_blocks, -1), token_seq, positions, slots;
  size_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int32_t len = seqs[s].cached + seqs[s].new_tokens;
    for (int32_t b = 0; b < (len + block_size - 1) / block_size; ++b) tables[s * max_blocks + b] = ids[next++];
  }
  // Every position of every sequence is written (cached ones as if by earlier steps); the tokens
  // computed this step are the new ones.
  std::vector<int32_t> all_slots;
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int32_t p = 0; p < seqs[s].cached + seqs[s].new_tokens; ++p) {
      const int32_t slot = tables[s * max_blocks + p / block_size] * block_size + p % block_size;
      all_slots.push_back(slot);
      if (p >= seqs[s].cached) {
        token_seq.push_back(static_cast<int32_t>(s));
        positions.push_back(p);
      }
    }
  }
  const int32_t n_all = static_cast<int32_t>(all_slots.size());
  const int32_t n_tokens = static_cast<int32_t>(positions.size());
  const int64_t kv_row = static_cast<int64_t>(sh.n_kv_heads) * sh.head_dim;
  const auto k = normal_floats(n_all * kv_row, seed + 1), v = normal_floats(n_all * kv_row, seed + 2);
  const auto q = normal_floats(static_cast<size_t>(n_tokens) * sh.n_heads * sh.head_dim, seed + 3);

  // NaN padding: an f32 NaN, or two f16 NaNs (0x7E00) in each 32-bit word.
  const size_t cache_floats = cache_floats_of(static_cast<int64_t>(n_blocks) * block_size * kv_row, type);
  float pad = NAN;
  if (type != kernels::KvType::kF32) {  // two f16 NaNs (0x7E00), or four fp8 NaNs (0x7F)
    const uint32_t nans = type == kernels::KvType::kF16 ? 0x7E007E00u : 0x7F7F7F7Fu;
    std::memcpy(&pad, &nans, sizeof pad);
  }
  std::vector<float> k_cache(cache_floats, pad), v_cache(cache_floats, pad);
  kernels::PagedKV host_cache{k_cache.data(), v_cache.data(), n_blocks, block_size, sh.n_kv_heads, sh.head_dim, type};
  kernels::ref_kv_write(k.data(), v.data(), all_slots.data(), n_all, host_cache);

  DeviceArray<float> d_k(k), d_v(v), d_q(q), d_kc(std::vector<float>(cache_floats, pad)),
      d_vc(std::vector<float>(cache_floats, pad));
  DeviceArray<int32_t> d_all_slots(all_slots), d_seq(token_seq), d_pos(positions), d_tables(tables);
  kernels::PagedKV dev_cache{d_kc.get(), d_vc.get(), n_blocks, block_size, sh.n_kv_heads, sh.head_dim, type};
  ASSERT_EQ(kernels::launch_kv_write(d_k.get(), d_v.get(), d_all_slots.get(), n_all, dev_cache, nullptr), 0);
  // The cache is bit-identical, NaN padding included (compared as bits).
  const auto got_k = d_kc.to_host();
  ASSERT_EQ(0, std::memcmp(got_k.data(), k_cache.data(), cache_floats * sizeof(float)))
      << "kv_write K (" << kernels::kv_type_name(type) << ")";
  const auto got_v = d_vc.to_host();
  ASSERT_EQ(0, std::memcmp(got_v.data(), v_cache.data(), cache_floats * sizeof(float))) << "kv_write V";

  const kernels::AttentionPlan host_plan{n_tokens, token_seq.data(), positions.data(), tables.data(), max_blocks};
  const kernels::AttentionPlan dev_plan{n_tokens, d_seq.get(), d_pos.get(), d_tables.get(), max_blocks};
  const float scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
  std::vector<float> want(q.size());
  kernels::ref_paged_attention(q.data(), host_cache, host_plan, sh.n_heads, scale, 0,
                               static_cast<int64_t>(n_tokens) * sh.n_heads, want.data());
  // Query tiles of the kernel's own size (K/V shared by a prefill chunk's tokens) and of one
  // token each: the same results.
  for (const int32_t tile_tokens : {kernels::attention_tile_tokens(sh.n_heads, sh.n_kv_heads, sh.head_dim), 1}) {
    for (const bool general_loads : {false, true}) {
      std::vector<int32_t> first;
      kernels::AttentionTiles tiles = kernels::attention_tiles(host_plan, tile_tokens, &first);
      DeviceArray<int32_t> d_first(first);
      tiles.first = d_first.get();
      tiles.general_loads = general_loads;
      const bool wide = !general_loads && kernels::paged_attention_reads_wide(type, sh.n_heads, sh.n_kv_heads,
                                                                              sh.head_dim, tiles.tile_tokens);
      const int64_t ws_floats = kernels::paged_attention_workspace_floats(n_tokens, sh.n_heads, sh.n_kv_heads,
                                                                         sh.head_dim, tiles.span);
      DeviceArray<float> d_ws(static_cast<size_t>(std::max<int64_t>(ws_floats, 1))), d_out(q.size());
      ASSERT_EQ(kernels::launch_paged_attention(d_q.get(), dev_cache, dev_plan, sh.n_heads, scale, tiles,
                                                ws_floats ? d_ws.get() : nullptr, d_out.get(), nullptr), 0);
      EXPECT_TRUE(all_near(d_out.to_host(), want, 2e-5f, 2e-6f))
          << kernels::kv_type_name(type) << " heads " << sh.n_heads << "/" << sh.n_kv_heads
          << " head_dim " << sh.head_dim << " tokens " << n_tokens << " tiles " << tiles.n_tiles << " of up to "
          << tile_tokens << " longest context " << tiles.span.longest << " splits workspace " << ws_floats
          << (wide ? ", 16-byte reads" : ", element reads");
    }
  }
}

TEST(GpuParity, PagedAttentionDecodeMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  // One decoding token per sequence, short to long contexts (long ones take the split path).
  for (const Shape& sh : {Shape{8, 4, 8}, Shape{9, 3, 64}, Shape{32, 32, 128}, Shape{32, 8, 128}, Shape{16, 2, 64}}) {
    check_attention(sh, {{0, 1}}, 1);
    check_attention(sh, {{16, 1}, {17, 1}, {300, 1}}, 2);
    check_attention(sh, {{4100, 1}}, 3);
    // one long context beside short ones: it takes its own splits, they one each
    check_attention(sh, {{5000, 1}, {3, 1}, {40, 1}, {130, 1}, {0, 1}, {257, 1}}, 7);
  }
}

TEST(GpuParity, PagedAttentionPrefillAndMixedBatchesMatchTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  for (const Shape& sh : {Shape{8, 4, 8}, Shape{9, 3, 64}, Shape{32, 8, 128}}) {
    check_attention(sh, {{0, 37}}, 4);                            // a whole prompt
    check_attention(sh, {{48, 33}, {0, 5}, {700, 1}, {15, 1}}, 5);  // a chunk, a prompt, decodes
    // The host emulation takes the long chunks on the small shapes only: the same tiles and splits,
    // where 32 heads of 128 would take it most of an hour.
    if (gpu_test::kHostEmulation && sh.n_heads * sh.head_dim > 1024) continue;
    check_attention(sh, {{1000, 300}}, 6);                        // a long chunk after a long cache
    check_attention(sh, {{0, 600}, {3000, 40}, {20, 1}}, 8);      // long chunks: tiles and splits both
    check_attention(sh, {{0, 1500}, {6000, 1}}, 9);  // so many tokens that the long decode takes longer splits
  }
}

// An f16 cache: kv_write rounds as the CPU twin does (to nearest even: the same bits), and
// attention reads the same halves, converted, so it keeps the f32 tolerance.
TEST(GpuParity, PagedAttentionWithAnF16CacheMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  for (const Shape& sh : {Shape{8, 4, 8}, Shape{9, 3, 64}, Shape{32, 8, 128}, Shape{16, 2, 64}}) {
    check_attention(sh, {{0, 1}}, 11, kernels::KvType::kF16);
    check_attention(sh, {{16, 1}, {17, 1}, {300, 1}}, 12, kernels::KvType::kF16);
    check_attention(sh, {{4100, 1}}, 13, kernels::KvType::kF16);  // the split path
    check_attention(sh, {{48, 33}, {0, 5}, {700, 1}, {15, 1}}, 14, kernels::KvType::kF16);
    check_attention(sh, {{0, 1}}, 15, kernels::KvType::kFp8E4M3);
    check_attention(sh, {{16, 1}, {17, 1}, {300, 1}}, 16, kernels::KvType::kFp8E4M3);
    check_attention(sh, {{4100, 1}}, 17, kernels::KvType::kFp8E4M3);
    check_attention(sh, {{48, 33}, {0, 5}, {700, 1}, {15, 1}}, 18, kernels::KvType::kFp8E4M3);
  }
}

// Query heads per KV head × head_dim past one block (multi-query): the group in chunks, each
// reading the K/V, with the same results. Falcon-7B's 71 over 1 (chunks of 24, 24, 23), StarCoder's
// 48 over 1 (3 of 16), and head_dim 32 whose 64-head groups fit the row values but not shared
// memory (2 of 32).
TEST(GpuParity, PagedAttentionWithWideMultiQueryGroupsMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  for (const Shape& sh : {Shape{71, 1, 64}, Shape{48, 1, 128}, Shape{128, 2, 32}}) {
    check_attention(sh, {{0, 1}}, 21);
    check_attention(sh, {{16, 1}, {17, 1}, {300, 1}}, 22);
    check_attention(sh, {{4100, 1}, {3, 1}}, 23);                   // the split path
    check_attention(sh, {{48, 33}, {0, 5}, {700, 1}, {15, 1}}, 24);  // prefill chunks beside decodes
    check_attention(sh, {{16, 1}, {300, 7}}, 25, kernels::KvType::kF16);
  }
}

TEST(GpuParity, PagedAttentionRefusesAnUnsupportedShape) {
  HELIOS_REQUIRE_GPU();
  // head_dim past 256 (a lane holds at most 8 values of a K row): an error, not a wrong answer.
  kernels::PagedKV cache{nullptr, nullptr, 1, 16, 1, 512};
  const kernels::AttentionPlan plan{1, nullptr, nullptr, nullptr, 1};
  kernels::AttentionTiles one_token;
  one_token.span = {1, 1};
  EXPECT_NE(kernels::launch_paged_attention(nullptr, cache, plan, 8, 1.0f, one_token, nullptr, nullptr, nullptr), 0);
}

// Which models the kernel serves, decided on the host (CudaBackend refuses the others at load).
TEST(AttentionShapes, ServedModelsAndWideMultiQueryOnesFit) {
  struct Case {
    const char* model;
    int32_t heads, kv_heads, head_dim;
    bool fits;
  };
  for (const Case& c : {Case{"stories260K", 8, 4, 8, true}, Case{"SmolLM2-135M", 9, 3, 64, true},
                        Case{"Qwen2.5-0.5B", 14, 2, 64, true}, Case{"Qwen2.5-1.5B", 12, 2, 128, true},
                        Case{"Qwen2.5-7B", 28, 4, 128, true}, Case{"Llama-2-7B", 32, 32, 128, true},
                        Case{"Llama-3-70B", 64, 8, 128, true}, Case{"Falcon-7B (multi-query)", 71, 1, 64, true},
                        Case{"StarCoder (multi-query)", 48, 1, 128, true}, Case{"head_dim 512", 8, 8, 512, false},
                        Case{"heads not a multiple of KV heads", 9, 2, 64, false}, Case{"no KV heads", 8, 0, 64, false}}) {
    EXPECT_EQ(kernels::paged_attention_supports(c.heads, c.kv_heads, c.head_dim), c.fits) << c.model;
    if (c.fits) {
      EXPECT_GE(kernels::attention_tile_tokens(c.heads, c.kv_heads, c.head_dim), 1) << c.model;
    }
  }
  // Tiles hold whole groups where they fit: Llama-2-7B 16 tokens, Qwen2.5-1.5B 2, a wide group one.
  EXPECT_EQ(kernels::attention_tile_tokens(32, 32, 128), 16);
  EXPECT_EQ(kernels::attention_tile_tokens(12, 2, 128), 2);
  EXPECT_EQ(kernels::attention_tile_tokens(71, 1, 64), 1);
}

// Decode (a token per tile) reads the cache 16 bytes at a time for the served models in f16 and
// f32, and in fp8 where the group is 4 heads or fewer (a thread's sums for 16 values a row);
// prefill tiles, head_dim 8 in fp8 (less than a chunk) and wide multi-query groups read an
// element at a time (host-side, no GPU needed).
TEST(AttentionShapes, DecodeOfServedModelsReadsTheCacheSixteenBytesAtATime) {
  using kernels::KvType;
  struct Case {
    const char* model;
    Shape shape;
    bool f16, f32, fp8;
  };
  for (const Case& c : {Case{"SmolLM2-135M", {9, 3, 64}, true, true, true},
                        Case{"Qwen2.5-0.5B", {14, 2, 64}, true, true, false},
                        Case{"Qwen2.5-1.5B", {12, 2, 128}, true, true, false},
                        Case{"Llama-2-7B", {32, 32, 128}, true, true, true},
                        Case{"Llama-3-8B", {32, 8, 128}, true, true, true},
                        Case{"stories260K", {8, 4, 8}, true, true, false},
                        Case{"Falcon-7B (multi-query)", {71, 1, 64}, false, false, false}}) {
    const Shape& sh = c.shape;
    EXPECT_EQ(kernels::paged_attention_reads_wide(KvType::kF16, sh.n_heads, sh.n_kv_heads, sh.head_dim, 1), c.f16)
        << c.model << " f16";
    EXPECT_EQ(kernels::paged_attention_reads_wide(KvType::kF32, sh.n_heads, sh.n_kv_heads, sh.head_dim, 1), c.f32)
        << c.model << " f32";
    EXPECT_EQ(kernels::paged_attention_reads_wide(KvType::kFp8E4M3, sh.n_heads, sh.n_kv_heads, sh.head_dim, 1), c.fp8)
        << c.model << " fp8";
  }
  const int32_t prefill = kernels::attention_tile_tokens(32, 8, 128);
  EXPECT_FALSE(kernels::paged_attention_reads_wide(KvType::kF16, 32, 8, 128, prefill)) << prefill << "-token tiles";
}

// The splits' workspace stays within the bound CudaBackend reserves before sizing the KV cache,
// whatever the pass: a prefill chunk beside a long decode takes fewer, longer splits, while a
// lone long decode still splits (host-side, no GPU needed).
TEST(AttentionShapes, SplitWorkspaceStaysWithinItsBound) {
  for (const Shape& sh : {Shape{9, 3, 64}, Shape{12, 2, 128}, Shape{32, 32, 128}, Shape{64, 8, 128}, Shape{71, 1, 64},
                          Shape{128, 2, 32}}) {
    const int64_t bound = kernels::paged_attention_workspace_bound(sh.n_heads, sh.head_dim);
    for (const int32_t n_tokens : {1, 2, 7, 64, 300, 2048, 4096, 4097, 16384}) {
      for (const int32_t longest : {1, 255, 257, 4100, 32768, 131072}) {
        for (const int64_t total : {int64_t{longest}, int64_t{longest} * 2, int64_t{longest} * n_tokens}) {
          const int64_t ws = kernels::paged_attention_workspace_floats(n_tokens, sh.n_heads, sh.n_kv_heads, sh.head_dim,
                                                                       kernels::ContextSpan{longest, total});
          EXPECT_LE(ws, bound) << "heads " << sh.n_heads << "/" << sh.n_kv_heads << " tokens " << n_tokens
                               << " longest " << longest << " total " << total;
        }
      }
    }
    EXPECT_GT(kernels::paged_attention_workspace_floats(1, sh.n_heads, sh.n_kv_heads, sh.head_dim, {131072, 131072}), 0)
        << "one long decode splits its context";
  }
}

}  // namespace
}  // namespace helios
