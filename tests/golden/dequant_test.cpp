// dequantize_row against gguf-py's independent dequantization (tests/golden/data/dequant.json):
// exact for F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0; within 1 ulp for Q4_K/Q6_K, whose d·scale products
// gguf-py forms in a different order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "golden_util.h"
#include "helios/tensor_type.h"
#include "test_paths.h"

namespace helios {
namespace {

// Distance in representable floats; 0 when bit-identical (or both zero).
int64_t ulps_apart(float a, float b) {
  if (a == b) return 0;
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::llabs(ordered(a) - ordered(b));
}

TEST(TensorTypeGoldenDequant, MatchesGgufPy) {
  const std::string path = testing::source_dir() + "/tests/golden/data/dequant.json";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing (scripts/make_goldens.py makes it)";
  const nlohmann::json golden = nlohmann::json::parse(std::ifstream(path));
  std::set<std::string> seen;
  for (const auto& c : golden.at("cases")) {
    const std::string name = c.at("type");
    SCOPED_TRACE(name);
    const auto type = static_cast<TensorType>(c.at("type_id").get<uint32_t>());
    ASSERT_EQ(tensor_type_from_name(name), type);
    auto traits = tensor_type_traits(static_cast<uint32_t>(type));
    ASSERT_TRUE(traits.has_value());
    if (c.contains("block_size")) {
      EXPECT_EQ(traits->block_elems, c.at("block_size").get<int64_t>());
    }
    if (c.contains("type_size")) {
      EXPECT_EQ(traits->block_bytes, c.at("type_size").get<int64_t>());
    }
    const int64_t n = c.at("n_elements");
    const std::vector<uint8_t> bytes = testing::from_hex(c.at("bytes_hex"));
    ASSERT_EQ(static_cast<int64_t>(bytes.size()), tensor_row_bytes(type, n));
    const std::vector<double> want = c.at("values").get<std::vector<double>>();
    ASSERT_EQ(static_cast<int64_t>(want.size()), n);
    std::vector<float> got(n);
    ASSERT_TRUE(dequantize_row(type, bytes.data(), got.data(), n).ok());
    const bool k_quant = type == TensorType::kQ4_K || type == TensorType::kQ6_K;
    int64_t worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float w = static_cast<float>(want[i]);
      const int64_t ulps = ulps_apart(got[i], w);
      worst = std::max(worst, ulps);
      ASSERT_LE(ulps, k_quant ? 1 : 0) << "element " << i << ": got " << got[i] << ", want " << w;
    }
    RecordProperty(name + "_max_ulps", static_cast<int>(worst));
    seen.insert(name);
  }
  for (const char* t : {"F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"}) {
    EXPECT_TRUE(seen.count(t)) << t << " missing from " << path;
  }
}

}  // namespace
}  // namespace helios
