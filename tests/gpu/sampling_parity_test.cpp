// Argmax and seeded sampling against ref_argmax / ref_sample. Both draw the same uniform from
// (seed, step), so the ids must agree; they can differ only if u · Σp falls within float
// rounding of a boundary between two ids, which these seeded inputs do not hit.
#include "gpu/gpu_test_util.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

using gpu_test::DeviceArray;
using gpu_test::normal_floats;

std::vector<int32_t> run_sample(const std::vector<float>& logits, int32_t n_rows, int32_t n_vocab,
                                const std::vector<kernels::SampleParams>& params) {
  DeviceArray<float> d_logits(logits);
  DeviceArray<kernels::SampleParams> d_params(params);
  DeviceArray<int32_t> d_out(n_rows);
  EXPECT_EQ(kernels::launch_sample(d_logits.get(), n_rows, n_vocab, d_params.get(), d_out.get(), nullptr), 0);
  return d_out.to_host();
}

TEST(GpuParity, ArgmaxMatchesTheCpuTwinWithTies) {
  HELIOS_REQUIRE_GPU();
  for (int32_t n_vocab : {1, 7, 32000, 128256}) {
    const int32_t n_rows = 4;
    auto logits = normal_floats(static_cast<size_t>(n_rows) * n_vocab, n_vocab);
    if (n_vocab > 100) {
      logits[1 * n_vocab + 90] = logits[1 * n_vocab + 40] = 50.0f;  // the lower index wins
      for (int32_t i = 0; i < n_vocab; ++i) logits[2 * n_vocab + i] = -INFINITY;
    }
    std::vector<int32_t> want(n_rows);
    kernels::ref_argmax(logits.data(), n_rows, n_vocab, want.data());
    DeviceArray<float> d_logits(logits);
    DeviceArray<int32_t> d_out(n_rows);
    ASSERT_EQ(kernels::launch_argmax(d_logits.get(), n_rows, n_vocab, d_out.get(), nullptr), 0);
    EXPECT_EQ(d_out.to_host(), want) << "n_vocab " << n_vocab;
  }
}

TEST(GpuParity, SamplingMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  const int32_t n_vocab = 32000;
  struct Setting { float temperature; int32_t top_k; float top_p; };
  const std::vector<Setting> settings = {
      {0.0f, 0, 1.0f},   {1.0f, 0, 1.0f},    {0.7f, 0, 1.0f},    {1.0f, 40, 1.0f},  {0.8f, 0, 0.9f},
      {1.3f, 50, 0.95f}, {1.0f, 1, 1.0f},    {1.0f, 1024, 1.0f}, {1.0f, 5000, 0.5f}, {2.0f, 0, 0.99f}};
  // Rows: peaked and flat distributions, 64 draws (steps) each.
  for (const Setting& s : settings) {
    const int32_t n_rows = 64;
    auto logits = normal_floats(static_cast<size_t>(n_rows) * n_vocab, 1000 + s.top_k, 2.5f);
    std::vector<kernels::SampleParams> params(n_rows);
    for (int32_t r = 0; r < n_rows; ++r) {
      params[r].temperature = s.temperature;
      params[r].top_k = s.top_k;
      params[r].top_p = s.top_p;
      params[r].seed = 12345 + r % 4;
      params[r].step = static_cast<uint64_t>(r);
    }
    std::vector<int32_t> want(n_rows);
    kernels::ref_sample(logits.data(), n_rows, n_vocab, params.data(), want.data());
    EXPECT_EQ(run_sample(logits, n_rows, n_vocab, params), want)
        << "temperature " << s.temperature << " top_k " << s.top_k << " top_p " << s.top_p;
  }
}

TEST(GpuParity, SamplingBreaksTiesByIndexAsTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  // All logits equal: top-k keeps the k lowest ids, so every draw is below k.
  const int32_t n_vocab = 5000, n_rows = 32;
  const std::vector<float> logits(static_cast<size_t>(n_rows) * n_vocab, 1.0f);
  std::vector<kernels::SampleParams> params(n_rows);
  for (int32_t r = 0; r < n_rows; ++r) params[r] = {1.0f, 10 + r, r % 2 ? 0.5f : 1.0f, 0, 7, static_cast<uint64_t>(r)};
  std::vector<int32_t> want(n_rows);
  kernels::ref_sample(logits.data(), n_rows, n_vocab, params.data(), want.data());
  const auto got = run_sample(logits, n_rows, n_vocab, params);
  EXPECT_EQ(got, want);
  for (int32_t r = 0; r < n_rows; ++r) EXPECT_LT(got[r], params[r].top_k) << "row " << r;
}

TEST(GpuParity, SampleUniformIsAPureFunctionOfSeedAndStep) {
  HELIOS_REQUIRE_GPU();
  EXPECT_EQ(kernels::ref_sample_uniform(1, 2), kernels::ref_sample_uniform(1, 2));
  EXPECT_NE(kernels::ref_sample_uniform(1, 2), kernels::ref_sample_uniform(1, 3));
  EXPECT_NE(kernels::ref_sample_uniform(1, 2), kernels::ref_sample_uniform(2, 2));
  double mean = 0;
  for (uint64_t s = 0; s < 10000; ++s) {
    const float u = kernels::ref_sample_uniform(99, s);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    mean += u / 10000.0;
  }
  EXPECT_NEAR(mean, 0.5, 0.02);
}

}  // namespace
}  // namespace helios
