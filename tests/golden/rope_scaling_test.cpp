// Rope scaling against llama.cpp: the logits at every 16th position of a 160-token sequence on
// seeded synthetic models, plain, with Llama 3.1's rope_freqs.weight, with linear scaling by 4, with
// YaRN by 4 and with YaRN by 8 after the divisors (and attn_factor 0.8), as llama.cpp gives them
// (tests/golden/data/rope_scaling.json, scripts/make_rope_goldens.py). The models are written here
// from the spec the golden records, the same files the script had llama.cpp read. Tolerance: 2e-5
// absolute on logits of magnitude about 1 (F32 weights and K/V on both sides; float sums in
// another order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
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
  const auto rows = golden["rows"].get<std::vector<size_t>>();
  std::vector<std::vector<float>> seen;
  for (const nlohmann::json& entry : golden["models"]) {
    const bool divided = entry["llama3_rope"];
    const std::string scaling = entry["scaling"];
    SCOPED_TRACE(std::string(divided ? "with rope_freqs" : "without") + ", scaling " + scaling + " by " +
                 entry["factor"].dump() + ", original context " + entry["original_ctx"].dump() + ", attn_factor " +
                 entry["attn_factor"].dump());
    SyntheticModelSpec spec;
    spec.rope_freq_base = s["rope_base"].get<float>();
    spec.type = *tensor_type_from_name(s["type"].get<std::string>());
    spec.tied_output = !s["untied"].get<bool>();
    spec.seed = s["seed"].get<uint64_t>();
    spec.llama3_rope = divided;
    if (scaling != "none") {
      spec.rope_scaling = scaling;
      spec.rope_scaling_factor = entry["factor"].get<float>();
    }
    spec.rope_original_ctx = entry["original_ctx"].get<int32_t>();
    spec.rope_attn_factor = entry["attn_factor"].get<float>();
    const std::string path = testing::temp_dir() + "/rope-scaling-" + std::to_string(seen.size()) + ".gguf";
    ASSERT_TRUE(make_synthetic_model(spec, path).ok());
    auto backend = make_cpu_backend(1);
    auto model = Model::load(path, *backend);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    EXPECT_EQ((*model)->weights().rope_freqs.empty(), !divided);
    const ForwardResult r = testing::all_logits(**model, tokens);
    const auto want = entry["logits"].get<std::vector<std::vector<float>>>();
    ASSERT_EQ(want.size(), rows.size());
    float worst = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      ASSERT_EQ(static_cast<int32_t>(want[i].size()), r.n_vocab);
      for (int32_t v = 0; v < r.n_vocab; ++v) worst = std::max(worst, std::fabs(r.row(rows[i])[v] - want[i][v]));
    }
    EXPECT_LT(worst, 2e-5f) << "largest logit difference from llama.cpp";
    std::printf("rope_freqs %s, scaling %s by %s: largest logit difference from llama.cpp %.2g\n",
                divided ? "yes" : "no", scaling.c_str(), entry["factor"].dump().c_str(), worst);
    seen.emplace_back(r.row(tokens.size() - 1), r.row(tokens.size() - 1) + r.n_vocab);
  }
  ASSERT_EQ(seen.size(), 5u);
  for (size_t m = 1; m < seen.size(); ++m) {
    float moved = 0;
    for (size_t v = 0; v < seen[0].size(); ++v) moved = std::max(moved, std::fabs(seen[0][v] - seen[m][v]));
    EXPECT_GT(moved, 1e-3f) << "model " << m << ": the scaling should change the last position's logits";
  }
}

}  // namespace
}  // namespace helios
