// RoPE (interleaved and half-split pairs, partial rotation, Llama 3's divisors, linear and YaRN
// scaling) against ref_rope.
// Tolerance: 2e-6 relative + 2e-6 absolute on values of about 1: the angles are bit-identical;
// sincosf and the host's sin/cos differ by at most 2 ulp, and fused multiply-adds by 1.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

using gpu_test::all_near;
using gpu_test::DeviceArray;
using gpu_test::normal_floats;

struct RopeCase {
  int32_t n_heads, head_dim, n_rot;
  float base;
  bool interleaved;
};

TEST(GpuParity, RopeMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  const std::vector<RopeCase> cases = {
      {8, 8, 8, 10000.0f, true},        // stories260K
      {9, 64, 64, 100000.0f, false},    // SmolLM2
      {32, 128, 128, 10000.0f, true},   // Llama-2-7B
      {8, 128, 64, 500000.0f, false},   // partial rotation
  };
  const std::vector<int32_t> positions = {0, 1, 2, 15, 16, 255, 1000, 4095, 8191};
  const int32_t n = static_cast<int32_t>(positions.size());
  for (const auto& c : cases) {
    auto x = normal_floats(static_cast<size_t>(n) * c.n_heads * c.head_dim, c.head_dim);
    DeviceArray<int32_t> d_pos(positions);
    // Without and with per-pair frequency divisors (Llama 3's: 1 for high frequencies, up to 8).
    std::vector<float> factors(c.n_rot / 2);
    for (int32_t i = 0; i < c.n_rot / 2; ++i) factors[i] = 1.0f + 7.0f * i / std::max(1, c.n_rot / 2 - 1);
    DeviceArray<float> d_factors(factors);
    // Scaled: linear (every angle times 1/4) and YaRN by 4 (its correction range for a 4096-token
    // original context, and its temperature), alone and after the divisors.
    kernels::RopeParams plain;
    plain.n_rot = c.n_rot;
    plain.freq_base = c.base;
    plain.interleaved = c.interleaved;
    kernels::RopeParams linear = plain;
    linear.freq_scale = 0.25f;
    kernels::RopeParams yarn = linear;
    yarn.ext_factor = 1.0f;
    kernels::yarn_correction_range(4096, 32.0f, 1.0f, yarn);
    yarn.mscale = 1.0f + 0.1f * std::log(4.0f);
    const std::pair<const char*, kernels::RopeParams> scalings[] = {
        {"unscaled", plain}, {"linear", linear}, {"yarn", yarn}};
    for (const bool divided : {false, true}) {
      for (const auto& [name, params] : scalings) {
        kernels::RopeParams host = params, device = params;
        host.freq_factors = divided ? factors.data() : nullptr;
        device.freq_factors = divided ? d_factors.get() : nullptr;
        auto xc = x;
        DeviceArray<float> d_x(xc);
        ASSERT_EQ(kernels::launch_rope(d_x.get(), d_pos.get(), n, c.n_heads, c.head_dim, device, nullptr), 0);
        kernels::ref_rope(xc.data(), positions.data(), n, c.n_heads, c.head_dim, host);
        EXPECT_TRUE(all_near(d_x.to_host(), xc, 2e-6f, 2e-6f))
            << "heads " << c.n_heads << " head_dim " << c.head_dim << " n_rot " << c.n_rot
            << (c.interleaved ? " interleaved" : " half-split") << (divided ? ", frequency factors" : "") << ", "
            << name;
      }
    }
  }
}

}  // namespace
}  // namespace helios
