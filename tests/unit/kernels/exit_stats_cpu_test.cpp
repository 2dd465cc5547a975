// The CPU backend's softmax statistics (vectorised float exponentials, double sums) against the
// reference's double exponentials. Tolerances: top-1 id exact; probabilities, margin and the
// log-normaliser 2e-6 relative; entropy 1e-5 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace helios {
namespace {

std::vector<float> logits_of(int32_t n_rows, int32_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n_rows) * n_vocab);
  for (float& v : x) v = normal(rng);
  if (n_vocab > 10) {
    x[0 * n_vocab + 7] = 40.0f;                                   // row 0: peaked
    x[1 * n_vocab + 3] = x[1 * n_vocab + 9] = 25.0f;              // row 1: a tie (the lower id wins), margin 0
    for (int32_t i = 0; i < n_vocab; ++i) x[2 * n_vocab + i] = 0.5f;  // row 2: flat
    for (int32_t i = 0; i < n_vocab; i += 3) x[3 * n_vocab + i] = -INFINITY;  // row 3: masked entries
    x[4 * n_vocab + n_vocab - 1] = 60.0f;                         // row 4: the best is the last id (the scalar tail)
  }
  return x;
}

TEST(CpuExitStats, MatchTheDoubleReference) {
  for (int32_t n_vocab : {1, 2, 7, 8, 9, 31, 512, 49152, 151936}) {
    const int32_t n_rows = 6;
    const auto x = logits_of(n_rows, n_vocab, static_cast<uint32_t>(n_vocab));
    std::vector<int32_t> top1(n_rows), ref_top1(n_rows);
    std::vector<float> p(n_rows), m(n_rows), e(n_rows), ref_p(n_rows), ref_m(n_rows), ref_e(n_rows);
    kernels::ref_exit_stats(x.data(), n_rows, n_vocab, ref_top1.data(), ref_p.data(), ref_m.data(), ref_e.data());
    kernels::cpu_exit_stats(x.data(), n_rows, n_vocab, top1.data(), p.data(), m.data(), e.data());
    for (int32_t r = 0; r < n_rows; ++r) {
      SCOPED_TRACE("n_vocab " + std::to_string(n_vocab) + ", row " + std::to_string(r));
      EXPECT_EQ(top1[r], ref_top1[r]);
      EXPECT_NEAR(p[r], ref_p[r], 2e-6 * ref_p[r]);
      EXPECT_NEAR(m[r], ref_m[r], 2e-6 * std::fabs(ref_m[r]) + 1e-12);
      EXPECT_NEAR(e[r], ref_e[r], 1e-5);
      const float* row = x.data() + static_cast<size_t>(r) * n_vocab;
      double sum = 0, max = -INFINITY;
      for (int32_t i = 0; i < n_vocab; ++i) max = std::max(max, static_cast<double>(row[i]));
      for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - max);
      const double lse = max + std::log(sum);
      EXPECT_NEAR(kernels::cpu_log_sum_exp(row, n_vocab), lse, 2e-6 * std::fabs(lse) + 1e-6);
    }
  }
}

}  // namespace
}  // namespace helios
