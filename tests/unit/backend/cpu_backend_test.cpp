// CPU backend memory: a size whose bytes cannot be addressed is refused, not wrapped around; host
// buffers for swap copies hold what the copies put there.
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

}  // namespace
}  // namespace helios
