// Qwen2.5's long-context recipe, YaRN by 4 over an original context of 32768, on a real model
// against llama.cpp (tests/golden/data/qwen2_yarn.json, scripts/make_rope_goldens.py --qwen). No
// fetchable file carries the keys, so the test writes a copy of Qwen2.5-Coder-0.5B-Instruct with
// them, as llama.cpp's converter writes them for a model whose config asks for YaRN; llama.cpp
// read the same keys as metadata overrides. Tolerances as qwen2_golden_test.cpp's (Q4_K_M weights,
// llama.cpp's 8-bit activation rounding, sums in another order).
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "golden/golden_util.h"
#include "gguf_copy.h"

namespace helios {
namespace {

constexpr float kDecisiveMargin = 1.0f;
constexpr float kLogitTolerance = 1.5f;
constexpr double kPerplexityTolerance = 0.005;

TEST(QwenYarn, LogitsAndPerplexityMatchLlamaCpp) {
  const std::string path = testing::models_dir() + "/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: run scripts/fetch_model.sh qwen2.5-coder-0.5b";
  const nlohmann::json g = testing::load_golden("qwen2_yarn.json");
  ASSERT_FALSE(g.is_null());
  const std::string scaled = testing::temp_dir() + "/qwen2-yarn.gguf";
  testing::copy_gguf_with(path, scaled, [&](GgufWriter& w) {
    for (const auto& [key, value] : g["keys"].items()) {
      if (value.is_string()) w.set_string(key, value.get<std::string>());
      else if (value.is_number_integer()) w.set_uint32(key, value.get<uint32_t>());
      else w.set_float32(key, value.get<float>());
    }
  });
  auto backend = make_cpu_backend(0);
  auto model = Model::load(scaled, *backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->config().rope_yarn_ext_factor, 1.0f);

  const auto tokens = testing::ids(g["ids"]);
  const ForwardResult r = testing::all_logits(**model, tokens);
  ASSERT_EQ(g["top5"].size(), tokens.size());
  testing::TopFiveCounts n;
  testing::check_top5(r, g["top5"], kLogitTolerance, kDecisiveMargin, n, "the perplexity text");
  const double ppl = testing::perplexity(r, tokens);
  const double expected = g["perplexity"], unscaled = g["perplexity_unscaled"];
  std::printf("qwen2.5-coder-0.5b with YaRN by 4: perplexity %.4f (llama.cpp %.4f, %+.3f %%; unscaled %.4f), "
              "largest top-5 logit difference %.3f, top-1 equal at %d/%d positions (%d decisive)\n",
              ppl, expected, 100.0 * (ppl - expected) / expected, unscaled, n.worst, n.n_top1, n.n_positions,
              n.n_decisive);
  EXPECT_NEAR(ppl, expected, kPerplexityTolerance * expected);
  // The golden can tell the scaling from its absence.
  EXPECT_GT(std::fabs(expected - unscaled), 4 * kPerplexityTolerance * expected);
}

}  // namespace
}  // namespace helios
