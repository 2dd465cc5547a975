// ref_paged_attention against attention over contiguous K/V written out here: ragged sequence
// lengths, partial last blocks, GQA ratios, and NaN in every cache slot no sequence owns (so a read
// outside the block table poisons the result).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/fp8.h"

namespace helios {
namespace {

struct Shape {
  int n_heads, n_kv_heads, head_dim, block_size;
};

class PagedAttention : public ::testing::TestWithParam<Shape> {};

TEST_P(PagedAttention, EqualsContiguousAttention) {
  const Shape s = GetParam();
  const std::vector<int> lengths = {1, 17, 33, 5};  // tokens cached per sequence
  const int n_blocks = 64, kv_row = s.n_kv_heads * s.head_dim;
  std::mt19937 rng(s.n_heads * 100 + s.block_size);
  std::normal_distribution<float> normal;
  std::vector<float> k_cache(n_blocks * s.block_size * kv_row, NAN), v_cache(k_cache.size(), NAN);
  kernels::PagedKV cache{k_cache.data(), v_cache.data(), n_blocks, s.block_size, s.n_kv_heads, s.head_dim};

  // Blocks handed out in a shuffled order; K/V of each sequence also kept contiguously.
  std::vector<int> free_blocks(n_blocks);
  for (int i = 0; i < n_blocks; ++i) free_blocks[i] = i;
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  const int max_blocks = 33 / s.block_size + 1;
  std::vector<int32_t> tables(lengths.size() * max_blocks, -1);
  std::vector<std::vector<float>> k_seq(lengths.size()), v_seq(lengths.size());
  for (size_t q = 0; q < lengths.size(); ++q) {
    for (int b = 0; b * s.block_size < lengths[q]; ++b) {
      tables[q * max_blocks + b] = free_blocks.back();
      free_blocks.pop_back();
    }
    for (int p = 0; p < lengths[q]; ++p) {
      const int slot = tables[q * max_blocks + p / s.block_size] * s.block_size + p % s.block_size;
      for (int i = 0; i < kv_row; ++i) {
        k_seq[q].push_back(k_cache[slot * kv_row + i] = normal(rng));
        v_seq[q].push_back(v_cache[slot * kv_row + i] = normal(rng));
      }
    }
  }
  // One query token per sequence, at its last position.
  const int n_tokens = static_cast<int>(lengths.size());
  std::vector<int32_t> token_seq, positions;
  for (int q = 0; q < n_tokens; ++q) {
    token_seq.push_back(q);
    positions.push_back(lengths[q] - 1);
  }
  std::vector<float> queries(n_tokens * s.n_heads * s.head_dim);
  for (auto& x : queries) x = normal(rng);
  const kernels::AttentionPlan plan{n_tokens, token_seq.data(), positions.data(), tables.data(), max_blocks};
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));

  // Computed in three uneven pieces of (token, head) pairs.
  const int64_t n_items = static_cast<int64_t>(n_tokens) * s.n_heads;
  std::vector<float> out(queries.size(), 0.0f);
  kernels::ref_paged_attention(queries.data(), cache, plan, s.n_heads, scale, 0, 1, out.data());
  kernels::ref_paged_attention(queries.data(), cache, plan, s.n_heads, scale, 1, n_items / 2, out.data());
  kernels::ref_paged_attention(queries.data(), cache, plan, s.n_heads, scale, n_items / 2, n_items, out.data());

  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < s.n_heads; ++h) {
      const int kvh = h / (s.n_heads / s.n_kv_heads);
      const float* qh = &queries[(t * s.n_heads + h) * s.head_dim];
      std::vector<double> w(lengths[t]);
      double mx = -1e300, sum = 0;
      for (int p = 0; p < lengths[t]; ++p) {
        double d = 0;
        for (int i = 0; i < s.head_dim; ++i) d += qh[i] * k_seq[t][p * kv_row + kvh * s.head_dim + i];
        w[p] = d * scale;
        mx = std::max(mx, w[p]);
      }
      for (auto& x : w) sum += (x = std::exp(x - mx));
      for (int i = 0; i < s.head_dim; ++i) {
        double expected = 0;
        for (int p = 0; p < lengths[t]; ++p) expected += w[p] / sum * v_seq[t][p * kv_row + kvh * s.head_dim + i];
        ASSERT_NEAR(out[(t * s.n_heads + h) * s.head_dim + i], expected, 1e-5)
            << "token " << t << " head " << h << " dim " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttention,
                         ::testing::Values(Shape{4, 4, 8, 16}, Shape{8, 4, 16, 16}, Shape{8, 2, 8, 4},
                                           Shape{9, 3, 64, 16}, Shape{4, 1, 32, 1}));


// The CPU backend's kernel against the reference, for f32, f16 and fp8 caches: query-head groups from
// 1 to 9 (register-blocked up to 8, generic beyond), a head size that is not a multiple of 8, and
// contexts long enough to be split across threads (merged afterwards).
struct CpuShape {
  int n_heads, n_kv_heads, head_dim, block_size, n_threads;
};

class CpuPagedAttention : public ::testing::TestWithParam<CpuShape> {};

TEST_P(CpuPagedAttention, MatchesTheReference) {
  const CpuShape s = GetParam();
  const std::vector<int> lengths = {1, 700, 2, 1300};  // context of each sequence's query
  const int max_len = 1300, max_blocks = (max_len + s.block_size - 1) / s.block_size;
  const int n_seqs = static_cast<int>(lengths.size()), n_blocks = n_seqs * max_blocks;
  const int64_t kv_row = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
  std::mt19937 rng(s.n_heads * 31 + s.head_dim);
  std::normal_distribution<float> normal;
  std::vector<int32_t> tables(n_seqs * max_blocks);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  std::shuffle(tables.begin(), tables.end(), rng);

  for (const kernels::KvType type : {kernels::KvType::kF32, kernels::KvType::kF16, kernels::KvType::kFp8E4M3}) {
    SCOPED_TRACE(kernels::kv_type_name(type));
    const size_t n_values = static_cast<size_t>(n_blocks) * s.block_size * kv_row;
    std::vector<float> k_cache(n_values), v_cache(n_values);  // f16 and fp8 use the first half / quarter
    kernels::PagedKV cache{k_cache.data(), v_cache.data(), n_blocks, s.block_size, s.n_kv_heads, s.head_dim, type};
    // Every slot written through kv_write, so the f16 and fp8 caches hold rounded values.
    std::vector<float> k(n_values), v(n_values);
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    std::vector<int32_t> slots(static_cast<size_t>(n_blocks) * s.block_size);
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i);
    kernels::ref_kv_write(k.data(), v.data(), slots.data(), static_cast<int32_t>(slots.size()), cache);

    std::vector<int32_t> token_seq, positions;
    for (int q = 0; q < n_seqs; ++q) {  // two queries per sequence: its last position and its first
      token_seq.insert(token_seq.end(), {q, q});
      positions.insert(positions.end(), {lengths[q] - 1, 0});
    }
    const int n_tokens = static_cast<int>(token_seq.size());
    std::vector<float> queries(static_cast<size_t>(n_tokens) * s.n_heads * s.head_dim);
    for (auto& x : queries) x = normal(rng);
    const kernels::AttentionPlan plan{n_tokens, token_seq.data(), positions.data(), tables.data(), max_blocks};
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));

    std::vector<float> expected(queries.size()), out(queries.size(), NAN);
    kernels::ref_paged_attention(queries.data(), cache, plan, s.n_heads, scale, 0,
                                 static_cast<int64_t>(n_tokens) * s.n_heads, expected.data());
    const kernels::CpuAttentionWork work =
        kernels::cpu_attention_work(plan, s.n_heads, s.n_kv_heads, s.head_dim);
    std::vector<float> workspace(work.workspace_floats, NAN);
    for (int share = 0; share < s.n_threads; ++share)
      kernels::cpu_paged_attention(queries.data(), cache, plan, s.n_heads, scale, work, share, s.n_threads,
                                   workspace.data(), out.data());
    kernels::cpu_attention_merge(plan, s.n_heads, s.head_dim, work, workspace.data(), 0,
                                 static_cast<int64_t>(n_tokens) * s.n_heads, out.data());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 2e-5) << "value " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuPagedAttention,
                         ::testing::Values(CpuShape{9, 3, 64, 16, 2}, CpuShape{14, 2, 64, 16, 2},
                                           CpuShape{12, 2, 128, 16, 8}, CpuShape{8, 8, 16, 4, 64},
                                           CpuShape{9, 1, 64, 16, 2}, CpuShape{4, 2, 12, 8, 16}));

TEST(CpuPagedAttention, SplitsFollowTheLongestContextOnly) {
  std::vector<int32_t> seq(64, 0), pos(64);
  for (int i = 0; i < 64; ++i) pos[i] = 1000 + i;  // contexts 1001..1064: 4 and 5 splits of 256
  const std::vector<int32_t> table(80, 0);
  const kernels::AttentionPlan prompt{64, seq.data(), pos.data(), table.data(), 80};
  const kernels::CpuAttentionWork many = kernels::cpu_attention_work(prompt, 9, 3, 64);
  EXPECT_EQ(many.n_splits, 5);
  EXPECT_EQ(many.n_items, 64 * 3 * 5);
  EXPECT_EQ(many.workspace_floats, 64LL * 9 * 5 * (64 + 2));
  pos[0] = 10;
  const kernels::AttentionPlan one{1, seq.data(), pos.data(), table.data(), 80};
  EXPECT_EQ(kernels::cpu_attention_work(one, 9, 3, 64).n_splits, 1);
  EXPECT_EQ(kernels::cpu_attention_work(one, 9, 3, 64).workspace_floats, 0);
}

// Query tiles: runs of one sequence's tokens, cut at the tile size and where the sequence changes;
// the span sums each tile's longest context.
TEST(AttentionTiles, CutAtTheSizeAndAtEachSequence) {
  // a 5-token chunk of seq 0 (positions 10..14), a decode of seq 1, a 3-token prompt of seq 2
  const std::vector<int32_t> seq{0, 0, 0, 0, 0, 1, 2, 2, 2}, pos{10, 11, 12, 13, 14, 40, 0, 1, 2};
  const kernels::AttentionPlan plan{9, seq.data(), pos.data(), nullptr, 1};
  std::vector<int32_t> first;
  kernels::AttentionTiles tiles = kernels::attention_tiles(plan, 2, &first);
  EXPECT_EQ(first, (std::vector<int32_t>{0, 2, 4, 5, 6, 8, 9}));
  EXPECT_EQ(tiles.n_tiles, 6);
  EXPECT_EQ(tiles.first, first.data());
  EXPECT_EQ(tiles.span.longest, 41);
  EXPECT_EQ(tiles.span.total, 12 + 14 + 15 + 41 + 2 + 3);
  EXPECT_EQ(tiles.tile_tokens, 2);
  tiles = kernels::attention_tiles(plan, 16, &first);
  EXPECT_EQ(first, (std::vector<int32_t>{0, 5, 6, 9}));
  EXPECT_EQ(tiles.span.total, 15 + 41 + 3);
  EXPECT_EQ(tiles.tile_tokens, 5);  // the fullest tile's, not the 16 allowed
  const std::vector<int32_t> three_seqs{0, 1, 2};
  const kernels::AttentionPlan decodes{3, three_seqs.data(), pos.data(), nullptr, 1};
  EXPECT_EQ(kernels::attention_tiles(decodes, 16, &first).tile_tokens, 1);
  tiles = kernels::attention_tiles(plan, 1, &first);  // one token a tile: every token's own context
  EXPECT_EQ(tiles.n_tiles, 9);
  EXPECT_EQ(tiles.span.longest, 41);
  EXPECT_EQ(tiles.span.total, 11 + 12 + 13 + 14 + 15 + 41 + 1 + 2 + 3);
  const kernels::AttentionPlan empty{0, seq.data(), pos.data(), nullptr, 1};
  tiles = kernels::attention_tiles(empty, 4, &first);
  EXPECT_EQ(tiles.n_tiles, 0);
  EXPECT_EQ(tiles.span.longest, 0);
  EXPECT_EQ(tiles.span.total, 0);
  EXPECT_EQ(first, (std::vector<int32_t>{0}));
}

// A token's result is the same bits whatever else is in the batch: alone, or beside a much longer
// context that splits the batch more.
TEST(CpuPagedAttention, ATokensResultDoesNotDependOnTheBatch) {
  const int n_heads = 4, n_kv = 2, hd = 16, block = 16, max_blocks = 80, n_blocks = 2 * max_blocks;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> k(static_cast<size_t>(n_blocks) * block * n_kv * hd), v(k.size());
  for (auto& x : k) x = normal(rng);
  for (auto& x : v) x = normal(rng);
  kernels::PagedKV cache{k.data(), v.data(), n_blocks, block, n_kv, hd};
  std::vector<int32_t> tables(2 * max_blocks);
  for (int i = 0; i < 2 * max_blocks; ++i) tables[i] = i;
  std::vector<float> q(2 * n_heads * hd);
  for (auto& x : q) x = normal(rng);
  auto run = [&](const std::vector<int32_t>& seqs, const std::vector<int32_t>& positions) {
    const kernels::AttentionPlan plan{static_cast<int32_t>(seqs.size()), seqs.data(), positions.data(), tables.data(),
                                      max_blocks};
    const kernels::CpuAttentionWork work = kernels::cpu_attention_work(plan, n_heads, n_kv, hd);
    std::vector<float> ws(work.workspace_floats), out(seqs.size() * n_heads * hd);
    for (int share = 0; share < 2; ++share)
      kernels::cpu_paged_attention(q.data(), cache, plan, n_heads, 0.25f, work, share, 2, ws.data(), out.data());
    kernels::cpu_attention_merge(plan, n_heads, hd, work, ws.data(), 0, static_cast<int64_t>(seqs.size()) * n_heads,
                                 out.data());
    return out;
  };
  const std::vector<float> alone = run({0}, {600});
  const std::vector<float> batched = run({0, 1}, {600, 1200});
  ASSERT_EQ(std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)), 0);
}

TEST(KvWrite, F16CacheHoldsTheRoundedValues) {
  const int kv_row = 2 * 8;
  std::vector<float> k(3 * kv_row), v(3 * kv_row);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.1f * static_cast<float>(i) - 1.3f;
    v[i] = 65504.0f * (i % 2 ? 1 : -1) / static_cast<float>(i + 1);
  }
  std::vector<uint16_t> kc(4 * kv_row), vc(4 * kv_row);
  kernels::PagedKV cache{kc.data(), vc.data(), 1, 4, 2, 8, kernels::KvType::kF16};
  const int32_t slots[3] = {2, 0, 3};
  kernels::ref_kv_write(k.data(), v.data(), slots, 3, cache);
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < kv_row; ++i) {
      EXPECT_EQ(kc[slots[t] * kv_row + i], kernels::fp32_to_fp16(k[t * kv_row + i]));
      EXPECT_EQ(vc[slots[t] * kv_row + i], kernels::fp32_to_fp16(v[t * kv_row + i]));
    }
}

TEST(KvWrite, Fp8CacheHoldsTheRoundedCodes) {
  const int kv_row = 2 * 8;
  std::vector<float> k(3 * kv_row), v(3 * kv_row);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.37f * static_cast<float>(i) - 5.1f;
    v[i] = 600.0f * (i % 2 ? 1 : -1) / static_cast<float>(i + 1);  // the first ones saturate at ±448
  }
  std::vector<uint8_t> kc(4 * kv_row), vc(4 * kv_row);
  kernels::PagedKV cache{kc.data(), vc.data(), 1, 4, 2, 8, kernels::KvType::kFp8E4M3};
  const int32_t slots[3] = {2, 0, 3};
  kernels::ref_kv_write(k.data(), v.data(), slots, 3, cache);
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < kv_row; ++i) {
      EXPECT_EQ(kc[slots[t] * kv_row + i], kernels::fp32_to_fp8_e4m3(k[t * kv_row + i]));
      EXPECT_EQ(vc[slots[t] * kv_row + i], kernels::fp32_to_fp8_e4m3(v[t * kv_row + i]));
    }
  EXPECT_EQ(kernels::fp8_e4m3_to_fp32(vc[2 * kv_row]), -448.0f);
}

// E4M3 ("e4m3fn"): every code's value from its fields, encoding as the nearest code (ties to the
// even code), saturating at ±448, NaN to NaN — against a search over the 256 codes.
TEST(Fp8E4M3, CodesDecodeToTheirValues) {
  EXPECT_EQ(kernels::fp8_e4m3_to_fp32(0x00), 0.0f);
  EXPECT_EQ(kernels::fp8_e4m3_to_fp32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(kernels::fp8_e4m3_to_fp32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(kernels::fp8_e4m3_to_fp32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(kernels::fp8_e4m3_to_fp32(0x38), 1.0f);
  EXPECT_EQ(kernels::fp8_e4m3_to_fp32(0x3C), 1.5f);
  EXPECT_EQ(kernels::fp8_e4m3_to_fp32(0x7E), 448.0f);
  EXPECT_EQ(kernels::fp8_e4m3_to_fp32(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(kernels::fp8_e4m3_to_fp32(0x7F)));
  EXPECT_TRUE(std::isnan(kernels::fp8_e4m3_to_fp32(0xFF)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(kernels::fp32_to_fp8_e4m3(kernels::fp8_e4m3_to_fp32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(Fp8E4M3, EncodesToTheNearestCodeTiesToEven) {
  // The nearest finite code by search (ties: the even code), saturating beyond 448.
  auto nearest = [](float x) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const float a = std::fabs(x);
    int best = 0;
    for (int c = 1; c <= 0x7E; ++c) {
      const float d = std::fabs(kernels::fp8_e4m3_to_fp32(static_cast<uint8_t>(c)) - a);
      const float db = std::fabs(kernels::fp8_e4m3_to_fp32(static_cast<uint8_t>(best)) - a);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    return static_cast<uint8_t>(sign | best);
  };
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 10);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(mantissa(rng), exponent(rng));
    ASSERT_EQ(kernels::fp32_to_fp8_e4m3(x), nearest(x)) << x;
  }
  for (int c = 0; c < 0x7E; ++c) {  // every midpoint between neighbouring codes, and just beside it
    const float lo = kernels::fp8_e4m3_to_fp32(static_cast<uint8_t>(c));
    const float hi = kernels::fp8_e4m3_to_fp32(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;
    EXPECT_EQ(kernels::fp32_to_fp8_e4m3(mid), c % 2 == 0 ? c : c + 1) << "midpoint after code " << c;
    EXPECT_EQ(kernels::fp32_to_fp8_e4m3(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(kernels::fp32_to_fp8_e4m3(std::nextafter(mid, 1000.0f)), c + 1);
  }
  EXPECT_EQ(kernels::fp32_to_fp8_e4m3(460.0f), 0x7E);
  EXPECT_EQ(kernels::fp32_to_fp8_e4m3(1e30f), 0x7E);
  EXPECT_EQ(kernels::fp32_to_fp8_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(kernels::fp32_to_fp8_e4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(kernels::fp32_to_fp8_e4m3(-0.0f), 0x80);
}

}  // namespace
}  // namespace helios
