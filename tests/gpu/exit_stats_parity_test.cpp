// Exit-confidence statistics against ref_exit_stats (which sums in double).
// Tolerances: top-1 id exact; probabilities and margin 1e-5 relative + 1e-7 absolute; entropy
// 1e-4 absolute (float sums over up to 128K exponentials).
#include <algorithm>
#include <cmath>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

using gpu_test::all_near;
using gpu_test::DeviceArray;
using gpu_test::normal_floats;

TEST(GpuParity, ExitStatsMatchTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  for (int32_t n_vocab : {1, 2, 512, 32000, 49152, 128256}) {
    const int32_t n_rows = 6;
    auto logits = normal_floats(static_cast<size_t>(n_rows) * n_vocab, n_vocab, 3.0f);
    if (n_vocab > 10) {
      logits[0 * n_vocab + 7] = 40.0f;                                     // row 0: peaked
      logits[1 * n_vocab + 3] = logits[1 * n_vocab + 9] = 25.0f;           // row 1: a tie, margin 0
      for (int32_t i = 0; i < n_vocab; ++i) logits[2 * n_vocab + i] = 0.5f;  // row 2: flat
      for (int32_t i = 0; i < n_vocab; i += 3) logits[3 * n_vocab + i] = -INFINITY;  // row 3: masked entries
    }
    std::vector<int32_t> top1(n_rows);
    std::vector<float> prob(n_rows), margin(n_rows), entropy(n_rows);
    kernels::ref_exit_stats(logits.data(), n_rows, n_vocab, top1.data(), prob.data(), margin.data(), entropy.data());
    DeviceArray<float> d_logits(logits), d_prob(n_rows), d_margin(n_rows), d_entropy(n_rows);
    DeviceArray<int32_t> d_top1(n_rows);
    ASSERT_EQ(kernels::launch_exit_stats(d_logits.get(), n_rows, n_vocab, d_top1.get(), d_prob.get(), d_margin.get(),
                                         d_entropy.get(), nullptr), 0);
    EXPECT_EQ(d_top1.to_host(), top1) << "n_vocab " << n_vocab;
    EXPECT_TRUE(all_near(d_prob.to_host(), prob, 1e-5f, 1e-7f)) << "top-1 prob, n_vocab " << n_vocab;
    EXPECT_TRUE(all_near(d_margin.to_host(), margin, 1e-5f, 1e-7f)) << "margin, n_vocab " << n_vocab;
    EXPECT_TRUE(all_near(d_entropy.to_host(), entropy, 0.0f, 1e-4f)) << "entropy, n_vocab " << n_vocab;
  }
  // NaN logits (a forward pass gone wrong) count as -inf and +inf as FLT_MAX, as the twin takes
  // them: never a top-1 past the vocabulary that would be emitted as a token, rows with no number
  // are uniform, and two +inf share the mass.
  const int32_t n_vocab = 1000, n_rows = 5;
  std::vector<float> rows = normal_floats(n_rows * n_vocab, 3, 3.0f);
  rows[0] = NAN;                                                      // row 0: NaN first
  rows[n_vocab + kernels::ref_argmax(rows.data() + n_vocab, n_vocab)] = NAN;  // row 1: NaN at the best
  std::fill(rows.begin() + 2 * n_vocab, rows.begin() + 3 * n_vocab, NAN);  // row 2: all NaN
  std::fill(rows.begin() + 3 * n_vocab, rows.begin() + 4 * n_vocab, NAN);  // row 3: NaN and -inf alone
  rows[3 * n_vocab + 500] = -INFINITY;
  rows[4 * n_vocab + 10] = rows[4 * n_vocab + 900] = INFINITY;            // row 4: two +inf
  std::vector<int32_t> want(n_rows);
  std::vector<float> stats(3 * n_rows);
  kernels::ref_exit_stats(rows.data(), n_rows, n_vocab, want.data(), &stats[0], &stats[n_rows], &stats[2 * n_rows]);
  EXPECT_EQ(want[2], 0);
  EXPECT_EQ(want[3], 0);
  EXPECT_EQ(want[4], 10);
  EXPECT_EQ(stats[2], 1.0f / n_vocab) << "no number: uniform";
  EXPECT_FLOAT_EQ(stats[4], 0.5f) << "two +inf: half each";
  DeviceArray<float> d_rows(rows), d_stats(3 * n_rows);
  DeviceArray<int32_t> d_top1(n_rows);
  ASSERT_EQ(kernels::launch_exit_stats(d_rows.get(), n_rows, n_vocab, d_top1.get(), d_stats.get(),
                                       d_stats.get() + n_rows, d_stats.get() + 2 * n_rows, nullptr), 0);
  EXPECT_EQ(d_top1.to_host(), want);
  EXPECT_TRUE(all_near(d_stats.to_host(), stats, 1e-5f, 1e-4f)) << "statistics of rows with NaN";
}

}  // namespace
}  // namespace helios
