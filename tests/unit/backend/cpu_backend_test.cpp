// CPU backend memory: a size whose bytes cannot be addressed is refused, not wrapped around; host
// buffers for swap copies hold what the copies put there. The default matmuls: one product and one
// bias per output.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "helios/backend.h"

namespace helios {
namespace {

TEST(CpuBackend, AllocationsTooLargeToAddressAreRefused) {
  auto cpu = make_cpu_backend(1);
  EXPECT_EQ(cpu->alloc(SIZE_MAX / 2), nullptr);
  EXPECT_EQ(cpu->alloc(SIZE_MAX), nullptr);
  EXPECT_EQ(cpu->alloc(SIZE_MAX / sizeof(float) + 2), nullptr);  // 4 bytes once wrapped around
  Buffer b(cpu.get(), SIZE_MAX / 2);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.size(), 0u);
  Buffer small(cpu.get(), 0);  // a unique, usable pointer even for nothing
  EXPECT_FALSE(small.empty());
}

TEST(CpuBackend, HostBuffersCarryCopiesBothWays) {
  auto cpu = make_cpu_backend(1);
  Buffer device(cpu.get(), 64);
  std::vector<float> values(64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i) - 3.0f;
  cpu->upload(device.data(), values.data(), values.size());
  HostBuffer host(cpu.get(), 64);
  ASSERT_FALSE(host.empty());
  EXPECT_EQ(host.size(), 64u);
  cpu->copy_to_host(host.get(), device.data(), 64);
  cpu->copy_wait();
  EXPECT_EQ(std::vector<float>(host.get(), host.get() + 64), values);
  for (size_t i = 0; i < 64; ++i) host.get()[i] = -values[i];
  cpu->copy_from_host(device.data(), host.get(), 64);
  cpu->copy_wait();
  std::vector<float> back(64);
  cpu->download(back.data(), device.data(), 64);
  EXPECT_EQ(back[5], -values[5]);
  EXPECT_EQ(back[63], -values[63]);

  HostBuffer moved = std::move(host);
  EXPECT_TRUE(host.empty());
  EXPECT_EQ(moved.size(), 64u);
  EXPECT_TRUE(HostBuffer(cpu.get(), SIZE_MAX / 2).empty());
  EXPECT_TRUE(HostBuffer(cpu.get(), 0).empty());
}

// Three outputs of one input, as Q, K and V with Qwen2's biases: each the product of its own rows,
// its bias (where it has one) on every row, an output of no rows untouched.
TEST(CpuBackend, MatmulsAddEachOutputsBiasToEveryRow) {
  auto cpu = make_cpu_backend(1);
  const int32_t n_in = 64, n_out = 6, n_rows = 3;
  std::vector<float> x(n_rows * n_in), w(n_out * n_in), bias(n_out);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.02f * static_cast<float>(i % 13) - 0.1f;
  for (int32_t o = 0; o < n_out; ++o) bias[o] = 10.0f * static_cast<float>(o + 1);
  const WeightMatrix m{w.data(), TensorType::kF32, n_out, n_in};
  std::vector<float> plain(n_rows * n_out), biased(n_rows * n_out), two_rows(n_rows * n_out, -1.0f),
      untouched(n_rows * n_out, -1.0f);
  cpu->matmuls(x.data(), {{&m, n_rows, plain.data()},
                          {&m, n_rows, biased.data(), bias.data()},
                          {&m, 2, two_rows.data(), bias.data()},
                          {&m, 0, untouched.data(), bias.data()}});
  for (int32_t r = 0; r < n_rows; ++r) {
    for (int32_t o = 0; o < n_out; ++o) {
      const size_t i = static_cast<size_t>(r) * n_out + o;
      EXPECT_EQ(biased[i], plain[i] + bias[o]) << "row " << r << ", output " << o;
      EXPECT_EQ(two_rows[i], r < 2 ? plain[i] + bias[o] : -1.0f) << "row " << r << ", output " << o;
    }
  }
  EXPECT_EQ(untouched, std::vector<float>(n_rows * n_out, -1.0f));
  EXPECT_NE(plain[0], 0.0f);
}

}  // namespace
}  // namespace helios
