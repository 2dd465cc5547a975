// setup_model on stories260K (5 layers): the loaded prefix, exit points resolved and dropped past
// it, heads, the default rule, and errors named as the caller names its settings.
#include <gtest/gtest.h>

#include "helios/gguf.h"
#include "helios/model_setup.h"
#include "unit/model_setup/limited_backend.h"
#include "test_paths.h"

namespace helios {
namespace {

// The server's names for its settings.
ModelSetupOptions config_options() {
  ModelSetupOptions o;
  o.path = testing::stories260k_path();
  o.names.load_layers = "early_exit.load_layers";
  o.names.exits = "early_exit.exits";
  o.names.heads = "early_exit.heads";
  o.names.rule_prefix = "early_exit.";
  o.names.exits_hint = "set exits";
  return o;
}

std::string error_of(const ModelSetupOptions& o) {
  auto backend = make_cpu_backend(1);
  auto setup = setup_model(*backend, o);
  EXPECT_FALSE(setup.ok());
  return setup.ok() ? "" : setup.status().message();
}

TEST(ModelSetup, DropsExitPointsAtOrPastTheLoadedDepthWithAWarning) {
  auto backend = make_cpu_backend(1);
  ModelSetupOptions o = config_options();
  o.load_layers = 3;
  o.exits.every = 1;
  auto setup = setup_model(*backend, o);
  ASSERT_TRUE(setup.ok()) << setup.status().to_string();
  EXPECT_EQ(setup->model->n_layers_loaded(), 3);
  EXPECT_EQ(setup->model->exit_layers(), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(setup->dropped_exits, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(setup->warning, "exit points 3, 4 are at or past the loaded depth (3 of 5 layers); dropped");
  EXPECT_EQ(setup->default_rule.policy, ExitPolicy::kFull);
}

TEST(ModelSetup, AllLayersAndNoExitsByDefault) {
  auto backend = make_cpu_backend(1);
  auto setup = setup_model(*backend, config_options());
  ASSERT_TRUE(setup.ok()) << setup.status().to_string();
  EXPECT_EQ(setup->model->n_layers_loaded(), 5);
  EXPECT_TRUE(setup->model->exit_layers().empty());
  EXPECT_TRUE(setup->warning.empty());
}

TEST(ModelSetup, DefaultExitsAreEveryFourthLayerWithoutHeads) {
  auto backend = make_cpu_backend(1);
  ModelSetupOptions o = config_options();
  o.default_exits = true;
  auto setup = setup_model(*backend, o);
  ASSERT_TRUE(setup.ok()) << setup.status().to_string();
  EXPECT_EQ(setup->model->exit_layers(), (std::vector<int32_t>{4}));
  o.load_layers = 3;  // nobody asked for layer 4: no warning
  setup = setup_model(*backend, o);
  ASSERT_TRUE(setup.ok()) << setup.status().to_string();
  EXPECT_TRUE(setup->model->exit_layers().empty());
  EXPECT_EQ(setup->dropped_exits, (std::vector<int32_t>{4}));
  EXPECT_TRUE(setup->warning.empty());
  o.load_layers = 0;
  o.exits.layers = {2};  // given ones win
  setup = setup_model(*backend, o);
  ASSERT_TRUE(setup.ok()) << setup.status().to_string();
  EXPECT_EQ(setup->model->exit_layers(), (std::vector<int32_t>{2}));
}

TEST(ModelSetup, DefaultRuleIsResolvedAgainstTheLoadedModel) {
  auto backend = make_cpu_backend(1);
  ModelSetupOptions o = config_options();
  o.load_layers = 3;
  o.exits.layers = {1, 2};
  ExitRule rule;
  rule.policy = ExitPolicy::kFixedDepth;
  o.default_rule = rule;
  auto setup = setup_model(*backend, o);
  ASSERT_TRUE(setup.ok()) << setup.status().to_string();
  EXPECT_EQ(setup->default_rule.depth, 3);  // 0: the loaded depth

  rule.policy = ExitPolicy::kSelfSpeculative;
  o.load_layers = 0;
  o.default_rule = rule;
  setup = setup_model(*backend, o);
  ASSERT_TRUE(setup.ok()) << setup.status().to_string();
  EXPECT_EQ(setup->default_rule.depth, 1);  // 0: the first exit point
}

TEST(ModelSetup, ErrorsNameTheSettings) {
  ModelSetupOptions o = config_options();
  o.load_layers = 9;
  EXPECT_EQ(error_of(o), "early_exit.load_layers: 9 is more than the model's 5 layers; use 1..5, or 0 for all");

  o = config_options();
  o.exits.layers = {2, 7};
  EXPECT_EQ(error_of(o).rfind("early_exit.exits: ", 0), 0u) << error_of(o);
  o.names.exits = "";  // the command line: the message alone
  EXPECT_EQ(error_of(o).find("early_exit"), std::string::npos) << error_of(o);

  o = config_options();
  o.heads_path = testing::temp_dir() + "/no-such.exits.gguf";
  EXPECT_EQ(error_of(o).rfind("early_exit.heads: ", 0), 0u) << error_of(o);

  o = config_options();
  ExitRule rule;
  rule.policy = ExitPolicy::kPerToken;
  o.default_rule = rule;
  EXPECT_EQ(error_of(o), "early_exit.policy: 'per-token' needs exit points, and this model has none below its "
                         "loaded depth (5); set exits");
  o.exits.layers = {2};
  rule.policy = ExitPolicy::kFixedDepth;
  rule.depth = 3;
  o.default_rule = rule;
  EXPECT_EQ(error_of(o), "early_exit.depth: fixed-depth needs an exit point or the loaded depth, got 3; valid: 2 or 5");
}

// A model whose attention the backend cannot run is refused at load, with the backend's reason,
// not at its first forward pass.
TEST(ModelSetup, AttentionTheBackendCannotRunRefusesTheModel) {
  auto file = GgufFile::open(testing::stories260k_path());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto config = model_config_from_gguf(**file);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  const int32_t group = config->n_head / config->n_head_kv;  // stories260K: 8 query heads over 4
  ASSERT_GT(group, 1);
  testing::LimitedBackend fits(size_t{1} << 30), narrow(size_t{1} << 30);
  fits.limit_query_heads_per_kv_head(group);
  narrow.limit_query_heads_per_kv_head(group - 1);
  auto loaded = setup_model(fits, config_options());
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  auto refused = setup_model(narrow, config_options());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("query heads per KV head"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(narrow.used_bytes(), 0u) << "refused before any weight was uploaded";
}

TEST(ModelSetup, OutOfMemoryIsAnError) {
  testing::LimitedBackend backend(64 << 10);  // less than the weights
  ModelSetupOptions o = config_options();
  auto setup = setup_model(backend, o);
  ASSERT_FALSE(setup.ok());
  EXPECT_EQ(setup.status().code(), StatusCode::kResourceExhausted) << setup.status().to_string();
  EXPECT_GT(backend.n_refused(), 0);
  EXPECT_EQ(backend.used_bytes(), 0u) << "what was allocated before the failure is freed";
}

}  // namespace
}  // namespace helios
