// 16-bit weights: launch_matmul_f16 / launch_matmul_bf16 against ref_matmul_f16 / ref_matmul_bf16,
// their products of several matrices in one launch against a launch each, launch_f32_to_f16 /
// launch_f32_to_bf16 against their twins.
// Tolerance for the product: 1e-5 · Σ|w·x| per output (float sums of n_in products in another
// order: about sqrt(n_in) · 2^-24 relative to that sum). The conversion is exact.
#include <cmath>
#include <memory>

#include "gpu/gpu_test_util.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

using gpu_test::DeviceArray;
using gpu_test::normal_floats;

using Convert = void (*)(const float*, int64_t, uint16_t*);
using RefMatmul = void (*)(const float*, const uint16_t*, int32_t, int32_t, int32_t, float*);
using LaunchMatmul = int (*)(const float*, const uint16_t*, int32_t, int32_t, int32_t, float*, void*);

std::vector<uint16_t> convert(Convert f, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  f(v.data(), static_cast<int64_t>(v.size()), h.data());
  return h;
}

void expect_matmul_matches(const char* type, Convert to_16, RefMatmul ref, LaunchMatmul launch) {
  struct Case { int32_t n_rows, n_in, n_out; };
  // 8-wide loads (n_in % 8 == 0) and the scalar path; 1-13 rows (one launch of 8, one of 5);
  // n_in past one staged stretch of activations (8192 / 2560 / 1024 columns at 1 / 3 / 8 rows).
  for (const Case c : {Case{1, 4096, 333}, Case{3, 576, 1536}, Case{7, 2816, 77}, Case{8, 1024, 64},
                       Case{13, 256, 100}, Case{2, 100, 50}, Case{1, 9000, 40}, Case{3, 5000, 9}}) {
    const auto w = convert(to_16, normal_floats(static_cast<size_t>(c.n_out) * c.n_in, c.n_in, 0.05f));
    const auto x = normal_floats(static_cast<size_t>(c.n_rows) * c.n_in, c.n_in + 1);
    std::vector<float> want(static_cast<size_t>(c.n_rows) * c.n_out);
    ref(x.data(), w.data(), c.n_rows, c.n_in, c.n_out, want.data());
    // bound = |W|·|x|, the scale of each output's rounding error
    std::vector<float> xa(x.size());
    std::vector<uint16_t> wa(w.size());
    for (size_t i = 0; i < w.size(); ++i) wa[i] = w[i] & 0x7FFF;  // |w| in either type: clear the sign
    for (size_t i = 0; i < x.size(); ++i) xa[i] = std::fabs(x[i]);
    std::vector<float> bound(want.size());
    ref(xa.data(), wa.data(), c.n_rows, c.n_in, c.n_out, bound.data());

    DeviceArray<uint16_t> d_w(w);
    DeviceArray<float> d_x(x), d_y(want.size());
    ASSERT_EQ(launch(d_x.get(), d_w.get(), c.n_rows, c.n_in, c.n_out, d_y.get(), nullptr), 0);
    const auto got = d_y.to_host();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f * bound[i] + 1e-7f)
          << type << " rows " << c.n_rows << " n_in " << c.n_in << " n_out " << c.n_out << " element " << i;
    }
  }
}

TEST(GpuParity, MatmulF16MatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  expect_matmul_matches("f16", kernels::ref_f32_to_f16, kernels::ref_matmul_f16, kernels::launch_matmul_f16);
}

TEST(GpuParity, MatmulBf16MatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  expect_matmul_matches("bf16", kernels::ref_f32_to_bf16, kernels::ref_matmul_bf16, kernels::launch_matmul_bf16);
}

// Matrices of one type in one launch (Q with GQA's narrow K and V, a matrix of no rows, biases):
// each the bits of a launch of its own, at 1 to 8 rows and past 8, with 16-byte loads and, one
// matrix placed 2 bytes off, without.
using LaunchProducts = int (*)(const float*, int32_t, int32_t, const kernels::GemvProducts&, void*);
void expect_products_match(const char* type, Convert to_16, LaunchMatmul launch, LaunchProducts launch_products) {
  const int32_t n_in = 512;
  const int32_t n_outs[] = {200, 24, 0, 25};
  DeviceArray<float> d_bias(normal_floats(200, 31));
  for (const size_t offset : {size_t{0}, size_t{1}}) {  // in 16-bit values
    for (const int32_t n_rows : {1, 5, 11}) {
      SCOPED_TRACE(std::string(type) + ", " + std::to_string(n_rows) + " rows, offset " + std::to_string(offset));
      DeviceArray<float> d_x(normal_floats(static_cast<size_t>(n_rows) * n_in, 37));
      std::vector<std::unique_ptr<DeviceArray<uint16_t>>> d_w;
      std::vector<std::unique_ptr<DeviceArray<float>>> d_together, d_alone;
      kernels::GemvProducts products;
      for (int k = 0; k < 4; ++k) {
        const size_t shift = k == 3 ? offset : 0;
        auto w = convert(to_16, normal_floats(shift + static_cast<size_t>(std::max(n_outs[k], 1)) * n_in, 41 + k, 0.05f));
        d_w.push_back(std::make_unique<DeviceArray<uint16_t>>(w));
        const size_t n_y = static_cast<size_t>(n_rows) * std::max(n_outs[k], 1);
        d_together.push_back(std::make_unique<DeviceArray<float>>(std::vector<float>(n_y, -1.0f)));
        d_alone.push_back(std::make_unique<DeviceArray<float>>(std::vector<float>(n_y, -1.0f)));
        const uint16_t* wk = d_w.back()->get() + shift;
        const float* bk = k == 0 || k == 3 ? d_bias.get() : nullptr;
        products.at[k] = {wk, n_outs[k], d_together.back()->get(), bk};
        ASSERT_EQ(launch(d_x.get(), wk, n_rows, n_in, n_outs[k], d_alone.back()->get(), nullptr), 0);
        if (bk && n_outs[k] > 0) {
          ASSERT_EQ(kernels::launch_add_rows(d_alone.back()->get(), bk, n_rows, n_outs[k], nullptr), 0);
        }
      }
      products.n = 4;
      ASSERT_EQ(launch_products(d_x.get(), n_rows, n_in, products, nullptr), 0);
      for (int k = 0; k < 4; ++k) {
        const auto got = d_together[k]->to_host();
        if (offset == 0 || k == 3) {  // an unaligned matrix takes every matrix of the launch off 16-byte loads
          EXPECT_EQ(got, d_alone[k]->to_host()) << "matrix " << k;
        }
        if (n_outs[k] > 0) {
          EXPECT_NE(got[0], -1.0f) << "matrix " << k << " was not written";
        }
      }
      EXPECT_EQ(d_together[2]->to_host(), std::vector<float>(n_rows, -1.0f)) << "the matrix of no rows was written";
    }
  }
}

TEST(GpuParity, MatmulF16ProductsInOneLaunchAreEachTheirOwn) {
  HELIOS_REQUIRE_GPU();
  expect_products_match("f16", kernels::ref_f32_to_f16, kernels::launch_matmul_f16, kernels::launch_matmul_f16_products);
}

TEST(GpuParity, MatmulBf16ProductsInOneLaunchAreEachTheirOwn) {
  HELIOS_REQUIRE_GPU();
  expect_products_match("bf16", kernels::ref_f32_to_bf16, kernels::launch_matmul_bf16,
                        kernels::launch_matmul_bf16_products);
}

TEST(GpuParity, F32ToBf16RoundsAsTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  auto x = normal_floats(10000, 12, 100.0f);
  // Ties to even, the largest finite values, infinities, NaNs (kept quiet), subnormals, signed zero.
  for (float v : {0.0f, -0.0f, 1.00390625f, 1.01171875f, 3.3895314e38f, 3.4028235e38f, -3.4028235e38f,
                  INFINITY, -INFINITY, NAN, 1e-40f, -1e-45f})
    x.push_back(v);
  const auto want = convert(kernels::ref_f32_to_bf16, x);
  DeviceArray<float> d_x(x);
  DeviceArray<uint16_t> d_h(x.size());
  ASSERT_EQ(kernels::launch_f32_to_bf16(d_x.get(), static_cast<int64_t>(x.size()), d_h.get(), nullptr), 0);
  EXPECT_EQ(d_h.to_host(), want);
}

TEST(GpuParity, F32ToF16RoundsAsTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  auto x = normal_floats(10000, 11, 100.0f);
  // Edge cases: ties, subnormals, overflow, signed zero, infinities and NaNs of both signs.
  for (float v : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 5.96e-8f, 2.98e-8f, 6.1e-5f, 1.00048828125f, INFINITY,
                  -INFINITY, NAN, -NAN})
    x.push_back(v);
  const auto want = convert(kernels::ref_f32_to_f16, x);
  DeviceArray<float> d_x(x);
  DeviceArray<uint16_t> d_h(x.size());
  ASSERT_EQ(kernels::launch_f32_to_f16(d_x.get(), static_cast<int64_t>(x.size()), d_h.get(), nullptr), 0);
  EXPECT_EQ(d_h.to_host(), want);
}

}  // namespace
}  // namespace helios
