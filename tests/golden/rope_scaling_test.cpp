// Rope scaling against llama.cpp: the logits of every position of a token sequence on three
// seeded synthetic models, plain, with Llama 3.1's rope_freqs.weight and with linear scaling by 4,
// as llama.cpp gives them (tests/golden/data/rope_scaling.json, scripts/make_rope_goldens.py).
// The models are written here from the spec the golden records, the same files the script had
// llama.cpp read. Tolerance: 2e-5 absolute on logits of magnitude about 1 (seen: 3e-6; F32
// weights and K/V on both sides; float sums in another order).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "golden/golden_util.h"
#include "helios/model_tools.h"

namespace helios {
namespace {

TEST(RopeScalingGolden, LogitsMatchLlamaCppWithAndWithoutTheScaling) {
  const nlohmann::json golden = testing::load_golden("rope_scaling.json");
  ASSERT_FALSE(golden.is_null());
  const nlohmann::json& s = golden["spec"];
  ASSERT_EQ(s["preset"], "tiny");  // make-synthetic's defaults are the tiny preset
  const std::vector<TokenId> tokens = testing::ids(golden["tokens"]);
  std::vector<std::vector<float>> seen;
  for (const nlohmann::json& entry : golden["models"]) {
    const bool scaled = entry["llama3_rope"];
    const float linear = entry["rope_linear"].get<float>();
    SCOPED_TRACE(std::string(scaled ? "with rope_freqs" : "without") + ", linear factor " + std::to_string(linear));
    SyntheticModelSpec spec;
    spec.rope_freq_base = s["rope_base"].get<float>();
    spec.type = *tensor_type_from_name(s["type"].get<std::string>());
    spec.tied_output = !s["untied"].get<bool>();
    spec.seed = s["seed"].get<uint64_t>();
    spec.llama3_rope = scaled;
    spec.rope_linear_factor = linear;
    const std::string path = testing::temp_dir() + "/rope-scaling-" + std::to_string(seen.size()) + ".gguf";
    ASSERT_TRUE(make_synthetic_model(spec, path).ok());
    auto backend = make_cpu_backend(1);
    auto model = Model::load(path, *backend);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    EXPECT_EQ((*model)->weights().rope_freqs.empty(), !scaled);
    const ForwardResult r = testing::all_logits(**model, tokens);
    const auto want = entry["logits"].get<std::vector<std::vector<float>>>();
    ASSERT_EQ(want.size(), tokens.size());
    float worst = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      ASSERT_EQ(static_cast<int32_t>(want[t].size()), r.n_vocab);
      for (int32_t v = 0; v < r.n_vocab; ++v) worst = std::max(worst, std::fabs(r.row(t)[v] - want[t][v]));
    }
    EXPECT_LT(worst, 2e-5f) << "largest logit difference from llama.cpp";
    seen.emplace_back(r.row(tokens.size() - 1), r.row(tokens.size() - 1) + r.n_vocab);
  }
  ASSERT_EQ(seen.size(), 3u);
  for (size_t m = 1; m < seen.size(); ++m) {
    float moved = 0;
    for (size_t v = 0; v < seen[0].size(); ++v) moved = std::max(moved, std::fabs(seen[0][v] - seen[m][v]));
    EXPECT_GT(moved, 1e-3f) << "model " << m << ": the scaling should change the last position's logits";
  }
}

}  // namespace
}  // namespace helios
