// configs/default.yaml must state exactly the struct defaults, so the documentation and the code
// cannot drift apart; a config that names only its models gets those same defaults.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "test_paths.h"

namespace helios::testing {
namespace {

HeliosConfig defaults_with_model(const std::string& name, const std::string& path) {
  HeliosConfig config;
  config.models.push_back(model_entry(name, path));
  return config;
}

TEST(ConfigDefaults, DefaultYamlEqualsStructDefaults) {
  StatusOr<HeliosConfig> loaded = load_config(source_dir() + "/configs/default.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  // The one model resolves against configs/, i.e. to the repository's models cache.
  HeliosConfig expected = defaults_with_model("smollm2-135m", default_model_path());
  // The one key the file sets to other than its default: the OpenAI-compatible HTTP API is off
  // when the key is absent (several servers on one machine, the tests) and on in the quick start.
  EXPECT_EQ(ServerConfig{}.http_listen, "");
  expected.server.http_listen = "127.0.0.1:8000";
  expect_config_eq(*loaded, expected);
}

TEST(ConfigDefaults, OnlyModelsGivesStructDefaults) {
  StatusOr<HeliosConfig> parsed = parse_config(with_model(""), "cfg.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  expect_config_eq(*parsed, defaults_with_model("m", "/m.gguf"));
}

TEST(ConfigDefaults, EmptySectionsGiveStructDefaults) {
  StatusOr<HeliosConfig> parsed =
      parse_config(with_model("server:\nengine:\nlimits: {}\nlogging:\n"), "cfg.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  expect_config_eq(*parsed, defaults_with_model("m", "/m.gguf"));
}

TEST(ConfigDefaults, CpuDevYamlLoads) {
  StatusOr<HeliosConfig> loaded = load_config(source_dir() + "/configs/cpu-dev.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->server.listen, "127.0.0.1:50051");
  EXPECT_EQ(loaded->engine.backend, "cpu");
  EXPECT_EQ(loaded->engine.threads, 2);
  EXPECT_EQ(loaded->engine.kv_cache_bytes, 256LL << 20);
  EXPECT_EQ(loaded->engine.kv_cache_fraction, 0.0);
  ASSERT_EQ(loaded->models.size(), 1u);
  EXPECT_EQ(loaded->models[0].path, default_model_path());
}

TEST(ConfigDefaults, EarlyExitCpuYamlLoads) {
  StatusOr<HeliosConfig> loaded = load_config(source_dir() + "/configs/early-exit-cpu.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  ASSERT_EQ(loaded->models.size(), 1u);
  EXPECT_EQ(loaded->models[0].path, default_model_path());
  const EarlyExitConfig& ee = loaded->models[0].early_exit;
  EXPECT_EQ(ee.default_rule.policy, ExitPolicy::kPerToken);
  EXPECT_EQ(ee.default_rule.measure, ConfidenceMeasure::kTop1Prob);
  EXPECT_FLOAT_EQ(ee.default_rule.threshold, 0.9f);
  EXPECT_EQ(ee.exits.every, 4);
  EXPECT_EQ(ee.exits.min_layer, 8);
  EXPECT_EQ(ee.heads_path, "");
  EXPECT_EQ(ee.load_layers, 0);
}

}  // namespace
}  // namespace helios::testing
