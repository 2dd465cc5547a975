// Embedding, SwiGLU, add and the fused add + RMSNorm against their CPU twins.
// Tolerances: the gather and add are exact; SwiGLU 1e-6 relative (expf vs std::exp, ≤ 2 ulp);
// add + RMSNorm 1e-5 relative, as RMSNorm (both reduce in double).
#include "gpu/gpu_test_util.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

using gpu_test::all_near;
using gpu_test::DeviceArray;
using gpu_test::normal_floats;

TEST(GpuParity, EmbeddingGathersTheSameRows) {
  HELIOS_REQUIRE_GPU();
  const int32_t n_vocab = 1000, dim = 576;
  const auto table = normal_floats(static_cast<size_t>(n_vocab) * dim, 1);
  const std::vector<int32_t> tokens = {0, 999, 17, 17, 500, 3};
  const int32_t n = static_cast<int32_t>(tokens.size());
  std::vector<float> want(static_cast<size_t>(n) * dim);
  kernels::ref_embedding(tokens.data(), n, table.data(), dim, want.data());
  DeviceArray<float> d_table(table), d_out(want.size());
  DeviceArray<int32_t> d_tokens(tokens);
  ASSERT_EQ(kernels::launch_embedding(d_tokens.get(), n, d_table.get(), dim, d_out.get(), nullptr), 0);
  EXPECT_EQ(d_out.to_host(), want);
}

TEST(GpuParity, SwigluMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  for (int64_t n : {1, 1000, 1536 * 7 + 3}) {
    const auto gate = normal_floats(n, 2, 4.0f), up = normal_floats(n, 3);
    std::vector<float> want(n);
    kernels::ref_swiglu(gate.data(), up.data(), n, want.data());
    DeviceArray<float> d_gate(gate), d_up(up), d_out(n);
    ASSERT_EQ(kernels::launch_swiglu(d_gate.get(), d_up.get(), n, d_out.get(), nullptr), 0);
    EXPECT_TRUE(all_near(d_out.to_host(), want, 1e-6f, 1e-7f)) << "n " << n;
  }
}

TEST(GpuParity, AddMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  const int64_t n = 4096 * 5 + 1;
  auto x = normal_floats(n, 4);
  const auto y = normal_floats(n, 5);
  DeviceArray<float> d_x(x), d_y(y);
  ASSERT_EQ(kernels::launch_add(d_x.get(), d_y.get(), n, nullptr), 0);
  kernels::ref_add(x.data(), y.data(), n);
  EXPECT_EQ(d_x.to_host(), x);
}

TEST(GpuParity, AddRowsMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  for (const auto& [n_rows, dim] : {std::pair{1, 896}, std::pair{7, 128}, std::pair{33, 1536}}) {
    auto rows = normal_floats(static_cast<size_t>(n_rows) * dim, 6);
    const auto v = normal_floats(dim, 7);
    DeviceArray<float> d_rows(rows), d_v(v);
    ASSERT_EQ(kernels::launch_add_rows(d_rows.get(), d_v.get(), n_rows, dim, nullptr), 0);
    kernels::ref_add_rows(rows.data(), v.data(), n_rows, dim);
    EXPECT_EQ(d_rows.to_host(), rows) << n_rows << " rows of " << dim;
  }
}

TEST(GpuParity, AddRmsNormMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  for (int32_t dim : {64, 576, 4096}) {
    const int32_t n_rows = 5;
    auto x = normal_floats(static_cast<size_t>(n_rows) * dim, dim, 3.0f);
    const auto y = normal_floats(x.size(), dim + 1), w = normal_floats(dim, dim + 2);
    DeviceArray<float> d_x(x), d_y(y), d_w(w), d_out(x.size());
    std::vector<float> want(x.size());
    kernels::ref_add_rmsnorm(x.data(), y.data(), w.data(), n_rows, dim, 1e-5f, want.data());
    ASSERT_EQ(kernels::launch_add_rmsnorm(d_x.get(), d_y.get(), d_w.get(), n_rows, dim, 1e-5f, d_out.get(), nullptr), 0);
    EXPECT_EQ(d_x.to_host(), x) << "the residual sum, dim " << dim;
    EXPECT_TRUE(all_near(d_out.to_host(), want, 1e-5f, 1e-6f)) << "dim " << dim;
  }
}

TEST(GpuParity, AddRmsNormTwinIsAddThenRmsNorm) {
  // The twin itself, so the fused kernel is checked against the two ops the forward pass runs.
  HELIOS_REQUIRE_GPU();
  const int32_t n_rows = 3, dim = 100;
  auto x = normal_floats(n_rows * dim, 7);
  const auto y = normal_floats(n_rows * dim, 8), w = normal_floats(dim, 9);
  auto x2 = x;
  std::vector<float> fused(x.size()), plain(x.size());
  kernels::ref_add_rmsnorm(x.data(), y.data(), w.data(), n_rows, dim, 1e-6f, fused.data());
  kernels::ref_add(x2.data(), y.data(), n_rows * dim);
  kernels::ref_rmsnorm(x2.data(), w.data(), n_rows, dim, 1e-6f, plain.data());
  EXPECT_EQ(x, x2);
  EXPECT_EQ(fused, plain);
}

}  // namespace
}  // namespace helios
