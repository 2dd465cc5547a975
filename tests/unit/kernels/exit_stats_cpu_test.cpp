// The CPU backend's softmax statistics (vectorised float exponentials, double sums) against the
// reference's double exponentials. Tolerances: top-1 id exact; probabilities, margin and the
// log-normaliser 2e-6 relative; entropy 1e-5 absolute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>
#include <string>
#include <utility>
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
      const kernels::LogSoftmax ls = kernels::cpu_log_softmax(row, n_vocab);
      EXPECT_NEAR(ls.max + ls.log_sum, lse, 2e-6 * std::fabs(lse) + 1e-6);
    }
  }
}

// Logits as softmax_logit takes them, in the vector loop or the scalar tail: NaN as −inf (the top-1
// is ref_argmax's, and the statistics those of the row with −inf in its place, as
// helios::confidence_stats has it), +inf as FLT_MAX (the largest share the mass); a row with no
// number above −inf is uniform.
TEST(CpuExitStats, NanCountsAsMinusInfinityAndInfinityAsTheLargestFloat) {
  const float nan = NAN, inf = INFINITY;
  for (int32_t n : {3, 9, 1000, 1003}) {
    std::vector<float> base(n);
    for (int32_t i = 0; i < n; ++i) base[i] = std::sin(0.37f * i);  // all below 1
    auto with = [&](std::vector<float> x, std::initializer_list<std::pair<int32_t, float>> set) {
      for (const auto& [i, v] : set) x[i] = v;
      return x;
    };
    const std::vector<float> all_nan(n, nan), all_low(n, -inf);
    const std::vector<std::pair<std::vector<float>, int32_t>> rows = {
        {with(base, {{0, nan}, {n / 2, 5.0f}}), n / 2},             // NaN first
        {with(base, {{n - 2, nan}, {n - 1, 5.0f}}), n - 1},         // NaN beside the best, at the end
        {with(base, {{1, 5.0f}, {n - 1, nan}}), 1},                 // NaN last
        {with(base, {{1, nan}, {2, 5.0f}, {0, 5.0f}}), 0},          // a tie across a NaN: the lower id
        {all_nan, 0},                                                // no number: the first id
        {with(all_low, {{0, nan}, {n - 1, nan}}), 0},                // NaN ties with −inf
        {with(all_nan, {{n - 1, -inf}}), 0},
        {with(all_nan, {{n - 1, -3.0f}}), n - 1},
        {with(base, {{1, inf}, {n - 1, inf}}), 1},                  // two +inf share the mass
        {with(base, {{2, FLT_MAX}, {n - 1, inf}, {0, nan}}), 2},    // +inf ties with FLT_MAX
    };
    for (size_t k = 0; k < rows.size(); ++k) {
      SCOPED_TRACE("n " + std::to_string(n) + ", row " + std::to_string(k));
      const std::vector<float>& x = rows[k].first;
      std::vector<float> masked = x;
      for (float& v : masked) v = std::isnan(v) ? -inf : std::fmin(v, FLT_MAX);
      int32_t want_top1 = -1, ref_top1 = -1, top1 = -1;
      float want[3], ref[3], cpu[3];
      kernels::ref_exit_stats(masked.data(), 1, n, &want_top1, &want[0], &want[1], &want[2]);
      kernels::ref_exit_stats(x.data(), 1, n, &ref_top1, &ref[0], &ref[1], &ref[2]);
      kernels::cpu_exit_stats(x.data(), 1, n, &top1, &cpu[0], &cpu[1], &cpu[2]);
      EXPECT_EQ(kernels::ref_argmax(x.data(), n), rows[k].second);
      EXPECT_EQ(want_top1, rows[k].second);
      EXPECT_EQ(ref_top1, rows[k].second);
      EXPECT_EQ(top1, rows[k].second);
      // The log-softmax of the top-1 (LogSoftmax's rule), twice: vectorised and in the reference.
      const kernels::LogSoftmax ls = kernels::cpu_log_softmax(x.data(), n);
      const double top1_log_prob = ls.at(x[top1]);
      EXPECT_NEAR(kernels::ref_neg_log_prob(x.data(), n, top1), -top1_log_prob, 1e-6);
      if (!(x[rows[k].second] > -inf)) {  // no number: no token preferred
        const float uniform[3] = {1.0f / n, 0.0f, static_cast<float>(std::log(static_cast<double>(n)))};
        for (int s = 0; s < 3; ++s) {
          EXPECT_EQ(want[s], uniform[s]) << "statistic " << s;
          EXPECT_EQ(ref[s], uniform[s]) << "statistic " << s;
          EXPECT_EQ(cpu[s], uniform[s]) << "statistic " << s;
        }
        EXPECT_EQ(top1_log_prob, -std::log(static_cast<double>(n)));
        EXPECT_EQ(ls.at(x[n - 1]), top1_log_prob) << "every id alike";
        continue;
      }
      for (int s = 0; s < 3; ++s) {
        EXPECT_EQ(ref[s], want[s]) << "statistic " << s;
        EXPECT_NEAR(cpu[s], want[s], 1e-5) << "statistic " << s;
      }
      const auto n_top = std::count_if(x.begin(), x.end(), [](float v) { return v >= FLT_MAX; });
      if (n_top == 2) {  // two largest: half the mass each
        EXPECT_FLOAT_EQ(ref[0], 0.5f);
        EXPECT_EQ(ref[1], 0.0f);
        EXPECT_NEAR(ref[2], std::log(2.0), 1e-6);
        EXPECT_NEAR(top1_log_prob, std::log(0.5), 1e-7) << "max + log Σ would round the log term away";
      }
      const kernels::LogSoftmax ls_masked = kernels::cpu_log_softmax(masked.data(), n);
      EXPECT_EQ(ls.max, ls_masked.max);
      EXPECT_EQ(ls.log_sum, ls_masked.log_sum);
    }
  }
}

}  // namespace
}  // namespace helios
