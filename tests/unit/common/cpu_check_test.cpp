#include "common/cpu_check.h"

#include <gtest/gtest.h>

namespace helios {
namespace {

// The tests run on the machine that built them, so nothing the build was compiled for is missing
// (a cross-built test binary would say which feature is).
TEST(CpuCheck, TheBuildMachineHasEveryFeatureTheBuildUses) {
  EXPECT_EQ(missing_cpu_features(), "");
  EXPECT_TRUE(check_cpu_features("cpu_check_test"));
}

}  // namespace
}  // namespace helios
