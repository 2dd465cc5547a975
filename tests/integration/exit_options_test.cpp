// A request's ExitOptions merged onto the model's configured default: overrides, the server's
// limits, depth resolution and the errors that name the field. stories260K (5 layers) with exit
// points 1..4.
#include <gtest/gtest.h>

#include "helios/model_tools.h"
#include "server/exit_options.h"
#include "server/request_convert.h"
#include "test_paths.h"

namespace helios {
namespace {

class ExitOptionsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = testing::test_data_dir() + "/stories260K/";
    const std::string path = testing::temp_dir() + "/stories260K-exit-options.gguf";
    ASSERT_TRUE(convert_llama2c(dir + "stories260K.bin", dir + "tok512.bin", path).ok());
    auto backend = make_backend("cpu", 1);
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();
    backend_ = std::move(*backend).release();
    auto model = Model::load(path, *backend_);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(*model).release();
    ASSERT_TRUE(model_->set_exits({1, 2, 3, 4}, nullptr).ok());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
  }

  // The merged rule, or the error's message through *error.
  ExitRule merge(const v1::ExitOptions& options, std::string* error = nullptr) {
    auto rule = server::exit_rule_for_request(options, config_, *model_);
    if (error) *error = rule.ok() ? "" : rule.status().message();
    if (!rule.ok()) {
      EXPECT_EQ(rule.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(error, nullptr) << "unexpected error: " << rule.status().message();
      return {};
    }
    return *rule;
  }
  std::string error_of(const v1::ExitOptions& options) {
    std::string error;
    merge(options, &error);
    return error;
  }

  static Backend* backend_;
  static Model* model_;
  EarlyExitConfig config_;  // policy full, threshold 0.9, overrides allowed
};

Backend* ExitOptionsTest::backend_ = nullptr;
Model* ExitOptionsTest::model_ = nullptr;

v1::ExitOptions options(const std::string& policy, float threshold = 0, int32_t depth = 0) {
  v1::ExitOptions o;
  o.set_policy(policy);
  o.set_threshold(threshold);
  o.set_depth(depth);
  return o;
}

TEST_F(ExitOptionsTest, UnsetOptionsGiveTheDefault) {
  const ExitRule rule = merge(v1::ExitOptions());
  EXPECT_EQ(rule.policy, ExitPolicy::kFull);
  EXPECT_FLOAT_EQ(rule.threshold, 0.9f);
  EXPECT_EQ(rule.draft_tokens, 4);
}

TEST_F(ExitOptionsTest, OverridesApply) {
  v1::ExitOptions o = options("per-token", 0.5f);
  o.set_measure("entropy");
  const ExitRule rule = merge(o);
  EXPECT_EQ(rule.policy, ExitPolicy::kPerToken);
  EXPECT_EQ(rule.measure, ConfidenceMeasure::kEntropy);
  EXPECT_FLOAT_EQ(rule.threshold, 0.5f);
  // A threshold of 0 counts only with threshold_set.
  EXPECT_FLOAT_EQ(merge(options("per-token", 0)).threshold, 0.9f);
  o = options("per-token", 0);
  o.set_threshold_set(true);
  EXPECT_FLOAT_EQ(merge(o).threshold, 0.0f);
  o = options("self-speculative");
  o.set_draft_tokens(8);
  EXPECT_EQ(merge(o).draft_tokens, 8);
  o.set_draft_vocab(4096);
  EXPECT_EQ(merge(o).draft_vocab, 4096);
  config_.default_rule.draft_vocab = 16384;  // 0 asks for the model's default
  o.set_draft_vocab(0);
  EXPECT_EQ(merge(o).draft_vocab, 16384);
}

TEST_F(ExitOptionsTest, DepthZeroResolvesPerPolicy) {
  EXPECT_EQ(merge(options("fixed-depth", 0, 2)).depth, 2);
  EXPECT_EQ(merge(options("fixed-depth", 0, 5)).depth, 5);  // the loaded depth
  EXPECT_EQ(merge(options("fixed-depth")).depth, 5);        // 0: the loaded depth
  EXPECT_EQ(merge(options("self-speculative")).depth, 1);   // the first exit point
  config_.default_rule.depth = 3;                           // the model's default depth
  EXPECT_EQ(merge(options("fixed-depth")).depth, 3);
}

TEST_F(ExitOptionsTest, BadValuesNameTheField) {
  EXPECT_EQ(error_of(options("turbo")),
            "exit.policy: unknown policy 'turbo'; valid: full, per-token, batch-sync, fixed-depth, "
            "self-speculative");
  v1::ExitOptions o;
  o.set_measure("top2");
  EXPECT_EQ(error_of(o), "exit.measure: unknown measure 'top2'; valid: top1, margin, entropy, probe, "
                         "saturation, agreement");
  EXPECT_EQ(error_of(options("per-token", 1.5f)),
            "exit.threshold: must be in [0, 1] (1 = never early), got 1.5");
  EXPECT_EQ(error_of(options("fixed-depth", 0, -1)),
            "exit.depth: must be >= 0 (0 = the model's default), got -1");
  EXPECT_EQ(error_of(options("fixed-depth", 0, 7)),
            "exit.depth: fixed-depth needs an exit point or the loaded depth, got 7; valid: 1, 2, 3, 4 or 5");
  EXPECT_EQ(error_of(options("self-speculative", 0, 5)),
            "exit.depth: self-speculative drafts at an exit point, got 5; valid: 1, 2, 3, 4");
  o = options("self-speculative");
  o.set_draft_tokens(17);
  EXPECT_EQ(error_of(o), "exit.draft_tokens: must be in 1..16 (0 = the model's default), got 17");
  o = options("self-speculative");
  o.set_draft_vocab(100);
  EXPECT_EQ(error_of(o), "exit.draft_vocab: must be a multiple of 64 (0 = the model's default), got 100");
  // What only the model can check: probes need calibrated heads.
  o = options("per-token");
  o.set_measure("probe");
  EXPECT_TRUE(error_of(o).rfind("exit: this model cannot run policy per-token with measure probe (depth 0): ",
                                0) == 0)
      << error_of(o);
}

TEST_F(ExitOptionsTest, ServerLimits) {
  config_.allowed_policies = {ExitPolicy::kFull, ExitPolicy::kPerToken};
  config_.min_threshold = 0.5f;
  EXPECT_EQ(error_of(options("batch-sync")),
            "exit.policy: 'batch-sync' is not allowed on this server; allowed: full, per-token");
  EXPECT_EQ(error_of(options("per-token", 0.2f)),
            "exit.threshold: 0.2 is below this server's minimum 0.5");
  EXPECT_EQ(merge(options("per-token", 0.6f)).policy, ExitPolicy::kPerToken);

  config_.allow_request_override = false;
  EXPECT_TRUE(error_of(options("per-token")).rfind(
                  "exit.policy: this server does not let requests change this model's exit rule", 0) == 0);
  // Options that restate the default are not a change.
  EXPECT_EQ(merge(options("full", 0.9f)).policy, ExitPolicy::kFull);
}

TEST_F(ExitOptionsTest, PoliciesThatNeedExitPointsOnAModelWithout) {
  ASSERT_TRUE(model_->set_exits({}, nullptr).ok());
  const std::string error = error_of(options("per-token"));
  ASSERT_TRUE(model_->set_exits({1, 2, 3, 4}, nullptr).ok());
  EXPECT_TRUE(error.rfind("exit.policy: 'per-token' needs exit points, and this model has none", 0) == 0)
      << error;
}

// request_convert hands the merged rule to the engine's request.
TEST_F(ExitOptionsTest, GenerationRequestCarriesTheRule) {
  server::RequestLimits limits{LimitsConfig{}, 512, config_};
  v1::GenerateRequest request;
  request.set_text("Once upon a time");
  *request.mutable_exit() = options("fixed-depth", 0, 2);
  auto converted = server::to_generation_request(request, *model_, limits);
  ASSERT_TRUE(converted.ok()) << converted.status().to_string();
  EXPECT_EQ(converted->exit.policy, ExitPolicy::kFixedDepth);
  EXPECT_EQ(converted->exit.depth, 2);
  *request.mutable_exit() = options("nope");
  converted = server::to_generation_request(request, *model_, limits);
  ASSERT_FALSE(converted.ok());
  EXPECT_TRUE(converted.status().message().rfind("exit.policy: ", 0) == 0);
}

}  // namespace
}  // namespace helios
