// ref_paged_attention against attention over contiguous K/V written out here: ragged sequence
// lengths, partial last blocks, GQA ratios, and NaN in every cache slot no sequence owns (so a read
// outside the block table poisons the result).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/kernels.h"

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

}  // namespace
}  // namespace helios
