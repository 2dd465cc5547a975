// The quantized matmul kernels against llama.cpp's own CPU code (tests/golden/data/quant_dot.json,
// made by scripts/make_quant_goldens.py from ggml's AVX2 build): for every weight type, the
// activations round to the same 8-bit blocks, byte for byte, and each dot product is the same
// float, bit for bit — the vector code this build runs and the scalar reference alike; and the
// weights dequantize to ggml's floats (the loader's path for a type a backend cannot multiply).
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "golden_util.h"
#include "helios/tensor_type.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

template <typename T>
std::vector<T> rows_of(const nlohmann::json& rows) {
  std::vector<T> out;
  for (const auto& r : rows) {
    const std::vector<uint8_t> bytes = testing::from_hex(r.get<std::string>());
    const size_t n = bytes.size() / sizeof(T);
    out.resize(out.size() + n);
    std::memcpy(out.data() + out.size() - n, bytes.data(), bytes.size());
  }
  return out;
}

TEST(QuantDotGolden, MatchesLlamaCppBitForBit) {
  const std::string path = "tests/golden/data/quant_dot.json (scripts/make_quant_goldens.py makes it)";
  const nlohmann::json golden = testing::load_golden("quant_dot.json");
  ASSERT_TRUE(golden.contains("cases")) << path;
  std::set<std::string> seen;
  for (const auto& c : golden.at("cases")) {
    const std::string name = c.at("type");
    SCOPED_TRACE(name);
    const auto type = tensor_type_from_name(name);
    ASSERT_TRUE(type.has_value());
    const auto id = static_cast<uint32_t>(*type);
    const int32_t n_in = c.at("n_in");
    const auto w = rows_of<uint8_t>(c.at("weights_hex"));
    const auto x = rows_of<float>(c.at("x_f32_hex"));
    const auto want_xq = rows_of<uint8_t>(c.at("activations_hex"));
    const auto want = rows_of<float>(c.at("dots_f32_hex"));
    const auto n_out = static_cast<int32_t>(c.at("weights_hex").size());
    const auto n_rows = static_cast<int32_t>(c.at("x_f32_hex").size());
    ASSERT_EQ(static_cast<int64_t>(w.size()), n_out * tensor_row_bytes(*type, n_in));
    ASSERT_EQ(static_cast<int64_t>(x.size()), int64_t{n_rows} * n_in);

    const auto want_wd = rows_of<float>(c.at("weights_dequantized_f32_hex"));
    std::vector<float> wd(want_wd.size(), NAN);
    for (int32_t o = 0; o < n_out; ++o) {
      ASSERT_TRUE(dequantize_row(*type, w.data() + o * tensor_row_bytes(*type, n_in), wd.data() + int64_t{o} * n_in, n_in).ok());
    }
    for (size_t i = 0; i < wd.size(); ++i) ASSERT_EQ(wd[i], want_wd[i]) << "dequantized weight " << i;

    std::vector<uint8_t> xq(static_cast<size_t>(n_rows * kernels::ref_activation_row_bytes(id, n_in)));
    kernels::ref_quantize_activations(id, x.data(), n_rows, n_in, xq.data());
    ASSERT_EQ(xq.size(), want_xq.size());
    for (size_t i = 0; i < xq.size(); ++i) ASSERT_EQ(xq[i], want_xq[i]) << "activation byte " << i;

    std::vector<float> vec(n_rows * n_out, NAN), scalar(n_rows * n_out, NAN);
    kernels::ref_matmul_quantized(id, w.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, vec.data());
    kernels::ref_matmul_quantized_scalar(id, w.data(), xq.data(), n_rows, n_in, n_out, 0, n_out, scalar.data());
    for (int i = 0; i < n_rows * n_out; ++i) {
      EXPECT_EQ(std::memcmp(&vec[i], &want[i], 4), 0) << "row " << i / n_out << " out " << i % n_out << ": "
                                                       << vec[i] << " vs llama.cpp " << want[i];
      EXPECT_EQ(std::memcmp(&scalar[i], &want[i], 4), 0) << "scalar, row " << i / n_out << " out " << i % n_out
                                                          << ": " << scalar[i] << " vs llama.cpp " << want[i];
    }
    seen.insert(name);
  }
  for (const char* t : {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}) {
    EXPECT_TRUE(seen.count(t)) << t << " missing from " << path;
  }
}

}  // namespace
}  // namespace helios
