// RoPE (interleaved and half-split pairs, partial rotation, Llama 3's divisors, linear and YaRN
// scaling) against ref_rope.
// Tolerance: 2e-6 relative + 2e-6 absolute on values of about 1: the angles are bit-identical;
// sincosf and the host's sin/cos differ by at most 2 ulp, and fused multiply-adds by 1.
// RoPE fused with the K/V cache write: the same bits as rope, rope and kv_write launched in turn.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
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

// Q of n_q tokens and K/V of n_kv (more: the rows of tokens that exited early, whose K/V still
// fill the cache; fewer or none: the kernel takes any counts), GQA, partial rotation, YaRN with
// divisors; f32, f16 and fp8 caches whose untouched slots hold NaN bytes.
TEST(GpuParity, RopeKvWriteIsRopeThenKvWrite) {
  HELIOS_REQUIRE_GPU();
  struct Shape {
    int32_t n_heads, n_kv_heads, head_dim, n_rot;
    bool interleaved;
  };
  const Shape shapes[] = {{9, 3, 64, 64, false}, {32, 8, 128, 128, true}, {8, 2, 128, 64, false}};
  const std::pair<int32_t, int32_t> counts[] = {{6, 9}, {9, 9}, {0, 4}, {5, 0}};
  const int32_t n_slots = 64;
  for (const Shape& sh : shapes) {
    for (const auto& [n_q, n_kv] : counts) {
      for (const kernels::KvType type : {kernels::KvType::kF32, kernels::KvType::kF16, kernels::KvType::kFp8E4M3}) {
        const int64_t q_row = static_cast<int64_t>(sh.n_heads) * sh.head_dim;
        const int64_t kv_row = static_cast<int64_t>(sh.n_kv_heads) * sh.head_dim;
        std::vector<int32_t> q_pos(std::max(n_q, 1)), kv_pos(std::max(n_kv, 1)), slots(std::max(n_kv, 1));
        std::mt19937 rng(static_cast<uint32_t>(sh.head_dim * 131 + n_q * 7 + n_kv));
        for (auto& p : q_pos) p = static_cast<int32_t>(rng() % 9000);
        for (auto& p : kv_pos) p = static_cast<int32_t>(rng() % 9000);
        for (int32_t i = 0; i < n_kv; ++i) slots[i] = (i * 37 + 5) % n_slots;  // distinct, scattered
        std::vector<float> factors(sh.n_rot / 2);
        for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + 0.5f * static_cast<float>(i % 5);
        DeviceArray<float> d_factors(factors);
        kernels::RopeParams rope;
        rope.n_rot = sh.n_rot;
        rope.freq_base = 500000.0f;
        rope.interleaved = sh.interleaved;
        rope.freq_scale = 0.25f;
        rope.ext_factor = 1.0f;
        kernels::yarn_correction_range(4096, 32.0f, 1.0f, rope);
        rope.mscale = 1.1f;
        rope.freq_factors = d_factors.get();

        const auto q = normal_floats(std::max<int64_t>(n_q, 1) * q_row, 1);
        const auto k = normal_floats(std::max<int64_t>(n_kv, 1) * kv_row, 2);
        const auto v = normal_floats(std::max<int64_t>(n_kv, 1) * kv_row, 3);
        const int32_t per_float = 4 / kernels::kv_type_bytes(type);
        const size_t cache_floats = static_cast<size_t>(n_slots * kv_row / per_float);
        uint32_t nan_bits = 0x7FC00000u;
        if (type != kernels::KvType::kF32) nan_bits = type == kernels::KvType::kF16 ? 0x7E007E00u : 0x7F7F7F7Fu;
        float pad;
        std::memcpy(&pad, &nan_bits, sizeof pad);
        const std::vector<float> empty_cache(cache_floats, pad);
        DeviceArray<int32_t> d_q_pos(q_pos), d_kv_pos(kv_pos), d_slots(slots);

        // One launch, then the three it replaces, each on its own copies.
        DeviceArray<float> fq(q), fk(k), fv(v), fkc(empty_cache), fvc(empty_cache);
        DeviceArray<float> uq(q), uk(k), uv(v), ukc(empty_cache), uvc(empty_cache);
        const kernels::PagedKV fused_cache{fkc.get(), fvc.get(), n_slots / 16, 16, sh.n_kv_heads, sh.head_dim, type};
        const kernels::PagedKV cache{ukc.get(), uvc.get(), n_slots / 16, 16, sh.n_kv_heads, sh.head_dim, type};
        ASSERT_EQ(kernels::launch_rope_kv_write(fq.get(), d_q_pos.get(), n_q, sh.n_heads, fk.get(), fv.get(),
                                                d_kv_pos.get(), d_slots.get(), n_kv, rope, fused_cache, nullptr),
                  0);
        ASSERT_EQ(kernels::launch_rope(uq.get(), d_q_pos.get(), n_q, sh.n_heads, sh.head_dim, rope, nullptr), 0);
        ASSERT_EQ(kernels::launch_rope(uk.get(), d_kv_pos.get(), n_kv, sh.n_kv_heads, sh.head_dim, rope, nullptr), 0);
        ASSERT_EQ(kernels::launch_kv_write(uk.get(), uv.get(), d_slots.get(), n_kv, cache, nullptr), 0);

        const std::string what = "heads " + std::to_string(sh.n_heads) + "/" + std::to_string(sh.n_kv_heads) +
                                 " dim " + std::to_string(sh.head_dim) + " n_rot " + std::to_string(sh.n_rot) +
                                 ", " + std::to_string(n_q) + " q and " + std::to_string(n_kv) + " k rows, " +
                                 kernels::kv_type_name(type) + " cache";
        auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
          return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        EXPECT_TRUE(same_bits(fq.to_host(), uq.to_host())) << "Q, " << what;
        EXPECT_TRUE(same_bits(fk.to_host(), uk.to_host())) << "K, " << what;
        EXPECT_TRUE(same_bits(fkc.to_host(), ukc.to_host())) << "cached K, " << what;
        EXPECT_TRUE(same_bits(fvc.to_host(), uvc.to_host())) << "cached V, " << what;
        if (n_kv > 0) {
          EXPECT_FALSE(same_bits(fkc.to_host(), empty_cache)) << "nothing cached, " << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace helios
