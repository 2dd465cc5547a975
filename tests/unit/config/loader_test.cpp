// load_config, relative model paths, and a full config read back field by field.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "config_test_util.h"
#include "test_paths.h"

namespace helios::testing {
namespace {

std::string model_path(const std::string& yaml_path, const std::string& file_name) {
  StatusOr<HeliosConfig> parsed =
      parse_config("models:\n  - name: m\n    path: " + yaml_path + "\n", file_name);
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
  return parsed.ok() ? parsed->models[0].path : "";
}

TEST(ConfigPaths, RelativeModelPathsResolveAgainstTheConfigDirectory) {
  EXPECT_EQ(model_path("m.gguf", "/etc/helios/helios.yaml"), "/etc/helios/m.gguf");
  EXPECT_EQ(model_path("models/m.gguf", "/etc/helios/helios.yaml"), "/etc/helios/models/m.gguf");
  EXPECT_EQ(model_path("../models/m.gguf", "/srv/repo/configs/a.yaml"), "/srv/repo/models/m.gguf");
  EXPECT_EQ(model_path("../models/m.gguf", "configs/a.yaml"), "models/m.gguf");
}

TEST(ConfigPaths, AbsoluteModelPathsStay) {
  EXPECT_EQ(model_path("/data/m.gguf", "/etc/helios/helios.yaml"), "/data/m.gguf");
}

TEST(ConfigPaths, ConfigInTheWorkingDirectoryKeepsPathsRelative) {
  EXPECT_EQ(model_path("models/m.gguf", "cfg.yaml"), "models/m.gguf");
}

TEST(ConfigPaths, TlsFilesResolveToo) {
  StatusOr<HeliosConfig> parsed = parse_config(
      with_model("server:\n  tls: {cert: certs/c.pem, key: /keys/k.pem}\n"), "/etc/h/cfg.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->server.tls_cert_path, "/etc/h/certs/c.pem");
  EXPECT_EQ(parsed->server.tls_key_path, "/keys/k.pem");
}

TEST(ConfigLoad, FromFileResolvesAgainstItsDirectory) {
  const std::string path = temp_dir() + "/load_test.yaml";
  std::ofstream(path) << "models:\n  - name: tiny\n    path: sub/tiny.gguf\n";
  StatusOr<HeliosConfig> loaded = load_config(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->models[0].path, temp_dir() + "/sub/tiny.gguf");
}

TEST(ConfigLoad, ErrorsNameTheFile) {
  const std::string path = temp_dir() + "/bad.yaml";
  std::ofstream(path) << "models:\n  - name: tiny\n    path: t.gguf\nengine:\n  block_size: 3\n";
  StatusOr<HeliosConfig> loaded = load_config(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().message(),
            path + ":5:15: engine.block_size: must be a power of two between 1 and 256, got 3");
}

TEST(ConfigLoad, MissingFileIsNotFound) {
  StatusOr<HeliosConfig> loaded = load_config(temp_dir() + "/no-such.yaml");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(loaded.status().message(), "no-such.yaml"));
  EXPECT_EQ(load_config(temp_dir()).status().code(), StatusCode::kNotFound);
}

// A config with every key away from its default, written as YAML and read back.
HeliosConfig full_config() {
  HeliosConfig c;
  c.server.listen = "[::]:6000";
  c.server.metrics_listen = "";
  c.server.tls_cert_path = "/tls/cert.pem";
  c.server.tls_key_path = "/tls/key.pem";
  c.server.api_keys = {"key-one", "key-two"};
  c.server.drain_timeout_s = 2.5;
  c.server.liveness_timeout_s = 7.5;
  c.models = {model_entry("small", "/models/small.gguf"), model_entry("large", "/models/large.gguf")};
  EarlyExitConfig& ee = c.models[1].early_exit;
  ee.default_rule.policy = ExitPolicy::kSelfSpeculative;
  ee.default_rule.measure = ConfidenceMeasure::kProbe;
  ee.default_rule.threshold = 0.75f;
  ee.default_rule.depth = 6;
  ee.default_rule.draft_tokens = 8;
  ee.exits.layers = {6, 12, 18};
  ee.exits.min_layer = 3;
  ee.heads_path = "/models/large.exits.gguf";
  ee.allow_request_override = false;
  ee.allowed_policies = {ExitPolicy::kSelfSpeculative, ExitPolicy::kFull};
  ee.min_threshold = 0.5f;
  c.engine.backend = "cuda";
  c.engine.threads = 7;
  c.engine.kv_cache_bytes = 3LL << 30;
  c.engine.kv_cache_fraction = 0.0;
  c.engine.block_size = 32;
  c.engine.max_batched_tokens = 2048;
  c.engine.max_seqs = 128;
  c.engine.queue_limit = 10;
  c.engine.preemption = PreemptionMode::kSwap;
  c.engine.swap_space_bytes = 4LL << 30;
  c.engine.prefix_caching = false;
  c.limits.max_tokens = 100;
  c.limits.default_max_tokens = 50;
  c.limits.max_prompt_tokens = 8000;
  c.logging.level = "trace";
  c.logging.format = LogFormat::kJson;
  return c;
}

std::string to_yaml(const HeliosConfig& c) {
  std::ostringstream y;
  y << "server:\n"
    << "  listen: '" << c.server.listen << "'\n"
    << "  metrics_listen: '" << c.server.metrics_listen << "'\n"
    << "  tls:\n    cert: " << c.server.tls_cert_path << "\n    key: " << c.server.tls_key_path
    << "\n  api_keys:\n";
  for (const std::string& key : c.server.api_keys) y << "    - " << key << "\n";
  y << "  drain_timeout_s: " << c.server.drain_timeout_s << "\n";
  y << "  liveness_timeout_s: " << c.server.liveness_timeout_s << "\n";
  y << "models:\n";
  for (const ModelEntryConfig& m : c.models) {
    y << "  - name: " << m.name << "\n    path: " << m.path << "\n";
    const EarlyExitConfig& ee = m.early_exit;
    y << "    early_exit:\n"
      << "      policy: " << exit_policy_name(ee.default_rule.policy) << "\n"
      << "      measure: " << confidence_measure_name(ee.default_rule.measure) << "\n"
      << "      threshold: " << ee.default_rule.threshold << "\n"
      << "      depth: " << ee.default_rule.depth << "\n"
      << "      draft_tokens: " << ee.default_rule.draft_tokens << "\n"
      << "      exits: [";
    for (size_t i = 0; i < ee.exits.layers.size(); ++i) y << (i ? ", " : "") << ee.exits.layers[i];
    y << "]\n"
      << "      exit_every: " << ee.exits.every << "\n"
      << "      exit_min_layer: " << ee.exits.min_layer << "\n"
      << "      heads: '" << ee.heads_path << "'\n"
      << "      load_layers: " << ee.load_layers << "\n"
      << "      allow_request_override: " << (ee.allow_request_override ? "true" : "false") << "\n"
      << "      allowed_policies: [";
    for (size_t i = 0; i < ee.allowed_policies.size(); ++i) {
      y << (i ? ", " : "") << exit_policy_name(ee.allowed_policies[i]);
    }
    y << "]\n      min_threshold: " << ee.min_threshold << "\n";
  }
  y << "engine:\n"
    << "  backend: " << c.engine.backend << "\n"
    << "  threads: " << c.engine.threads << "\n";
  if (c.engine.kv_cache_bytes > 0) {
    y << "  kv_cache: " << c.engine.kv_cache_bytes << "\n";
  } else {
    y << "  kv_cache: " << c.engine.kv_cache_fraction * 100 << "%\n";
  }
  y << "  block_size: " << c.engine.block_size << "\n"
    << "  max_batched_tokens: " << c.engine.max_batched_tokens << "\n"
    << "  max_seqs: " << c.engine.max_seqs << "\n"
    << "  queue_limit: " << c.engine.queue_limit << "\n"
    << "  preemption: " << (c.engine.preemption == PreemptionMode::kSwap ? "swap" : "recompute")
    << "\n  swap_space: " << c.engine.swap_space_bytes << "\n"
    << "  prefix_caching: " << (c.engine.prefix_caching ? "true" : "false") << "\n";
  y << "limits:\n"
    << "  max_tokens: " << c.limits.max_tokens << "\n"
    << "  default_max_tokens: " << c.limits.default_max_tokens << "\n"
    << "  max_prompt_tokens: " << c.limits.max_prompt_tokens << "\n";
  y << "logging:\n"
    << "  level: " << c.logging.level << "\n"
    << "  format: " << (c.logging.format == LogFormat::kJson ? "json" : "text") << "\n";
  return y.str();
}

TEST(ConfigRoundTrip, FullConfigReadsBackEqual) {
  const HeliosConfig expected = full_config();
  StatusOr<HeliosConfig> parsed = parse_config(to_yaml(expected), "/etc/helios/full.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string() << "\n" << to_yaml(expected);
  expect_config_eq(*parsed, expected);
}

TEST(ConfigRoundTrip, PercentageKvCacheReadsBackEqual) {
  HeliosConfig expected = full_config();
  expected.engine.kv_cache_bytes = 0;
  expected.engine.kv_cache_fraction = 0.5;
  StatusOr<HeliosConfig> parsed = parse_config(to_yaml(expected), "full.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  expect_config_eq(*parsed, expected);
}

TEST(ConfigRoundTrip, KvCacheForms) {
  const auto kv = [](const std::string& value) {
    StatusOr<HeliosConfig> parsed =
        parse_config(with_model("engine:\n  kv_cache: " + value + "\n"), "cfg.yaml");
    EXPECT_TRUE(parsed.ok()) << value << ": " << parsed.status().to_string();
    return parsed.ok() ? parsed->engine : EngineConfig{};
  };
  EXPECT_EQ(kv("2GiB").kv_cache_bytes, 2LL << 30);
  EXPECT_EQ(kv("2GiB").kv_cache_fraction, 0.0);
  EXPECT_EQ(kv("'512 MiB'").kv_cache_bytes, 512LL << 20);
  EXPECT_EQ(kv("1073741824").kv_cache_bytes, 1LL << 30);
  EXPECT_EQ(kv("100%").kv_cache_fraction, 1.0);
  EXPECT_EQ(kv("100%").kv_cache_bytes, 0);
  EXPECT_DOUBLE_EQ(kv("12.5%").kv_cache_fraction, 0.125);
}

TEST(ConfigRoundTrip, TensorParallel) {
  StatusOr<HeliosConfig> one = parse_config(with_model(""), "cfg.yaml");
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->engine.tensor_parallel, 1);
  StatusOr<HeliosConfig> two = parse_config(with_model("engine:\n  tensor_parallel: 2\n"), "cfg.yaml");
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ(two->engine.tensor_parallel, 2);
  StatusOr<HeliosConfig> zero = parse_config(with_model("engine:\n  tensor_parallel: 0\n"), "cfg.yaml");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("engine.tensor_parallel"), std::string::npos) << zero.status().message();
}

TEST(ConfigRoundTrip, DeviceSampling) {
  const auto mode = [](const std::string& yaml) {
    StatusOr<HeliosConfig> parsed = parse_config(with_model(yaml), "cfg.yaml");
    EXPECT_TRUE(parsed.ok()) << yaml << ": " << parsed.status().to_string();
    return parsed.ok() ? parsed->engine.device_sampling : std::nullopt;
  };
  EXPECT_EQ(mode("engine:\n  threads: 1\n"), std::nullopt);  // auto: the backend decides
  EXPECT_EQ(mode("engine:\n  device_sampling: auto\n"), std::nullopt);
  EXPECT_EQ(mode("engine:\n  device_sampling: on\n"), true);
  EXPECT_EQ(mode("engine:\n  device_sampling: off\n"), false);
  StatusOr<HeliosConfig> bad = parse_config(with_model("engine:\n  device_sampling: gpu\n"), "cfg.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("engine.device_sampling"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("auto"), std::string::npos) << bad.status().message();
}

TEST(ConfigRoundTrip, CudaGraphs) {
  StatusOr<HeliosConfig> plain = parse_config(with_model("engine:\n  threads: 1\n"), "cfg.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_TRUE(plain->engine.cuda_graphs);  // on unless turned off
  StatusOr<HeliosConfig> off = parse_config(with_model("engine:\n  cuda_graphs: false\n"), "cfg.yaml");
  ASSERT_TRUE(off.ok()) << off.status().to_string();
  EXPECT_FALSE(off->engine.cuda_graphs);
  StatusOr<HeliosConfig> bad = parse_config(with_model("engine:\n  cuda_graphs: sometimes\n"), "cfg.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("engine.cuda_graphs"), std::string::npos) << bad.status().message();
}

TEST(ConfigRoundTrip, KvCacheTypes) {
  const auto type = [](const std::string& yaml) {
    StatusOr<HeliosConfig> parsed = parse_config(with_model(yaml), "cfg.yaml");
    EXPECT_TRUE(parsed.ok()) << yaml << ": " << parsed.status().to_string();
    return parsed.ok() ? parsed->engine.kv_cache_type : std::nullopt;
  };
  EXPECT_EQ(type("engine:\n  threads: 1\n"), std::nullopt);  // auto
  EXPECT_EQ(type("engine:\n  kv_cache_type: auto\n"), std::nullopt);
  EXPECT_EQ(type("engine:\n  kv_cache_type: f16\n"), kernels::KvType::kF16);
  EXPECT_EQ(type("engine:\n  kv_cache_type: f32\n"), kernels::KvType::kF32);
  StatusOr<HeliosConfig> bad = parse_config(with_model("engine:\n  kv_cache_type: q8\n"), "cfg.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("engine.kv_cache_type"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("f16"), std::string::npos) << bad.status().message();
}

TEST(ConfigRoundTrip, RopeScaling) {
  const auto scaling = [](const std::string& entry) {
    StatusOr<HeliosConfig> parsed = parse_config("models:\n  - name: m\n    path: /m.gguf\n" + entry, "cfg.yaml");
    EXPECT_TRUE(parsed.ok()) << entry << ": " << parsed.status().to_string();
    return parsed.ok() ? parsed->models[0].rope_scaling : std::nullopt;
  };
  EXPECT_EQ(scaling(""), std::nullopt);  // the file's stands
  const auto yarn = scaling("    rope_scaling: {type: yarn, factor: 4, original_context: 32768}\n");
  ASSERT_TRUE(yarn.has_value());
  EXPECT_EQ(yarn->type, "yarn");
  EXPECT_EQ(yarn->factor, 4.0);
  EXPECT_EQ(yarn->original_context, 32768);
  const auto linear = scaling("    rope_scaling:\n      type: linear\n      factor: 2.5\n");
  ASSERT_TRUE(linear.has_value());
  EXPECT_EQ(linear->type, "linear");
  EXPECT_EQ(linear->factor, 2.5);
  EXPECT_EQ(linear->original_context, 0);
  const auto none = scaling("    rope_scaling: {type: none}\n");
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->type, "none");

  const auto error = [](const std::string& entry) { return config_error("models:\n  - name: m\n    path: /m.gguf\n" + entry); };
  EXPECT_TRUE(contains(error("    rope_scaling: {type: longrope, factor: 4}\n"), "models[0].rope_scaling.type"));
  EXPECT_TRUE(contains(error("    rope_scaling: {factor: 4}\n"), "models[0].rope_scaling: needs a type"));
  EXPECT_TRUE(contains(error("    rope_scaling: {type: yarn, factor: 0.5}\n"),
                       "models[0].rope_scaling.factor: must be >= 1"));
  EXPECT_TRUE(contains(error("    rope_scaling: {type: yarn, factor: 4, original_context: -1}\n"),
                       "models[0].rope_scaling.original_context: must be >= 0"));
  EXPECT_TRUE(contains(error("    rope_scaling: {type: linear, factor: 4, original_context: 4096}\n"),
                       "original_context: is YaRN's"));
  EXPECT_TRUE(contains(error("    rope_scaling: {type: yarn, factor: 4, context: 4096}\n"),
                       "models[0].rope_scaling.context: unknown key"));
}

}  // namespace
}  // namespace helios::testing
