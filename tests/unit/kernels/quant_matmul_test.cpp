// Quantized matmul against the same product computed in double from the dequantized weights and
// the dequantized 8-bit activations: they may differ only by float rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "helios/tensor_type.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

struct Case {
  TensorType weight;
  TensorType activation;  // the 8-bit format the activations are rounded to
};

class QuantMatmul : public ::testing::TestWithParam<Case> {};

TEST_P(QuantMatmul, EqualsTheDequantizedProduct) {
  const Case c = GetParam();
  const int32_t n_in = 96, n_out = 7, n_rows = 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(n_out * n_in), x(n_rows * n_in);
  for (auto& v : w) v = normal(rng);
  for (auto& v : x) v = normal(rng) * 3.0f;
  x[5] = 40.0f;  // an outlier, as real hidden states have

  const int64_t w_row = tensor_row_bytes(c.weight, n_in);
  std::vector<uint8_t> wq(n_out * w_row);
  for (int o = 0; o < n_out; ++o) ASSERT_TRUE(quantize_row(c.weight, &w[o * n_in], &wq[o * w_row], n_in).ok());
  const auto type = static_cast<uint32_t>(c.weight);
  const int64_t x_row = kernels::ref_activation_row_bytes(type, n_in);
  std::vector<uint8_t> xq(n_rows * x_row);
  kernels::ref_quantize_activations(type, x.data(), n_rows, n_in, xq.data());
  std::vector<float> y(n_rows * n_out, NAN);
  kernels::ref_matmul_quantized(type, wq.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, y.data());

  for (int r = 0; r < n_rows; ++r) {
    // Q8_1 is laid out as Q8_0 with one more fp16 (the block sum) after the scale.
    std::vector<float> xd(n_in);
    const uint8_t* row = xq.data() + r * x_row;
    const int block_bytes = c.activation == TensorType::kQ8_1 ? 36 : 34;
    for (int b = 0; b < n_in / 32; ++b) {
      uint16_t d;
      std::memcpy(&d, row + b * block_bytes, 2);
      const auto* qs = reinterpret_cast<const int8_t*>(row + b * block_bytes + block_bytes - 32);
      for (int j = 0; j < 32; ++j) xd[b * 32 + j] = fp16_to_fp32(d) * qs[j];
      // The rounded activations are close to the originals (half a step of amax/127).
      for (int j = 0; j < 32; ++j) {
        float amax = 0;
        for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[r * n_in + b * 32 + k]));
        EXPECT_NEAR(xd[b * 32 + j], x[r * n_in + b * 32 + j], amax / 127 * 0.51f + 1e-3f * amax);
      }
    }
    for (int o = 0; o < n_out; ++o) {
      std::vector<float> wd(n_in);
      ASSERT_TRUE(dequantize_row(c.weight, &wq[o * w_row], wd.data(), n_in).ok());
      double expected = 0, magnitude = 0;
      for (int i = 0; i < n_in; ++i) {
        expected += static_cast<double>(wd[i]) * xd[i];
        magnitude += std::fabs(static_cast<double>(wd[i]) * xd[i]);
      }
      if (c.weight == TensorType::kQ4_1) {
        // Q4_1's minimum multiplies the activation block sum as stored: s = fp16(d·Σq).
        for (int b = 0; b < n_in / 32; ++b) {
          uint16_t m, s;
          std::memcpy(&m, &wq[o * w_row + b * 20 + 2], 2);
          std::memcpy(&s, row + b * 36 + 2, 2);
          double block_sum = 0;
          for (int j = 0; j < 32; ++j) block_sum += xd[b * 32 + j];
          expected += fp16_to_fp32(m) * (fp16_to_fp32(s) - block_sum);
        }
      }
      EXPECT_NEAR(y[r * n_out + o], expected, 1e-5 * magnitude + 1e-3)
          << tensor_type_name(c.weight) << " row " << r << " out " << o;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantMatmul,
                         ::testing::Values(Case{TensorType::kQ8_0, TensorType::kQ8_0},
                                           Case{TensorType::kQ4_0, TensorType::kQ8_0},
                                           Case{TensorType::kQ4_1, TensorType::kQ8_1}),
                         [](const auto& info) { return std::string(tensor_type_name(info.param.weight)); });

}  // namespace
}  // namespace helios
