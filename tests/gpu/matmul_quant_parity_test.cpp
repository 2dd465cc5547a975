// Quantized weights on the GPU: launch_matmul_quant (decode rows, f32 activations) and
// launch_dequantize_f16 (the GEMM path's slices) against their CPU twin, the host's dequantize_row
// (then ref_matmul, f32), and launch_matmul_quant_q8 (decode rows, 8-bit activations) against the
// CPU backend's own product (ref_quantize_activations, ref_matmul_quantized), for every type the
// CUDA backend keeps in its blocks, on random weights quantized by the host.
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
#include <memory>
#include <string>

#include "gpu/gpu_test_util.h"
#include "helios/tensor_type.h"
#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/quant_blocks.h"

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

// Σ|w|·|x| per output: the scale of a product's rounding.
std::vector<float> magnitude(const QuantWeights& w, const std::vector<float>& x, int32_t n_rows, int32_t n_in,
                             int32_t n_out) {
  std::vector<float> xa(x.size()), wa(w.values.size()), bound(static_cast<size_t>(n_rows) * n_out);
  for (size_t i = 0; i < x.size(); ++i) xa[i] = std::fabs(x[i]);
  for (size_t i = 0; i < wa.size(); ++i) wa[i] = std::fabs(w.values[i]);
  kernels::ref_matmul(xa.data(), wa.data(), n_rows, n_in, n_out, bound.data());
  return bound;
}

// The weights on the device twice: at the start of an allocation (16-byte aligned) and 2 bytes
// into one (not), so a test runs every load path.
class DeviceWeights {
 public:
  explicit DeviceWeights(const std::vector<uint8_t>& bytes) : aligned_(bytes), shifted_(two_bytes_before(bytes)) {}
  const uint8_t* aligned() const { return aligned_.get(); }
  const uint8_t* misaligned() const { return shifted_.get() + 2; }
  static const char* name(bool aligned) { return aligned ? "aligned rows" : "rows 2 bytes off alignment"; }

 private:
  static std::vector<uint8_t> two_bytes_before(const std::vector<uint8_t>& bytes) {
    std::vector<uint8_t> v(2, 0);
    v.insert(v.end(), bytes.begin(), bytes.end());
    return v;
  }
  DeviceArray<uint8_t> aligned_, shifted_;
};

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
      std::vector<float> want(static_cast<size_t>(c.n_rows) * c.n_out);
      kernels::ref_matmul(x.data(), w.values.data(), c.n_rows, c.n_in, c.n_out, want.data());
      const auto bound = magnitude(w, x, c.n_rows, c.n_in, c.n_out);
      const DeviceWeights d_w(w.bytes);
      for (const bool aligned : {true, false}) {
        SCOPED_TRACE(DeviceWeights::name(aligned));
        const uint8_t* weights = aligned ? d_w.aligned() : d_w.misaligned();
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

// --- 8-bit activations.

// A workspace's rounded rows, read by its layout: each row n_in bytes, then a (d, s) float pair
// per 32 values, rows 16-byte aligned.
struct Q8Host {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};
Q8Host q8_from_workspace(const std::vector<uint8_t>& ws, int32_t n_rows, int32_t n_in) {
  const size_t stride = kernels::matmul_quant_q8_workspace_bytes(1, n_in), units = n_in / 32;
  Q8Host h{std::vector<int8_t>(static_cast<size_t>(n_rows) * n_in), std::vector<float>(n_rows * units),
           std::vector<float>(n_rows * units)};
  for (int32_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = ws.data() + r * stride;
    std::memcpy(h.q.data() + static_cast<size_t>(r) * n_in, row, n_in);
    for (size_t u = 0; u < units; ++u) {
      std::memcpy(&h.d[r * units + u], row + n_in + 8 * u, 4);
      std::memcpy(&h.s[r * units + u], row + n_in + 8 * u + 4, 4);
    }
  }
  return h;
}
Q8Host quantize_q8_on_host(TensorType type, const std::vector<float>& x, int32_t n_rows, int32_t n_in) {
  std::vector<uint8_t> ws(kernels::matmul_quant_q8_workspace_bytes(n_rows, n_in));
  EXPECT_EQ(kernels::quantize_activations_q8(static_cast<uint32_t>(type), x.data(), n_rows, n_in, ws.data()), 0);
  return q8_from_workspace(ws, n_rows, n_in);
}

// Activation rows with the cases the rounding must take as the CPU does: random values, a block
// of zeros, a largest magnitude held by both signs (Q8_K keeps the first), values whose scale is
// below a half's normal range, and a lone large value.
std::vector<float> activation_rows(int32_t n_rows, int32_t n_in, uint32_t seed) {
  auto x = normal_floats(static_cast<size_t>(n_rows) * n_in, seed);
  for (int32_t j = 0; j < 256 && j < n_in; ++j) x[j] = 0.0f;
  if (n_rows > 1) {
    float* r = x.data() + n_in;
    r[10] = -6.5f, r[40] = 6.5f;    // the negative first, in another unit of the block
    r[270] = 7.25f, r[300] = -7.25f;  // the positive first
    for (int32_t j = 512; j < 768 && j < n_in; ++j) r[j] *= 1e-6f;
    if (n_in > 900) r[900] = 1e4f;
  }
  return x;
}

// ref_quantize_activations_scalar's blocks for `type`'s rounding.
std::vector<uint8_t> cpu_blocks(TensorType type, const std::vector<float>& x, int32_t n_rows, int32_t n_in) {
  const auto t = static_cast<uint32_t>(type);
  std::vector<uint8_t> blocks(static_cast<size_t>(n_rows * kernels::ref_activation_row_bytes(t, n_in)));
  kernels::ref_quantize_activations_scalar(t, x.data(), n_rows, n_in, blocks.data());
  return blocks;
}

// No GPU needed: the device's rounding of activations, run on the host, gives
// ref_quantize_activations' integers and scales: Q8_1's for the 32-value types (Q8_0's integers
// and scale are the same), Q8_K's for the K-quants.
TEST(QuantDecoders, DeviceActivationRoundingIsTheHosts) {
  const int32_t n_rows = 3, n_in = 1024;
  const auto x = activation_rows(n_rows, n_in, 5);
  for (const TensorType type : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ4_K}) {
    SCOPED_TRACE(tensor_type_name(type));
    const Q8Host got = quantize_q8_on_host(type, x, n_rows, n_in);
    const bool k_quant = type == TensorType::kQ4_K;
    const auto blocks = cpu_blocks(k_quant ? type : TensorType::kQ4_1, x, n_rows, n_in);
    const auto blocks_q8_0 = cpu_blocks(TensorType::kQ4_0, x, n_rows, n_in);
    for (int32_t u = 0; u < n_rows * n_in / 32; ++u) {
      SCOPED_TRACE("unit " + std::to_string(u));
      const int8_t* want_q;
      float want_d, want_s;
      if (k_quant) {
        const auto& b = reinterpret_cast<const kernels::BlockQ8_K*>(blocks.data())[u / 8];
        want_q = b.qs + 32 * (u % 8);
        want_d = b.d;
        want_s = b.d * static_cast<float>(b.bsums[2 * (u % 8)] + b.bsums[2 * (u % 8) + 1]);
      } else {
        const auto& b = reinterpret_cast<const kernels::BlockQ8_1*>(blocks.data())[u];
        want_q = b.qs;
        want_d = kernels::fp16_to_fp32(b.d);
        want_s = kernels::fp16_to_fp32(b.s);
        const auto& b0 = reinterpret_cast<const kernels::BlockQ8_0*>(blocks_q8_0.data())[u];
        ASSERT_EQ(std::memcmp(b0.qs, b.qs, 32), 0);  // what lets one rounding serve both
        ASSERT_EQ(b0.d, b.d);
      }
      ASSERT_EQ(std::memcmp(got.q.data() + 32 * u, want_q, 32), 0);
      ASSERT_EQ(got.d[u], want_d);
      ASSERT_EQ(got.s[u], want_s);
    }
    // The first rows of a workspace are the workspace of those rows alone.
    std::vector<uint8_t> all(kernels::matmul_quant_q8_workspace_bytes(n_rows, n_in));
    std::vector<uint8_t> first(kernels::matmul_quant_q8_workspace_bytes(n_rows - 1, n_in));
    ASSERT_EQ(kernels::quantize_activations_q8(static_cast<uint32_t>(type), x.data(), n_rows, n_in, all.data()), 0);
    ASSERT_EQ(kernels::quantize_activations_q8(static_cast<uint32_t>(type), x.data(), n_rows - 1, n_in, first.data()), 0);
    ASSERT_EQ(std::memcmp(all.data(), first.data(), first.size()), 0);
  }
  EXPECT_TRUE(kernels::q8_rounds_alike(static_cast<uint32_t>(TensorType::kQ4_0), static_cast<uint32_t>(TensorType::kQ5_1)));
  EXPECT_TRUE(kernels::q8_rounds_alike(static_cast<uint32_t>(TensorType::kQ4_K), static_cast<uint32_t>(TensorType::kQ6_K)));
  EXPECT_FALSE(kernels::q8_rounds_alike(static_cast<uint32_t>(TensorType::kQ8_0), static_cast<uint32_t>(TensorType::kQ4_K)));
  EXPECT_FALSE(kernels::q8_rounds_alike(static_cast<uint32_t>(TensorType::kF16), static_cast<uint32_t>(TensorType::kF16)));
}

// The CPU backend's product: the activations rounded by ref_quantize_activations.
std::vector<float> cpu_q8_product(TensorType type, const QuantWeights& w, const std::vector<float>& x,
                                  int32_t n_rows, int32_t n_in, int32_t n_out) {
  const auto t = static_cast<uint32_t>(type);
  std::vector<uint8_t> xq(static_cast<size_t>(n_rows * kernels::ref_activation_row_bytes(t, n_in)));
  kernels::ref_quantize_activations(t, x.data(), n_rows, n_in, xq.data());
  std::vector<float> y(static_cast<size_t>(n_rows) * n_out);
  kernels::ref_matmul_quantized(t, w.bytes.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, y.data());
  return y;
}

// No GPU needed: the device's integer units and their scales, run on the host, sum to the CPU
// backend's products, through both load paths and with the rows 2 bytes off a word. The integer
// sums are the same, so only the float sums' order separates them; a bit taken from the wrong
// place moves a unit by a whole quantization step, thousands of times the margin.
TEST(QuantDecoders, DeviceIntegerUnitsGiveTheCpuProducts) {
  struct alignas(16) Chunk { uint8_t b[16]; };
  const int32_t n_rows = 2, n_out = 5, n_in = 1024;
  for (const TensorType type : kTypes) {
    SCOPED_TRACE(tensor_type_name(type));
    const QuantWeights w = quantized(type, n_out, n_in, 11);
    const auto x = activation_rows(n_rows, n_in, 3);
    const Q8Host xq = quantize_q8_on_host(type, x, n_rows, n_in);
    const auto want = cpu_q8_product(type, w, x, n_rows, n_in, n_out);
    const auto bound = magnitude(w, x, n_rows, n_in, n_out);
    const int64_t row_bytes = tensor_row_bytes(type, n_in);
    for (const size_t offset : {0, 2}) {
      std::vector<Chunk> buffer((offset + w.bytes.size() + 15) / 16);
      std::memcpy(reinterpret_cast<uint8_t*>(buffer.data()) + offset, w.bytes.data(), w.bytes.size());
      for (const bool vector : {false, true}) {
        for (int32_t o = 0; o < n_out; ++o) {
          const uint8_t* row = reinterpret_cast<const uint8_t*>(buffer.data()) + offset + o * row_bytes;
          if (vector && reinterpret_cast<uintptr_t>(row) % 16 != 0) continue;
          for (int32_t r = 0; r < n_rows; ++r) {
            double sum = 0.0;
            for (int32_t u = 0; u < n_in / 32; ++u) {
              const int32_t xu = r * n_in / 32 + u;
              float share = 0.0f;
              ASSERT_EQ(kernels::quant_unit_q8_share(static_cast<uint32_t>(type), row, u, vector, xq.q.data() + 32 * xu,
                                                     xq.d[xu], xq.s[xu], &share), 0);
              sum += share;
            }
            const size_t i = static_cast<size_t>(r) * n_out + o;
            ASSERT_NEAR(sum, want[i], 1e-5f * bound[i] + 1e-7f)
                << "offset " << offset << " row " << o << " activation row " << r
                << (vector ? " (16-byte loads)" : " (four-byte loads)");
          }
        }
      }
    }
  }
  float share;
  EXPECT_NE(kernels::quant_unit_q8_share(0, nullptr, 0, false, nullptr, 1.0f, 0.0f, &share), 0);
  EXPECT_NE(kernels::quantize_activations_q8(static_cast<uint32_t>(TensorType::kQ4_K), nullptr, 1, 100, nullptr), 0);
}

TEST(GpuParity, MatmulQuantizedQ8MatchesTheCpuBackend) {
  HELIOS_REQUIRE_GPU();
  struct Case { int32_t n_rows, n_in, n_out; };
  // 1-13 rows (one launch of 8, one of 5); n_in of one super-block, several, and not a multiple
  // of 32 units per lane.
  for (const TensorType type : kTypes) {
    for (const Case c : {Case{1, 1536, 333}, Case{3, 256, 64}, Case{8, 4096, 40}, Case{13, 768, 100},
                         Case{2, 1024, 9}}) {
      SCOPED_TRACE(std::string(tensor_type_name(type)) + " rows " + std::to_string(c.n_rows) + " n_in " +
                   std::to_string(c.n_in) + " n_out " + std::to_string(c.n_out));
      const QuantWeights w = quantized(type, c.n_out, c.n_in, c.n_in + c.n_out);
      const auto x = activation_rows(c.n_rows, c.n_in, c.n_rows + 7);
      const auto want = cpu_q8_product(type, w, x, c.n_rows, c.n_in, c.n_out);
      const auto bound = magnitude(w, x, c.n_rows, c.n_in, c.n_out);
      const size_t ws_bytes = kernels::matmul_quant_q8_workspace_bytes(c.n_rows, c.n_in);
      std::vector<uint8_t> host_ws(ws_bytes);
      ASSERT_EQ(kernels::quantize_activations_q8(static_cast<uint32_t>(type), x.data(), c.n_rows, c.n_in,
                                                 host_ws.data()), 0);
      const DeviceWeights d_w(w.bytes);
      for (const bool aligned : {true, false}) {
        SCOPED_TRACE(DeviceWeights::name(aligned));
        const uint8_t* weights = aligned ? d_w.aligned() : d_w.misaligned();
        DeviceArray<float> d_x(x), d_y(want.size());
        DeviceArray<uint8_t> d_ws(ws_bytes);
        ASSERT_EQ(kernels::launch_matmul_quant_q8(static_cast<uint32_t>(type), d_x.get(), weights, c.n_rows, c.n_in,
                                                  c.n_out, d_y.get(), d_ws.get(), ws_bytes, nullptr),
                  0);
        // The rounded activations are the host twin's, byte for byte.
        ASSERT_EQ(d_ws.to_host(), host_ws);
        const auto got = d_y.to_host();
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f * bound[i] + 1e-7f) << "element " << i;
      }
    }
  }
  // One rounding for types that round alike, and fewer rows than were rounded: the bits of a
  // rounding of their own.
  const int32_t n_in = 1024, n_out = 70;
  const auto x = activation_rows(5, n_in, 17);
  for (const auto& [first, second] : {std::pair{TensorType::kQ4_K, TensorType::kQ6_K},
                                      std::pair{TensorType::kQ4_0, TensorType::kQ5_1}}) {
    SCOPED_TRACE(std::string(tensor_type_name(first)) + " then " + tensor_type_name(second));
    ASSERT_TRUE(kernels::q8_rounds_alike(static_cast<uint32_t>(first), static_cast<uint32_t>(second)));
    const QuantWeights w = quantized(second, n_out, n_in, 23);
    const size_t ws_bytes = kernels::matmul_quant_q8_workspace_bytes(5, n_in);
    DeviceArray<float> d_x(x), d_alone(3 * n_out), d_shared(3 * n_out);
    DeviceArray<uint8_t> d_w(w.bytes), d_ws(ws_bytes), d_ws_alone(ws_bytes);
    ASSERT_EQ(kernels::launch_matmul_quant_q8(static_cast<uint32_t>(second), d_x.get(), d_w.get(), 3, n_in, n_out,
                                              d_alone.get(), d_ws_alone.get(), ws_bytes, nullptr), 0);
    ASSERT_EQ(kernels::launch_quantize_q8(static_cast<uint32_t>(first), d_x.get(), 5, n_in, d_ws.get(), ws_bytes,
                                          nullptr), 0);
    ASSERT_EQ(kernels::launch_matmul_q8_rows(static_cast<uint32_t>(second), d_ws.get(), d_w.get(), 3, n_in, n_out,
                                             d_shared.get(), nullptr, nullptr), 0);
    EXPECT_EQ(d_shared.to_host(), d_alone.to_host());
    // A bias added as the product is written: the bits of adding it after.
    const auto bias = normal_floats(n_out, 29);
    DeviceArray<float> d_bias(bias), d_biased(3 * n_out);
    ASSERT_EQ(kernels::launch_matmul_q8_rows(static_cast<uint32_t>(second), d_ws.get(), d_w.get(), 3, n_in, n_out,
                                             d_biased.get(), d_bias.get(), nullptr), 0);
    auto want = d_alone.to_host();
    kernels::ref_add_rows(want.data(), bias.data(), 3, n_out);
    EXPECT_EQ(d_biased.to_host(), want);
  }

  // A workspace too small, or none: an error, not a write past its end.
  const size_t small_bytes = kernels::matmul_quant_q8_workspace_bytes(1, 256) - 1;
  DeviceArray<uint8_t> small(small_bytes);
  EXPECT_NE(kernels::launch_matmul_quant_q8(static_cast<uint32_t>(TensorType::kQ4_K), nullptr, nullptr, 1, 256, 4,
                                            nullptr, small.get(), small_bytes, nullptr), 0);
  EXPECT_NE(kernels::launch_matmul_quant_q8(static_cast<uint32_t>(TensorType::kQ4_K), nullptr, nullptr, 1, 256, 4,
                                            nullptr, nullptr, 1 << 20, nullptr), 0);
}

// No GPU needed: a launch of several matrices gives every output row of each exactly one warp,
// and no warp a row of a matrix of none (Q with GQA's K and V, an empty matrix between).
TEST(QuantDecoders, ProductsInOneLaunchGiveEachOutputRowOneWarp) {
  const int32_t n_outs[] = {200, 24, 0, 25};
  std::vector<std::vector<float>> ys;
  kernels::GemvProducts products;
  uint8_t weights = 0;
  for (int k = 0; k < 4; ++k) {
    ys.emplace_back(1);
    products.at[k] = {&weights, n_outs[k], ys.back().data(), nullptr};
  }
  products.n = 4;
  float* y = nullptr;
  int32_t row = 0, n_blocks = 0;
  ASSERT_EQ(kernels::gemv_products_warp_row(products, 0, 0, &y, &row, &n_blocks), 0);
  EXPECT_EQ(n_blocks, 25 + 3 + 0 + 4);
  std::vector<std::vector<int>> writes(4);
  for (int k = 0; k < 4; ++k) writes[k].assign(n_outs[k], 0);
  int idle = 0;
  for (int32_t b = 0; b < n_blocks + 1; ++b) {  // one block past the grid: nothing
    for (int32_t warp = 0; warp < 8; ++warp) {
      ASSERT_EQ(kernels::gemv_products_warp_row(products, b, warp, &y, &row, &n_blocks), 0);
      if (!y) {
        EXPECT_EQ(row, -1);
        ++idle;
        continue;
      }
      const auto k = std::find_if(ys.begin(), ys.end(), [&](const auto& v) { return v.data() == y; }) - ys.begin();
      ASSERT_LT(k, 4) << "block " << b << " warp " << warp << " writes no product's output";
      ASSERT_GE(row, 0);
      ASSERT_LT(row, n_outs[k]) << "block " << b << " warp " << warp;
      ++writes[k][row];
    }
  }
  for (int k = 0; k < 4; ++k) {
    for (int32_t o = 0; o < n_outs[k]; ++o) EXPECT_EQ(writes[k][o], 1) << "matrix " << k << ", row " << o;
  }
  EXPECT_EQ(idle, (32 - 25) + 8);  // the last block's spare warps, and the block past the grid
  // Refused: more products than a launch takes, and rows to write with no matrix.
  kernels::GemvProducts bad = products;
  bad.n = kernels::kMaxGemvProducts + 1;
  EXPECT_NE(kernels::gemv_products_warp_row(bad, 0, 0, &y, &row, &n_blocks), 0);
  bad = products;
  bad.at[1].w = nullptr;
  EXPECT_NE(kernels::gemv_products_warp_row(bad, 0, 0, &y, &row, &n_blocks), 0);
  bad = products;
  bad.at[2].w = nullptr;  // the empty one: no rows, nothing to read
  EXPECT_EQ(kernels::gemv_products_warp_row(bad, 0, 0, &y, &row, &n_blocks), 0);
}

// Matrices of one type in one launch (Q with GQA's narrow K and V; a matrix of no rows; biases):
// each gets the bits of a launch of its own, at 1 to 8 rows and past 8, with vector loads and,
// one matrix placed 2 bytes off, without.
TEST(GpuParity, MatmulQuantizedProductsInOneLaunchAreEachTheirOwn) {
  HELIOS_REQUIRE_GPU();
  const int32_t n_in = 512;
  const int32_t n_outs[] = {200, 24, 0, 24};  // 25 blocks of 8 rows, then 3, none, 3
  DeviceArray<float> d_bias(normal_floats(200, 31));
  for (const TensorType type : {TensorType::kQ4_K, TensorType::kQ8_0, TensorType::kQ6_K}) {
    for (const size_t offset : {size_t{0}, size_t{2}}) {
      for (const int32_t n_rows : {1, 5, 11}) {
        SCOPED_TRACE(std::string(tensor_type_name(type)) + ", " + std::to_string(n_rows) + " rows, offset " +
                     std::to_string(offset));
        const auto x = activation_rows(n_rows, n_in, 37);
        const size_t ws_bytes = kernels::matmul_quant_q8_workspace_bytes(n_rows, n_in);
        DeviceArray<float> d_x(x);
        DeviceArray<uint8_t> d_ws(ws_bytes);
        ASSERT_EQ(kernels::launch_quantize_q8(static_cast<uint32_t>(type), d_x.get(), n_rows, n_in, d_ws.get(),
                                              ws_bytes, nullptr), 0);
        std::vector<std::unique_ptr<DeviceArray<uint8_t>>> d_w;
        std::vector<std::unique_ptr<DeviceArray<float>>> d_together, d_alone;
        kernels::GemvProducts products;
        for (int k = 0; k < 4; ++k) {
          const QuantWeights w = quantized(type, std::max(n_outs[k], 1), n_in, 41 + k);
          std::vector<uint8_t> placed(offset + w.bytes.size());
          std::copy(w.bytes.begin(), w.bytes.end(), placed.begin() + static_cast<std::ptrdiff_t>(k == 3 ? offset : 0));
          d_w.push_back(std::make_unique<DeviceArray<uint8_t>>(placed));
          const size_t n_y = static_cast<size_t>(n_rows) * std::max(n_outs[k], 1);
          d_together.push_back(std::make_unique<DeviceArray<float>>(std::vector<float>(n_y, -1.0f)));
          d_alone.push_back(std::make_unique<DeviceArray<float>>(std::vector<float>(n_y, -1.0f)));
          const uint8_t* wk = d_w.back()->get() + (k == 3 ? offset : 0);
          const float* bk = k == 0 || k == 3 ? d_bias.get() : nullptr;
          products.at[k] = {wk, n_outs[k], d_together.back()->get(), bk};
          ASSERT_EQ(kernels::launch_matmul_q8_rows(static_cast<uint32_t>(type), d_ws.get(), wk, n_rows, n_in, n_outs[k],
                                                   d_alone.back()->get(), bk, nullptr), 0);
        }
        products.n = 4;
        ASSERT_EQ(kernels::launch_matmul_q8_products(static_cast<uint32_t>(type), d_ws.get(), n_rows, n_in, products,
                                                     nullptr), 0);
        for (int k = 0; k < 4; ++k) {
          const auto got = d_together[k]->to_host();
          EXPECT_EQ(got, d_alone[k]->to_host()) << "matrix " << k;
          if (n_outs[k] > 0) {
            EXPECT_NE(got[0], -1.0f) << "matrix " << k << " was not written";
          }
        }
        EXPECT_EQ(d_together[2]->to_host(), std::vector<float>(n_rows, -1.0f)) << "the matrix of no rows was written";
      }
    }
  }
  kernels::GemvProducts too_many;
  too_many.n = kernels::kMaxGemvProducts + 1;
  DeviceArray<uint8_t> ws(kernels::matmul_quant_q8_workspace_bytes(1, 256));
  EXPECT_NE(kernels::launch_matmul_q8_products(static_cast<uint32_t>(TensorType::kQ4_K), ws.get(), 1, 256, too_many,
                                               nullptr), 0);
}

TEST(GpuParity, MatmulQuantizedRefusesAWidthOutsideItsBlocks) {
  HELIOS_REQUIRE_GPU();
  // 100 values are not whole Q4_K super-blocks; F32 is not a quantized type: errors, not wrong answers.
  EXPECT_NE(kernels::launch_matmul_quant(static_cast<uint32_t>(TensorType::kQ4_K), nullptr, nullptr, 1, 100, 4,
                                         nullptr, nullptr), 0);
  EXPECT_NE(kernels::launch_matmul_quant(0, nullptr, nullptr, 1, 256, 4, nullptr, nullptr), 0);
}

// The launches that round their output for the next product as they write it (a norm's, SwiGLU's):
// the same floats and the same workspace bytes as the plain launch followed by launch_quantize_q8.
// Widths of one pass of the block's threads and of more (11008 values: 344 units).
TEST(GpuParity, NormsAndSwigluRoundTheirOutputAsQuantizeQ8Does) {
  HELIOS_REQUIRE_GPU();
  const float eps = 1e-5f;
  auto same_bytes = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  for (const TensorType type : {TensorType::kQ4_0, TensorType::kQ4_K}) {
    const auto t = static_cast<uint32_t>(type);
    const std::vector<int32_t> dims = type == TensorType::kQ4_K ? std::vector<int32_t>{4864, 11008}
                                                                : std::vector<int32_t>{896, 4096, 11008};
    for (const int32_t dim : dims) {
      for (const int32_t n_rows : {1, 3, 8}) {
        SCOPED_TRACE(std::string(tensor_type_name(type)) + ", " + std::to_string(n_rows) + " rows of " +
                     std::to_string(dim));
        const size_t n = static_cast<size_t>(n_rows) * dim;
        const size_t ws_bytes = kernels::matmul_quant_q8_workspace_bytes(n_rows, dim);
        const std::vector<uint8_t> blank(ws_bytes, 0xAB);  // padding neither writes stays equal
        const auto x = normal_floats(n, 1), y = normal_floats(n, 2), gate = normal_floats(n, 3),
                   up = normal_floats(n, 4);
        const auto weight = normal_floats(static_cast<size_t>(dim), 5);
        DeviceArray<float> d_weight(weight), d_y(y), d_up(up);

        // rmsnorm
        DeviceArray<float> d_x(x), fused_out(n), plain_out(n);
        DeviceArray<uint8_t> fused_ws(blank), plain_ws(blank);
        ASSERT_EQ(kernels::launch_rmsnorm_q8(t, d_x.get(), d_weight.get(), n_rows, dim, eps, fused_out.get(),
                                             fused_ws.get(), ws_bytes, nullptr), 0);
        ASSERT_EQ(kernels::launch_rmsnorm(d_x.get(), d_weight.get(), n_rows, dim, eps, plain_out.get(), nullptr), 0);
        ASSERT_EQ(kernels::launch_quantize_q8(t, plain_out.get(), n_rows, dim, plain_ws.get(), ws_bytes, nullptr), 0);
        EXPECT_TRUE(same_bytes(fused_out.to_host(), plain_out.to_host())) << "rmsnorm's floats";
        EXPECT_TRUE(same_bytes(fused_ws.to_host(), plain_ws.to_host())) << "rmsnorm's rounding";
        EXPECT_FALSE(same_bytes(fused_ws.to_host(), blank)) << "nothing rounded";

        // add_rmsnorm: x updated in place, then normed
        DeviceArray<float> fused_x(x), plain_x(x);
        ASSERT_EQ(kernels::launch_add_rmsnorm_q8(t, fused_x.get(), d_y.get(), d_weight.get(), n_rows, dim, eps,
                                                 fused_out.get(), fused_ws.get(), ws_bytes, nullptr), 0);
        ASSERT_EQ(kernels::launch_add_rmsnorm(plain_x.get(), d_y.get(), d_weight.get(), n_rows, dim, eps,
                                              plain_out.get(), nullptr), 0);
        ASSERT_EQ(kernels::launch_quantize_q8(t, plain_out.get(), n_rows, dim, plain_ws.get(), ws_bytes, nullptr), 0);
        EXPECT_TRUE(same_bytes(fused_x.to_host(), plain_x.to_host())) << "add_rmsnorm's sum";
        EXPECT_TRUE(same_bytes(fused_out.to_host(), plain_out.to_host())) << "add_rmsnorm's floats";
        EXPECT_TRUE(same_bytes(fused_ws.to_host(), plain_ws.to_host())) << "add_rmsnorm's rounding";

        // swiglu, in place over gate as the forward pass runs it
        DeviceArray<float> fused_gate(gate), plain_gate(gate);
        ASSERT_EQ(kernels::launch_swiglu_q8(t, fused_gate.get(), d_up.get(), n_rows, dim, fused_gate.get(),
                                            fused_ws.get(), ws_bytes, nullptr), 0);
        ASSERT_EQ(kernels::launch_swiglu(plain_gate.get(), d_up.get(), static_cast<int64_t>(n), plain_gate.get(),
                                         nullptr), 0);
        ASSERT_EQ(kernels::launch_quantize_q8(t, plain_gate.get(), n_rows, dim, plain_ws.get(), ws_bytes, nullptr), 0);
        EXPECT_TRUE(same_bytes(fused_gate.to_host(), plain_gate.to_host())) << "swiglu's floats";
        EXPECT_TRUE(same_bytes(fused_ws.to_host(), plain_ws.to_host())) << "swiglu's rounding";
      }
    }
  }
  // Errors, not wrong answers: a type not rounded to 8 bits, a width outside its blocks, a workspace too small.
  DeviceArray<float> v(512), w(512);
  const size_t ws_bytes = kernels::matmul_quant_q8_workspace_bytes(2, 512);
  DeviceArray<uint8_t> ws(ws_bytes);
  const auto q4_k = static_cast<uint32_t>(TensorType::kQ4_K);
  EXPECT_NE(kernels::launch_rmsnorm_q8(static_cast<uint32_t>(TensorType::kF16), v.get(), w.get(), 1, 512, 1e-5f,
                                       v.get(), ws.get(), ws_bytes, nullptr), 0);
  EXPECT_NE(kernels::launch_rmsnorm_q8(q4_k, v.get(), w.get(), 1, 500, 1e-5f, v.get(), ws.get(), ws_bytes, nullptr),
            0);
  EXPECT_NE(kernels::launch_swiglu_q8(q4_k, v.get(), w.get(), 1, 512, v.get(), ws.get(), 10, nullptr), 0);
}

}  // namespace
}  // namespace helios
