// Helpers for the config tests: parse a snippet, compare whole configs field by field.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "helios/config.h"

namespace helios::testing {

// A snippet with one model prepended, so tests need only write the section under test.
inline std::string with_model(const std::string& yaml) {
  return "models:\n  - name: m\n    path: /m.gguf\n" + yaml;
}

// A model entry with early exit at its defaults.
inline ModelEntryConfig model_entry(const std::string& name, const std::string& path) {
  ModelEntryConfig entry;
  entry.name = name;
  entry.path = path;
  return entry;
}

// The error parse_config gives for `yaml` (file name "cfg.yaml"); "" if it parsed.
inline std::string config_error(const std::string& yaml) {
  StatusOr<HeliosConfig> config = parse_config(yaml, "cfg.yaml");
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  return config.status().message();
}

// Assertions that show the whole text when they fail.
inline ::testing::AssertionResult starts_with(const std::string& text, const std::string& prefix) {
  if (text.rfind(prefix, 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not start with '" << prefix << "'";
}
inline ::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

inline void expect_early_exit_eq(const EarlyExitConfig& a, const EarlyExitConfig& b,
                                 const std::string& where) {
  EXPECT_EQ(a.default_rule.policy, b.default_rule.policy) << where;
  EXPECT_EQ(a.default_rule.measure, b.default_rule.measure) << where;
  EXPECT_FLOAT_EQ(a.default_rule.threshold, b.default_rule.threshold) << where;
  EXPECT_EQ(a.default_rule.depth, b.default_rule.depth) << where;
  EXPECT_EQ(a.default_rule.draft_tokens, b.default_rule.draft_tokens) << where;
  EXPECT_EQ(a.default_rule.calibrated_thresholds, b.default_rule.calibrated_thresholds) << where;
  EXPECT_EQ(a.exits.layers, b.exits.layers) << where;
  EXPECT_EQ(a.exits.every, b.exits.every) << where;
  EXPECT_EQ(a.exits.min_layer, b.exits.min_layer) << where;
  EXPECT_EQ(a.heads_path, b.heads_path) << where;
  EXPECT_EQ(a.load_layers, b.load_layers) << where;
  EXPECT_EQ(a.allow_request_override, b.allow_request_override) << where;
  EXPECT_EQ(a.allowed_policies, b.allowed_policies) << where;
  EXPECT_FLOAT_EQ(a.min_threshold, b.min_threshold) << where;
}

inline void expect_config_eq(const HeliosConfig& a, const HeliosConfig& b) {
  EXPECT_EQ(a.server.listen, b.server.listen);
  EXPECT_EQ(a.server.metrics_listen, b.server.metrics_listen);
  EXPECT_EQ(a.server.http_listen, b.server.http_listen);
  EXPECT_EQ(a.server.http_threads, b.server.http_threads);
  EXPECT_EQ(a.server.tls_cert_path, b.server.tls_cert_path);
  EXPECT_EQ(a.server.tls_key_path, b.server.tls_key_path);
  EXPECT_EQ(a.server.api_keys, b.server.api_keys);
  EXPECT_DOUBLE_EQ(a.server.drain_timeout_s, b.server.drain_timeout_s);
  EXPECT_DOUBLE_EQ(a.server.liveness_timeout_s, b.server.liveness_timeout_s);
  ASSERT_EQ(a.models.size(), b.models.size());
  for (size_t i = 0; i < a.models.size(); ++i) {
    EXPECT_EQ(a.models[i].name, b.models[i].name) << "models[" << i << "]";
    EXPECT_EQ(a.models[i].path, b.models[i].path) << "models[" << i << "]";
    expect_early_exit_eq(a.models[i].early_exit, b.models[i].early_exit,
                         "models[" + std::to_string(i) + "].early_exit");
  }
  EXPECT_EQ(a.engine.backend, b.engine.backend);
  EXPECT_EQ(a.engine.threads, b.engine.threads);
  EXPECT_EQ(a.engine.kv_cache_bytes, b.engine.kv_cache_bytes);
  EXPECT_DOUBLE_EQ(a.engine.kv_cache_fraction, b.engine.kv_cache_fraction);
  EXPECT_EQ(a.engine.block_size, b.engine.block_size);
  EXPECT_EQ(a.engine.max_batched_tokens, b.engine.max_batched_tokens);
  EXPECT_EQ(a.engine.max_seqs, b.engine.max_seqs);
  EXPECT_EQ(a.engine.queue_limit, b.engine.queue_limit);
  EXPECT_EQ(a.engine.preemption, b.engine.preemption);
  EXPECT_EQ(a.engine.swap_space_bytes, b.engine.swap_space_bytes);
  EXPECT_EQ(a.engine.prefix_caching, b.engine.prefix_caching);
  EXPECT_EQ(a.limits.max_tokens, b.limits.max_tokens);
  EXPECT_EQ(a.limits.default_max_tokens, b.limits.default_max_tokens);
  EXPECT_EQ(a.limits.max_prompt_tokens, b.limits.max_prompt_tokens);
  EXPECT_EQ(a.limits.max_n, b.limits.max_n);
  EXPECT_EQ(a.logging.level, b.logging.level);
  EXPECT_EQ(a.logging.format, b.logging.format);
}

}  // namespace helios::testing
