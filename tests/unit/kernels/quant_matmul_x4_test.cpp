// Q4_K and Q6_K weights interleaved 4 rows at a time (the CPU backend's layout): the repacking is a
// permutation of the bytes that undoes exactly; the product equals the exact one (the blocks'
// integers summed in double) to float rounding, as closely as llama.cpp's row kernel does; the
// vector code gives the scalar twin's bits for every batch shape and output split; and a row's
// result does not depend on the rows multiplied with it.
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

constexpr uint32_t kQ4K = kernels::kWeightQ4_K, kQ6K = kernels::kWeightQ6_K;
constexpr int kActBlockBytes = 292;

int block_bytes(uint32_t type) { return type == kQ6K ? 210 : 144; }

// Random blocks: any nibbles, high bits and scales, with sane fp16 d (and Q4_K's dmin), as real
// files have.
std::vector<uint8_t> random_weights(uint32_t type, int n_out, int n_in, std::mt19937& rng) {
  const int bytes = block_bytes(type);
  std::vector<uint8_t> w(static_cast<size_t>(n_out) * (n_in / 256) * bytes);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> mag(-6.0f, -2.0f);
  for (size_t b = 0; b < w.size(); b += bytes) {
    for (int off : type == kQ6K ? std::vector<int>{208} : std::vector<int>{0, 2}) {
      const uint16_t h = fp32_to_fp16(std::exp(mag(rng)));
      std::memcpy(&w[b + off], &h, 2);
    }
  }
  return w;
}

std::vector<uint8_t> quantized_activations(int n_rows, int n_in, std::mt19937& rng) {  // Q8_K
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_rows) * n_in);
  for (auto& v : x) v = normal(rng);
  for (int r = 0; r < n_rows; ++r) x[static_cast<size_t>(r) * n_in + (13 * r) % n_in] = 30.0f;  // outliers
  std::vector<uint8_t> xq(static_cast<size_t>(n_rows * kernels::ref_activation_row_bytes(kQ4K, n_in)));
  kernels::ref_quantize_activations(kQ4K, x.data(), n_rows, n_in, xq.data());
  return xq;
}

// dot(w[o], x[r]) from the blocks' integers, in double. Q4_K: Σ_b x.d·(d·Σ_j sc_j·Σ q·x −
// dmin·Σ_j m_j·Σ x); Q6_K: Σ_b x.d·d·Σ_n sc[n / 16]·(q_n − 32)·x_n.
double exact_dot(uint32_t type, const uint8_t* w_row, const uint8_t* x_row, int n_in) {
  double sum = 0;
  for (int b = 0; b < n_in / 256; ++b) {
    const uint8_t* wb = w_row + b * block_bytes(type);
    const uint8_t* xb = x_row + b * kActBlockBytes;
    float xd;
    std::memcpy(&xd, xb, 4);
    const auto* xs = reinterpret_cast<const int8_t*>(xb + 4);
    if (type == kQ6K) {
      const uint8_t *ql = wb, *qh = wb + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(wb + 192);
      uint16_t d16;
      std::memcpy(&d16, wb + 208, 2);
      long long isum = 0;
      for (int n = 0; n < 256; ++n) {  // n = 128h + 32i + l, as GGUF lays Q6_K out
        const int h = n / 128, i = n % 128 / 32, l = n % 32;
        const int low = (ql[64 * h + 32 * (i % 2) + l] >> (4 * (i / 2))) & 0xF;
        const int top = (qh[32 * h + l] >> (2 * i)) & 3;
        isum += static_cast<long long>(sc[n / 16]) * ((low | top << 4) - 32) * xs[n];
      }
      sum += static_cast<double>(xd) * fp16_to_fp32(d16) * static_cast<double>(isum);
      continue;
    }
    uint16_t d16, dmin16;
    std::memcpy(&d16, wb, 2);
    std::memcpy(&dmin16, wb + 2, 2);
    const uint8_t* scales = wb + 4;
    const uint8_t* qs = wb + 16;
    for (int j = 0; j < 8; ++j) {
      // k_quant_scale_min, written out again
      const int sc = j < 4 ? scales[j] & 63 : (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
      const int mn = j < 4 ? scales[j + 4] & 63 : (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
      long long qx = 0, xsum = 0;
      for (int l = 0; l < 32; ++l) {
        qx += ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF) * xs[32 * j + l];
        xsum += xs[32 * j + l];
      }
      sum += static_cast<double>(xd) * (static_cast<double>(fp16_to_fp32(d16)) * sc * qx -
                                        static_cast<double>(fp16_to_fp32(dmin16)) * mn * xsum);
    }
  }
  return sum;
}

class Interleaved : public ::testing::TestWithParam<uint32_t> {};

std::string type_name(const ::testing::TestParamInfo<uint32_t>& info) { return info.param == kQ6K ? "Q6_K" : "Q4_K"; }

TEST(Interleavable, KQuantsWithWholeGroupsOfFourRows) {
  EXPECT_TRUE(kernels::ref_interleavable(kQ4K, 8960, 1536));
  EXPECT_TRUE(kernels::ref_interleavable(kQ6K, 151936, 1536));
  EXPECT_FALSE(kernels::ref_interleavable(kQ4K, 6, 256));  // a ragged group
  EXPECT_FALSE(kernels::ref_interleavable(kQ6K, 8, 200));  // not whole super-blocks
  EXPECT_FALSE(kernels::ref_interleavable(kernels::kWeightQ5_K, 8, 256));
  EXPECT_FALSE(kernels::ref_interleavable(kernels::kWeightQ8_0, 8, 256));
}

TEST_P(Interleaved, RepackingIsAPermutationThatUndoesExactly) {
  const uint32_t type = GetParam();
  std::mt19937 rng(3);
  const int n_out = 12, n_in = 768;
  const std::vector<uint8_t> w = random_weights(type, n_out, n_in, rng);
  std::vector<uint8_t> packed(w.size(), 0xAA), back(w.size(), 0x55);
  kernels::ref_interleave_weights(type, w.data(), n_out, n_in, packed.data());
  const size_t row_bytes = w.size() / n_out;
  for (int r = 0; r < n_out; ++r) kernels::ref_deinterleave_row(type, packed.data(), n_in, r, back.data() + r * row_bytes);
  EXPECT_EQ(back, w);
  EXPECT_NE(packed, w);
  std::vector<uint8_t> a = w, b = packed;  // the same bytes, rearranged
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
}

TEST_P(Interleaved, EqualsTheExactProductAsCloselyAsTheRowKernel) {
  const uint32_t type = GetParam();
  std::mt19937 rng(11);
  const int n_out = 16, n_in = 1536, n_rows = 5;
  const std::vector<uint8_t> w = random_weights(type, n_out, n_in, rng);
  const std::vector<uint8_t> xq = quantized_activations(n_rows, n_in, rng);
  std::vector<uint8_t> packed(w.size());
  kernels::ref_interleave_weights(type, w.data(), n_out, n_in, packed.data());
  std::vector<float> rows(n_rows * n_out, NAN), x4(n_rows * n_out, NAN);
  kernels::ref_matmul_quantized(type, w.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, rows.data());
  kernels::ref_matmul_interleaved(type, packed.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, x4.data());
  const int64_t w_row = n_in / 256 * block_bytes(type), x_row = kernels::ref_activation_row_bytes(type, n_in);
  double worst_rows = 0, worst_x4 = 0;
  for (int r = 0; r < n_rows; ++r) {
    for (int o = 0; o < n_out; ++o) {
      const double exact = exact_dot(type, w.data() + o * w_row, xq.data() + r * x_row, n_in);
      const double scale = std::max(1.0, std::fabs(exact));
      worst_rows = std::max(worst_rows, std::fabs(rows[r * n_out + o] - exact) / scale);
      worst_x4 = std::max(worst_x4, std::fabs(x4[r * n_out + o] - exact) / scale);
    }
  }
  EXPECT_LT(worst_x4, 1e-5);
  EXPECT_LE(worst_x4, 2 * worst_rows + 1e-6) << "row kernel " << worst_rows;
}

// Batches that leave edge tiles of every size (1 to 7 activation rows after the whole tiles),
// output ranges split on the 4-row grid as the thread pool splits them, and rows enough for
// several L2 chunks.
TEST_P(Interleaved, VectorCodeGivesTheScalarBitsForEveryBatchShape) {
  const uint32_t type = GetParam();
  struct Shape {
    int n_out, n_in;
    std::vector<int> rows;
  };
  const std::vector<Shape> shapes = {{4, 256, {1, 2, 3, 7, 8, 9, 15, 19}}, {20, 768, {1, 5, 8, 13, 17}}, {8, 10240, {70}}};
  std::mt19937 rng(29);
  for (const Shape& sh : shapes) {
    const std::vector<uint8_t> w = random_weights(type, sh.n_out, sh.n_in, rng);
    std::vector<uint8_t> packed(w.size());
    kernels::ref_interleave_weights(type, w.data(), sh.n_out, sh.n_in, packed.data());
    const int64_t x_row = kernels::ref_activation_row_bytes(type, sh.n_in);
    for (int n_rows : sh.rows) {
      const std::vector<uint8_t> xq = quantized_activations(n_rows, sh.n_in, rng);
      const size_t n_y = static_cast<size_t>(n_rows) * sh.n_out;
      std::vector<float> batch(n_y, NAN), split(n_y, NAN), one(n_y, NAN), scalar(n_y, NAN);
      kernels::ref_matmul_interleaved(type, packed.data(), xq.data(), n_rows, sh.n_in, sh.n_out, 0, sh.n_out, batch.data());
      const int cut = sh.n_out / 8 * 4;
      kernels::ref_matmul_interleaved(type, packed.data(), xq.data(), n_rows, sh.n_in, sh.n_out, 0, cut, split.data());
      kernels::ref_matmul_interleaved(type, packed.data(), xq.data(), n_rows, sh.n_in, sh.n_out, cut, sh.n_out, split.data());
      for (int r = 0; r < n_rows; ++r) {
        kernels::ref_matmul_interleaved(type, packed.data(), xq.data() + r * x_row, 1, sh.n_in, sh.n_out, 0, sh.n_out,
                                        &one[static_cast<size_t>(r) * sh.n_out]);
      }
      kernels::ref_matmul_interleaved_scalar(type, packed.data(), xq.data(), n_rows, sh.n_in, sh.n_out, 0, sh.n_out,
                                             scalar.data());
      const std::string where = "n_out " + std::to_string(sh.n_out) + " n_in " + std::to_string(sh.n_in) + " rows " +
                                std::to_string(n_rows);
      for (size_t i = 0; i < n_y; ++i) ASSERT_TRUE(std::isfinite(batch[i])) << where << " [" << i << "]";
      EXPECT_EQ(std::memcmp(batch.data(), scalar.data(), n_y * 4), 0) << where << ": vector vs scalar";
      EXPECT_EQ(std::memcmp(batch.data(), split.data(), n_y * 4), 0) << where << ": whole vs split output range";
      EXPECT_EQ(std::memcmp(batch.data(), one.data(), n_y * 4), 0) << where << ": batch vs one row at a time";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KQuants, Interleaved, ::testing::Values(kQ4K, kQ6K), type_name);

}  // namespace
}  // namespace helios
