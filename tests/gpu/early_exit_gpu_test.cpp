// Early exit on the GPU keeps the CPU's results: stories260K with logit-lens exits after layers 3
// and 4, greedy, each policy on both backends. Policies whose output does not hang on a
// confidence (full, fixed depth, self-speculative) give the same tokens; per-token exit gives the
// same tokens and exit layers up to the first token where a confidence lay within float rounding
// of the threshold (the devices sum in different orders), and the test says where that was.
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "helios/backend.h"
#include "helios/generate.h"
#include "helios/model.h"
#include "test_paths.h"

namespace helios {
namespace {

constexpr float kConfidenceRounding = 2e-3f;  // forward logits agree to 1e-3 (cuda_backend_test)

struct PolicyRun {
  std::vector<TokenId> tokens;
  std::vector<int32_t> exit_layers;
  std::vector<float> confidences;
};

PolicyRun run_policy(Backend& backend, const ExitRule& rule) {
  auto m = Model::load(testing::stories260k_path(), backend);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  EXPECT_TRUE((*m)->set_exits({3, 4}, nullptr).ok());
  const auto prompt = (*m)->tokenizer().encode("Once upon a time, Tom had a red ball", true, false);
  GenerateOptions opt;
  opt.max_tokens = 120;
  opt.ignore_eos = true;
  opt.exit = rule;
  auto r = generate(**m, prompt, opt);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {};
  return {r->tokens, r->exit_layers, r->confidences};
}

ExitRule rule(ExitPolicy policy, float threshold, int32_t depth = 0) {
  ExitRule r;
  r.policy = policy;
  r.threshold = threshold;
  r.depth = depth;
  return r;
}

TEST(EarlyExitGpu, PoliciesKeepTheirCpuResults) {
  HELIOS_REQUIRE_GPU();
  if (!std::filesystem::exists(testing::stories260k_path())) {
    GTEST_SKIP() << "stories260K is not in " << testing::models_dir() << " (scripts/setup.sh makes it)";
  }
  auto cpu = make_cpu_backend(1);
  auto gpu = make_backend("cuda", 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();

  for (const ExitRule& r : {rule(ExitPolicy::kFull, 1.0f), rule(ExitPolicy::kFixedDepth, 0.9f, 3),
                            rule(ExitPolicy::kSelfSpeculative, 0.0f, 3)}) {
    const PolicyRun a = run_policy(*cpu, r), b = run_policy(**gpu, r);
    ASSERT_FALSE(a.tokens.empty());
    EXPECT_EQ(b.tokens, a.tokens) << "policy " << static_cast<int>(r.policy);
    EXPECT_EQ(b.exit_layers, a.exit_layers) << "policy " << static_cast<int>(r.policy);
  }

  for (float threshold : {0.5f, 0.9f}) {
    const ExitRule r = rule(ExitPolicy::kPerToken, threshold);
    const PolicyRun a = run_policy(*cpu, r), b = run_policy(**gpu, r);
    ASSERT_EQ(a.tokens.size(), b.tokens.size());
    size_t i = 0;
    while (i < a.tokens.size() && a.tokens[i] == b.tokens[i] && a.exit_layers[i] == b.exit_layers[i]) ++i;
    int early = 0;
    for (int32_t layer : a.exit_layers) early += layer < 5;
    EXPECT_GT(early, 0) << "threshold " << threshold << ": no token left early on the CPU, nothing was tested";
    if (i == a.tokens.size()) continue;
    // The device that left earlier was sure enough there; the other one fell short by rounding only.
    ASSERT_NE(a.exit_layers[i], b.exit_layers[i])
        << "threshold " << threshold << ": token " << i << " left at layer " << a.exit_layers[i]
        << " on both devices but is " << a.tokens[i] << " on the CPU and " << b.tokens[i] << " on the GPU";
    const float sure = a.exit_layers[i] < b.exit_layers[i] ? a.confidences[i] : b.confidences[i];
    EXPECT_LT(sure - threshold, kConfidenceRounding)
        << "threshold " << threshold << ": token " << i << " left after layer " << a.exit_layers[i] << " on the CPU and "
        << b.exit_layers[i] << " on the GPU with confidence " << sure;
    std::printf("threshold %.2f: the same tokens and exits for the first %zu of %zu tokens (then a confidence "
                "%.5f at the threshold)\n",
                threshold, i, a.tokens.size(), sure);
  }
}

}  // namespace
}  // namespace helios
