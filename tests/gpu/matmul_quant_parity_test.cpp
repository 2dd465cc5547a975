// Quantized weights on the GPU: launch_matmul_quant (decode rows) and launch_dequantize_f16 (the
// GEMM path's slices) against their CPU twin, the host's dequantize_row (then ref_matmul, f32),
// for every type the CUDA backend keeps in its blocks, on random weights quantized by the host.
// Tolerance for the product: 1e-5 · Σ|w·x| per output (the same dequantized values, float sums in
// another order); the f16 dequantization is the host's values rounded to nearest even, to within
// one unit in the last place of the half (d·q + m may be one fused multiply-add on one side and
// two roundings on the other, which moves a value one float ulp and, rarely, its half).
// Q4_K and Q5_K are read with 16-byte loads from aligned rows and in 4-byte words otherwise: both
// paths run here, and on the CPU (no GPU needed) the device's decoders are checked against
// dequantize_row unit by unit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>

#include "gpu/gpu_test_util.h"
#include "helios/tensor_type.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

using gpu_test::DeviceArray;
using gpu_test::normal_floats;

constexpr TensorType kTypes[] = {TensorType::kQ8_0, TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0,
                                 TensorType::kQ5_1, TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K};

// Random weights [n_out, n_in] in `type`'s blocks, and the host's dequantization of them.
struct QuantWeights {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
QuantWeights quantized(TensorType type, int32_t n_out, int32_t n_in, uint32_t seed) {
  const auto w = normal_floats(static_cast<size_t>(n_out) * n_in, seed, 0.05f);
  const int64_t row_bytes = tensor_row_bytes(type, n_in);
  QuantWeights q{std::vector<uint8_t>(static_cast<size_t>(row_bytes) * n_out), std::vector<float>(w.size())};
  for (int32_t o = 0; o < n_out; ++o) {
    EXPECT_TRUE(quantize_row(type, w.data() + static_cast<int64_t>(o) * n_in, q.bytes.data() + o * row_bytes, n_in).ok());
    EXPECT_TRUE(dequantize_row(type, q.bytes.data() + o * row_bytes, q.values.data() + static_cast<int64_t>(o) * n_in,
                               n_in).ok());
  }
  return q;
}

TEST(GpuParity, MatmulQuantizedMatchesTheCpuTwin) {
  HELIOS_REQUIRE_GPU();
  struct Case { int32_t n_rows, n_in, n_out; };
  // 1-13 rows (one launch of 8, one of 5); n_in of one block, several, not a multiple of 32 units
  // per lane, and past one staged stretch of activations (7168 / 2048 / 1024 columns at 1 / 3 / 6 rows).
  for (const TensorType type : kTypes) {
    for (const Case c : {Case{1, 1536, 333}, Case{3, 256, 64}, Case{8, 4096, 40}, Case{13, 768, 100},
                         Case{1, 8192, 20}, Case{3, 2560, 30}, Case{6, 3072, 17}}) {
      SCOPED_TRACE(std::string(tensor_type_name(type)) + " rows " + std::to_string(c.n_rows) + " n_in " +
                   std::to_string(c.n_in) + " n_out " + std::to_string(c.n_out));
      const QuantWeights w = quantized(type, c.n_out, c.n_in, c.n_in + c.n_out);
      const auto x = normal_floats(static_cast<size_t>(c.n_rows) * c.n_in, c.n_rows + 7);
      std::vector<float> want(static_cast<size_t>(c.n_rows) * c.n_out), bound(want.size());
      kernels::ref_matmul(x.data(), w.values.data(), c.n_rows, c.n_in, c.n_out, want.data());
      std::vector<float> xa(x.size()), wa(w.values.size());
      for (size_t i = 0; i < x.size(); ++i) xa[i] = std::fabs(x[i]);
      for (size_t i = 0; i < wa.size(); ++i) wa[i] = std::fabs(w.values[i]);
      kernels::ref_matmul(xa.data(), wa.data(), c.n_rows, c.n_in, c.n_out, bound.data());

      // The weights at the start of an allocation (16-byte aligned) and 2 bytes into one (not).
      std::vector<uint8_t> shifted(2, 0);
      shifted.insert(shifted.end(), w.bytes.begin(), w.bytes.end());
      DeviceArray<uint8_t> d_w(w.bytes), d_w_shifted(shifted);
      const uint8_t* aligned = d_w.get();
      const uint8_t* misaligned = d_w_shifted.get() + 2;
      for (const uint8_t* weights : {aligned, misaligned}) {
        SCOPED_TRACE(weights == aligned ? "aligned rows" : "rows 2 bytes off alignment");
        DeviceArray<float> d_x(x), d_y(want.size());
        ASSERT_EQ(kernels::launch_matmul_quant(static_cast<uint32_t>(type), d_x.get(), weights, c.n_rows, c.n_in,
                                               c.n_out, d_y.get(), nullptr),
                  0);
        const auto got = d_y.to_host();
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f * bound[i] + 1e-7f) << "element " << i;
      }
    }
  }
}

// No GPU needed: the kernels' own decoders, compiled for the host, give dequantize_row's values
// (to within the rounding of d·q + m as one fused multiply-add or two operations) for every unit
// of every type, through both the 16-byte and the four-byte loads, with the matrix at a 4-byte
// boundary and 2 bytes past one (so every block is read both ways, whole words and words shifted
// together). A bit taken from the wrong place moves a value by a whole quantization step, a
// million times this margin.
TEST(QuantDecoders, DeviceDecodersGiveTheHostsValues) {
  struct alignas(16) Chunk { uint8_t b[16]; };
  for (const TensorType type : kTypes) {
    SCOPED_TRACE(tensor_type_name(type));
    const int32_t n_out = 5, n_in = 1024;
    const QuantWeights w = quantized(type, n_out, n_in, 7);
    const int64_t row_bytes = tensor_row_bytes(type, n_in);
    for (const size_t offset : {0, 2}) {
      // Whole 4-byte words from a 16-byte boundary, as the backend's buffers are.
      std::vector<Chunk> buffer((offset + w.bytes.size() + 15) / 16);
      std::memcpy(reinterpret_cast<uint8_t*>(buffer.data()) + offset, w.bytes.data(), w.bytes.size());
      for (int32_t o = 0; o < n_out; ++o) {
        const float* want = w.values.data() + static_cast<int64_t>(o) * n_in;
        float scale = 0.0f;
        for (int32_t i = 0; i < n_in; ++i) scale = std::max(scale, std::fabs(want[i]));
        const uint8_t* row = reinterpret_cast<const uint8_t*>(buffer.data()) + offset + o * row_bytes;
        for (const bool vector : {false, true}) {
          if (vector && reinterpret_cast<uintptr_t>(row) % 16 != 0) continue;  // only aligned rows take 16-byte loads
          for (int32_t u = 0; u < n_in / 32; ++u) {
            float got[32];
            ASSERT_EQ(kernels::decode_quant_unit(static_cast<uint32_t>(type), row, u, vector, got), 0);
            for (int j = 0; j < 32; ++j) {
              ASSERT_NEAR(got[j], want[u * 32 + j], 1e-6f * scale)
                  << "offset " << offset << " row " << o << " unit " << u << " value " << j
                  << (vector ? " (16-byte loads)" : " (four-byte loads)");
            }
          }
        }
      }
    }
  }
  float v[32];
  EXPECT_NE(kernels::decode_quant_unit(0, nullptr, 0, false, v), 0);  // F32 is not a block type
}

TEST(GpuParity, DequantizeToF16IsTheHostsValuesRounded) {
  HELIOS_REQUIRE_GPU();
  for (const TensorType type : kTypes) {
    SCOPED_TRACE(tensor_type_name(type));
    const int32_t n_out = 37, n_in = 512;
    const QuantWeights w = quantized(type, n_out, n_in, 99);
    std::vector<uint16_t> want(w.values.size());
    kernels::ref_f32_to_f16(w.values.data(), static_cast<int64_t>(want.size()), want.data());
    DeviceArray<uint8_t> d_w(w.bytes);
    DeviceArray<uint16_t> d_h(want.size());
    ASSERT_EQ(kernels::launch_dequantize_f16(static_cast<uint32_t>(type), d_w.get(), n_out, n_in, d_h.get(), nullptr), 0);
    const auto got = d_h.to_host();
    for (size_t i = 0; i < got.size(); ++i) {
      // Same-signed halves order as their bits: one step apart at most.
      const bool same_sign = (got[i] & 0x8000) == (want[i] & 0x8000);
      const bool both_zero = (got[i] & 0x7FFF) == 0 && (want[i] & 0x7FFF) == 0;
      ASSERT_TRUE(got[i] == want[i] || both_zero || (same_sign && std::abs(int{got[i]} - int{want[i]}) <= 1))
          << "element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

TEST(GpuParity, MatmulQuantizedRefusesAWidthOutsideItsBlocks) {
  HELIOS_REQUIRE_GPU();
  // 100 values are not whole Q4_K super-blocks; F32 is not a quantized type: errors, not wrong answers.
  EXPECT_NE(kernels::launch_matmul_quant(static_cast<uint32_t>(TensorType::kQ4_K), nullptr, nullptr, 1, 100, 4,
                                         nullptr, nullptr), 0);
  EXPECT_NE(kernels::launch_matmul_quant(0, nullptr, nullptr, 1, 256, 4, nullptr, nullptr), 0);
}

}  // namespace
}  // namespace helios
