// CPU backend memory: a size whose bytes cannot be addressed is refused, not wrapped around.
#include <gtest/gtest.h>

#include <cstdint>

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

}  // namespace
}  // namespace helios
