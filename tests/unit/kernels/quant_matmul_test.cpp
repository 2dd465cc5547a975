// Quantized matmul against the same product computed in double from the dequantized weights and
// the dequantized 8-bit activations: they may differ only by float rounding. And for every type:
// the vector code this build runs gives the scalar reference's bits, and a row's result does not
// depend on how many rows are multiplied with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "helios/tensor_type.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

struct Case {
  TensorType weight;
  TensorType activation;  // the 8-bit format the activations are rounded to
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return tensor_type_name(info.param.weight); }

const auto kCases = ::testing::Values(
    Case{TensorType::kQ8_0, TensorType::kQ8_0}, Case{TensorType::kQ4_0, TensorType::kQ8_0},
    Case{TensorType::kQ4_1, TensorType::kQ8_1}, Case{TensorType::kQ5_0, TensorType::kQ8_0},
    Case{TensorType::kQ5_1, TensorType::kQ8_1}, Case{TensorType::kQ4_K, TensorType::kQ8_K},
    Case{TensorType::kQ5_K, TensorType::kQ8_K}, Case{TensorType::kQ6_K, TensorType::kQ8_K});

// The activation row r dequantized: Q8_0 and Q8_1 blocks hold an fp16 scale (and Q8_1 an fp16
// block sum) before 32 values; Q8_K holds a float scale, 256 values and 16 int16 sums.
std::vector<float> dequantized_activations(TensorType act, const uint8_t* row, int n_in) {
  std::vector<float> xd(n_in);
  if (act == TensorType::kQ8_K) {
    for (int b = 0; b < n_in / 256; ++b) {
      const uint8_t* blk = row + b * 292;
      float d;
      std::memcpy(&d, blk, 4);
      const auto* qs = reinterpret_cast<const int8_t*>(blk + 4);
      for (int j = 0; j < 256; ++j) xd[b * 256 + j] = d * qs[j];
      for (int g = 0; g < 16; ++g) {  // the 16-value sums are the values' sums
        int16_t bsum;
        std::memcpy(&bsum, blk + 260 + 2 * g, 2);
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += qs[16 * g + j];
        EXPECT_EQ(bsum, sum);
      }
    }
    return xd;
  }
  const int block_bytes = act == TensorType::kQ8_1 ? 36 : 34;
  for (int b = 0; b < n_in / 32; ++b) {
    uint16_t d;
    std::memcpy(&d, row + b * block_bytes, 2);
    const auto* qs = reinterpret_cast<const int8_t*>(row + b * block_bytes + block_bytes - 32);
    for (int j = 0; j < 32; ++j) xd[b * 32 + j] = fp16_to_fp32(d) * qs[j];
  }
  return xd;
}

class QuantMatmul : public ::testing::TestWithParam<Case> {};

TEST_P(QuantMatmul, EqualsTheDequantizedProduct) {
  const Case c = GetParam();
  const bool k_quant = c.activation == TensorType::kQ8_K;
  const int32_t n_in = k_quant ? 512 : 96, n_out = 7, n_rows = 3;
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

  const int block = k_quant ? 256 : 32;
  for (int r = 0; r < n_rows; ++r) {
    const uint8_t* row = xq.data() + r * x_row;
    const std::vector<float> xd = dequantized_activations(c.activation, row, n_in);
    // The rounded activations are close to the originals (half a step of amax/127).
    for (int b = 0; b < n_in / block; ++b) {
      float amax = 0;
      for (int k = 0; k < block; ++k) amax = std::max(amax, std::fabs(x[r * n_in + b * block + k]));
      for (int j = b * block; j < (b + 1) * block; ++j) {
        EXPECT_NEAR(xd[j], x[r * n_in + j], amax / 127 * 0.51f + 1e-3f * amax) << j;
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
      if (c.activation == TensorType::kQ8_1) {
        // The minimum of Q4_1/Q5_1 multiplies the activation block sum as stored: s = fp16(d·Σq).
        const int w_block = static_cast<int>(tensor_row_bytes(c.weight, 32));
        for (int b = 0; b < n_in / 32; ++b) {
          uint16_t m, s;
          std::memcpy(&m, &wq[o * w_row + b * w_block + 2], 2);
          std::memcpy(&s, row + b * 36 + 2, 2);
          double block_sum = 0;
          for (int j = 0; j < 32; ++j) block_sum += xd[b * 32 + j];
          expected += fp16_to_fp32(m) * (fp16_to_fp32(s) - block_sum);
        }
      }
      // K-quants take their minimums through the exact integer sums (bsums): no such term.
      EXPECT_NEAR(y[r * n_out + o], expected, 1e-5 * magnitude + 1e-3)
          << tensor_type_name(c.weight) << " row " << r << " out " << o;
    }
  }
}

// Random weight blocks: any bits, with every fp16 scale set to a sane value (as real files have),
// so that every code path (all 4-, 5- and 6-bit values, signed Q6_K scales, both halves of the
// packed scales) is exercised.
std::vector<uint8_t> random_weights(TensorType type, int n_out, int n_in, std::mt19937& rng) {
  const int64_t row = tensor_row_bytes(type, n_in);
  std::vector<uint8_t> w(static_cast<size_t>(row * n_out));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const auto traits = *tensor_type_traits(static_cast<uint32_t>(type));
  std::vector<int> scale_offsets;
  switch (type) {
    case TensorType::kQ4_1: case TensorType::kQ5_1: case TensorType::kQ4_K: case TensorType::kQ5_K:
      scale_offsets = {0, 2}; break;
    case TensorType::kQ6_K: scale_offsets = {208}; break;
    default: scale_offsets = {0}; break;
  }
  std::uniform_real_distribution<float> mag(-6.0f, -1.5f);
  for (size_t b = 0; b < w.size(); b += traits.block_bytes) {
    for (int off : scale_offsets) {
      const uint16_t h = fp32_to_fp16((rng() % 2 ? 1.0f : -1.0f) * std::exp(mag(rng)));
      std::memcpy(&w[b + off], &h, 2);
    }
  }
  return w;
}

// The vector code's y for n_rows × n_out against the scalar reference, bit for bit; then each
// row alone and rows 1..n in one call against the whole batch.
void expect_vector_gives_scalar_bits(const Case& c, int32_t n_in, int32_t n_out, int32_t n_rows) {
  SCOPED_TRACE(testing::Message() << n_rows << " rows x " << n_in << " in x " << n_out << " out");
  const auto type = static_cast<uint32_t>(c.weight);
  std::mt19937 rng(17);
  const std::vector<uint8_t> wq = random_weights(c.weight, n_out, n_in, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n_rows * n_in);
  for (auto& v : x) v = normal(rng);
  for (int r = 0; r < n_rows; ++r) x[r * n_in + 7 * r] = 25.0f;  // outliers
  std::fill(x.begin() + 2 * n_in, x.begin() + 2 * n_in + 256, 0.0f);  // a zero block
  const int64_t x_row = kernels::ref_activation_row_bytes(type, n_in);
  std::vector<uint8_t> xq(n_rows * x_row);
  kernels::ref_quantize_activations(type, x.data(), n_rows, n_in, xq.data());

  std::vector<float> scalar(n_rows * n_out, NAN), vector(n_rows * n_out, NAN);
  kernels::ref_matmul_quantized_scalar(type, wq.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, scalar.data());
  // In two pieces of the output rows, as the thread pool splits them.
  kernels::ref_matmul_quantized(type, wq.data(), xq.data(), n_rows, n_in, n_out, 0, 6, vector.data());
  kernels::ref_matmul_quantized(type, wq.data(), xq.data(), n_rows, n_in, n_out, 6, n_out, vector.data());
  for (int i = 0; i < n_rows * n_out; ++i) {
    ASSERT_TRUE(std::isfinite(scalar[i])) << i;
    ASSERT_EQ(std::memcmp(&scalar[i], &vector[i], 4), 0)
        << tensor_type_name(c.weight) << " [" << i / n_out << ", " << i % n_out << "]: scalar " << scalar[i]
        << ", vector " << vector[i] << (kernels::ref_matmul_quantized_is_vector() ? "" : " (no vector code)");
  }
  // Each row alone, and rows 1..n in one call, give the same bits as the whole batch.
  for (int r = 0; r < n_rows; ++r) {
    std::vector<float> alone(n_out, NAN);
    kernels::ref_matmul_quantized(type, wq.data(), xq.data() + r * x_row, 1, n_in, n_out, 0, n_out, alone.data());
    EXPECT_EQ(std::memcmp(alone.data(), &vector[r * n_out], n_out * 4), 0) << "row " << r;
  }
  std::vector<float> tail((n_rows - 1) * n_out, NAN);
  kernels::ref_matmul_quantized(type, wq.data(), xq.data() + x_row, n_rows - 1, n_in, n_out, 0, n_out, tail.data());
  EXPECT_EQ(std::memcmp(tail.data(), &vector[n_out], tail.size() * 4), 0);
}

TEST_P(QuantMatmul, VectorCodeGivesTheScalarReferenceBitsForEveryBatchShape) {
  const Case c = GetParam();
  const bool k_quant = c.activation == TensorType::kQ8_K;
  // A few blocks, every tile edge (13 outputs, 9 rows).
  expect_vector_gives_scalar_bits(c, k_quant ? 768 : 160, 13, 9);
  // Whole groups of 8 blocks and a partial one, two chunks of activation rows, odd tile edges.
  expect_vector_gives_scalar_bits(c, k_quant ? 2816 : 4128, 27, 37);
}

// The activations' rounding by the vector code, byte for byte as the scalar code rounds them:
// normal values, outliers, a zero block, ties in magnitude of both signs (Q8_K keeps the first
// value of the largest magnitude), values that round at exactly .5, and tiny and huge scales.
TEST_P(QuantMatmul, VectorQuantizationGivesTheScalarBytes) {
  const Case c = GetParam();
  const auto type = static_cast<uint32_t>(c.weight);
  const int32_t n_in = 1024, n_rows = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n_rows * n_in);
  for (auto& v : x) v = normal(rng);
  std::fill(x.begin(), x.begin() + 256, 0.0f);                                 // row 0: a zero super-block
  x[n_in + 3] = -4.0f, x[n_in + 9] = 4.0f;                                     // row 1: a tie, negative first
  x[2 * n_in + 5] = 4.0f, x[2 * n_in + 40] = -4.0f;                            // row 2: a tie, positive first
  for (int j = 0; j < 256; ++j) x[3 * n_in + j] = (j % 17 - 8) * 0.5f;          // row 3: halves, .5 ties
  for (int j = 0; j < n_in; ++j) x[4 * n_in + j] *= 1e-30f, x[5 * n_in + j] *= 1e30f;  // rows 4, 5: scales
  const int64_t x_row = kernels::ref_activation_row_bytes(type, n_in);
  std::vector<uint8_t> scalar(n_rows * x_row, 0xAA), vector(n_rows * x_row, 0x55);
  kernels::ref_quantize_activations_scalar(type, x.data(), n_rows, n_in, scalar.data());
  kernels::ref_quantize_activations(type, x.data(), n_rows, n_in, vector.data());
  for (int r = 0; r < n_rows; ++r)
    EXPECT_EQ(std::memcmp(&scalar[r * x_row], &vector[r * x_row], x_row), 0) << tensor_type_name(c.weight) << ": row " << r;
}

// The tiled batch products (several weight rows × several activation rows per tile, the
// weights unpacked once for a whole batch) against one activation row at a time and against the
// scalar reference, bit for bit: for ragged batches, output sizes that leave every kind of edge
// tile, output ranges split off the tile grid, block counts that leave part of a group of 8, and
// rows enough to be taken in several chunks.
TEST_P(QuantMatmul, TiledBatchGivesTheOneRowBitsForRaggedShapes) {
  const Case c = GetParam();
  const auto type = static_cast<uint32_t>(c.weight);
  const int32_t block = kernels::ref_quantized_block_values(type);
  struct Shape {
    int32_t n_in, n_out;
    std::vector<int32_t> rows;
  };
  const std::vector<Shape> shapes = {
      {block * 13, 1, {1, 2, 3, 5, 7, 8, 13}},
      {block * 13, 7, {1, 2, 3, 5, 7, 8, 13}},
      {block * 3, 18, {1, 2, 3, 5, 7, 8, 13}},
      {block * (block == 32 ? 320 : 40), 5, {50}},  // activation rows in more than one chunk
  };
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape& sh : shapes) {
    const std::vector<uint8_t> wq = random_weights(c.weight, sh.n_out, sh.n_in, rng);
    const int64_t x_row = kernels::ref_activation_row_bytes(type, sh.n_in);
    for (int32_t n_rows : sh.rows) {
      std::vector<float> x(static_cast<size_t>(n_rows) * sh.n_in);
      for (auto& v : x) v = normal(rng);
      std::vector<uint8_t> xq(n_rows * x_row);
      kernels::ref_quantize_activations(type, x.data(), n_rows, sh.n_in, xq.data());
      const size_t n_y = static_cast<size_t>(n_rows) * sh.n_out;
      std::vector<float> batch(n_y, NAN), split(n_y, NAN), one(n_y, NAN), scalar(n_y, NAN);
      kernels::ref_matmul_quantized(type, wq.data(), xq.data(), n_rows, sh.n_in, sh.n_out, 0, sh.n_out, batch.data());
      const int32_t cut = sh.n_out / 2 | 1;  // an odd first range, off the grid of weight tiles
      kernels::ref_matmul_quantized(type, wq.data(), xq.data(), n_rows, sh.n_in, sh.n_out, 0, std::min(cut, sh.n_out), split.data());
      kernels::ref_matmul_quantized(type, wq.data(), xq.data(), n_rows, sh.n_in, sh.n_out, std::min(cut, sh.n_out), sh.n_out, split.data());
      for (int32_t r = 0; r < n_rows; ++r) {
        kernels::ref_matmul_quantized(type, wq.data(), xq.data() + r * x_row, 1, sh.n_in, sh.n_out, 0, sh.n_out, &one[r * sh.n_out]);
      }
      kernels::ref_matmul_quantized_scalar(type, wq.data(), xq.data(), n_rows, sh.n_in, sh.n_out, 0, sh.n_out, scalar.data());
      const std::string where = std::string(tensor_type_name(c.weight)) + " n_in " + std::to_string(sh.n_in) +
                                " n_out " + std::to_string(sh.n_out) + " rows " + std::to_string(n_rows);
      for (size_t i = 0; i < n_y; ++i) ASSERT_TRUE(std::isfinite(batch[i])) << where << " [" << i << "]";
      EXPECT_EQ(std::memcmp(batch.data(), one.data(), n_y * 4), 0) << where << ": batch vs one row at a time";
      EXPECT_EQ(std::memcmp(batch.data(), split.data(), n_y * 4), 0) << where << ": whole vs split output range";
      // The scalar twin's tolerance is none: the vector code gives its bits.
      EXPECT_EQ(std::memcmp(batch.data(), scalar.data(), n_y * 4), 0) << where << ": vector vs scalar";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantMatmul, kCases, case_name);

TEST(QuantMatmul, TypesAndBlockSizes) {
  for (TensorType t : {TensorType::kQ8_0, TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0,
                       TensorType::kQ5_1, TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    const auto id = static_cast<uint32_t>(t);
    EXPECT_TRUE(kernels::ref_quantized_weight_type(id)) << tensor_type_name(t);
    EXPECT_EQ(kernels::ref_quantized_block_values(id), tensor_type_traits(id)->block_elems) << tensor_type_name(t);
  }
  for (TensorType t : {TensorType::kF32, TensorType::kF16, TensorType::kQ8_1, TensorType::kQ2_K, TensorType::kQ8_K}) {
    EXPECT_FALSE(kernels::ref_quantized_weight_type(static_cast<uint32_t>(t))) << tensor_type_name(t);
  }
  EXPECT_EQ(kernels::ref_activation_row_bytes(kernels::kWeightQ4_K, 512), 2 * 292);
  EXPECT_EQ(kernels::ref_activation_row_bytes(kernels::kWeightQ5_1, 64), 2 * 36);
  EXPECT_EQ(kernels::ref_activation_row_bytes(kernels::kWeightQ5_0, 64), 2 * 34);
}

}  // namespace
}  // namespace helios
