// models[].early_exit: a full section read back, and each bad key's FILE:LINE:COLUMN error.
// with_early_exit() puts the section's keys from line 5 on, indented 6 spaces (keys at column 7).
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace helios::testing {
namespace {

std::string with_early_exit(const std::string& body) {
  return "models:\n  - name: m\n    path: /m.gguf\n    early_exit:\n" + body;
}

EarlyExitConfig parse_early_exit(const std::string& body, const std::string& file = "cfg.yaml") {
  StatusOr<HeliosConfig> parsed = parse_config(with_early_exit(body), file);
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
  return parsed.ok() ? parsed->models[0].early_exit : EarlyExitConfig{};
}

TEST(EarlyExitConfig, FullSectionReadsBack) {
  const EarlyExitConfig c = parse_early_exit(
      "      policy: per-token\n"
      "      measure: margin\n"
      "      threshold: 0.75\n"
      "      depth: 8\n"
      "      draft_tokens: 6\n"
      "      exit_every: 4\n"
      "      exit_min_layer: 8\n"
      "      heads: exits/m.exits.gguf\n"
      "      load_layers: 24\n"
      "      allow_request_override: false\n"
      "      allowed_policies: [per-token, fixed-depth]\n"
      "      min_threshold: 0.5\n",
      "/etc/helios/cfg.yaml");
  EXPECT_EQ(c.default_rule.policy, ExitPolicy::kPerToken);
  EXPECT_EQ(c.default_rule.measure, ConfidenceMeasure::kMargin);
  EXPECT_FLOAT_EQ(c.default_rule.threshold, 0.75f);
  EXPECT_EQ(c.default_rule.depth, 8);
  EXPECT_EQ(c.default_rule.draft_tokens, 6);
  EXPECT_TRUE(c.exits.layers.empty());
  EXPECT_EQ(c.exits.every, 4);
  EXPECT_EQ(c.exits.min_layer, 8);
  EXPECT_EQ(c.heads_path, "/etc/helios/exits/m.exits.gguf");  // relative to the config file
  EXPECT_EQ(c.load_layers, 24);
  EXPECT_FALSE(c.allow_request_override);
  EXPECT_EQ(c.allowed_policies, (std::vector<ExitPolicy>{ExitPolicy::kPerToken, ExitPolicy::kFixedDepth}));
  EXPECT_FLOAT_EQ(c.min_threshold, 0.5f);
}

TEST(EarlyExitConfig, ExitListAndEdgeValues) {
  const EarlyExitConfig c = parse_early_exit(
      "      policy: batch-sync\n      exits: [18, 6, 12]\n      threshold: 0\n");
  EXPECT_EQ(c.exits.layers, (std::vector<int32_t>{18, 6, 12}));  // sorted when the model loads
  EXPECT_FLOAT_EQ(c.default_rule.threshold, 0.0f);
  EXPECT_FLOAT_EQ(parse_early_exit("      threshold: 1\n").default_rule.threshold, 1.0f);
  // fixed-depth needs no exit points: it can leave at the loaded depth.
  EXPECT_EQ(parse_early_exit("      policy: fixed-depth\n      load_layers: 12\n").load_layers, 12);
  EXPECT_EQ(parse_early_exit("      policy: self-speculative\n      exits: [4]\n").default_rule.policy,
            ExitPolicy::kSelfSpeculative);
}

TEST(EarlyExitConfig, EmptySectionIsDefaults) {
  expect_early_exit_eq(parse_early_exit(""), EarlyExitConfig{}, "early_exit:");
  expect_early_exit_eq(parse_early_exit("      {}\n"), EarlyExitConfig{}, "early_exit: {}");
}

// ---- one error per key

TEST(EarlyExitConfigErrors, UnknownKey) {
  EXPECT_TRUE(starts_with(config_error(with_early_exit("      polcy: full\n")),
                          "cfg.yaml:5:7: models[0].early_exit.polcy: unknown key; did you mean "
                          "'policy'? Valid 'models[0].early_exit' keys: policy, measure, threshold, calibrated_thresholds, "
                          "depth, draft_tokens, draft_vocab, exits, exit_every, exit_min_layer, heads, load_layers, "
                          "allow_request_override, allowed_policies, min_threshold"));
  EXPECT_EQ(config_error("models:\n  - name: m\n    path: /m.gguf\n    early_exit: per-token\n"),
            "cfg.yaml:4:17: models[0].early_exit: expected a map of keys (policy, measure, threshold, calibrated_thresholds, "
            "depth, draft_tokens, draft_vocab, exits, exit_every, exit_min_layer, heads, load_layers, "
            "allow_request_override, allowed_policies, min_threshold), got 'per-token'");
}

TEST(EarlyExitConfigErrors, PolicyAndMeasureNames) {
  EXPECT_EQ(config_error(with_early_exit("      policy: fast\n")),
            "cfg.yaml:5:15: models[0].early_exit.policy: must be one of full, per-token, batch-sync, "
            "fixed-depth, self-speculative, got 'fast'");
  EXPECT_EQ(config_error(with_early_exit("      policy: per_token\n")),
            "cfg.yaml:5:15: models[0].early_exit.policy: must be one of full, per-token, batch-sync, "
            "fixed-depth, self-speculative, got 'per_token'; did you mean 'per-token'?");
  EXPECT_EQ(config_error(with_early_exit("      measure: top2\n")),
            "cfg.yaml:5:16: models[0].early_exit.measure: must be one of top1, margin, entropy, probe, "
            "saturation, agreement, got 'top2'; did you mean 'top1'?");
}

TEST(EarlyExitConfigErrors, Threshold) {
  const std::string why = " (a token leaves when its confidence >= threshold; 1 = never early), got ";
  EXPECT_EQ(config_error(with_early_exit("      threshold: 1.5\n")),
            "cfg.yaml:5:18: models[0].early_exit.threshold: must be between 0 and 1" + why + "1.5");
  EXPECT_EQ(config_error(with_early_exit("      threshold: -0.1\n")),
            "cfg.yaml:5:18: models[0].early_exit.threshold: must be between 0 and 1" + why + "-0.1");
  EXPECT_EQ(config_error(with_early_exit("      threshold: high\n")),
            "cfg.yaml:5:18: models[0].early_exit.threshold: expected a number, got 'high'");
}

TEST(EarlyExitConfigErrors, DepthAndDraftTokens) {
  EXPECT_TRUE(starts_with(config_error(with_early_exit("      depth: -1\n")),
                          "cfg.yaml:5:14: models[0].early_exit.depth: must be at least 0"));
  EXPECT_EQ(config_error(with_early_exit("      draft_tokens: 0\n")),
            "cfg.yaml:5:21: models[0].early_exit.draft_tokens: must be between 1 and 16, got 0");
  EXPECT_EQ(config_error(with_early_exit("      draft_tokens: 17\n")),
            "cfg.yaml:5:21: models[0].early_exit.draft_tokens: must be between 1 and 16, got 17");
}

TEST(EarlyExitConfigErrors, ExitPoints) {
  EXPECT_EQ(config_error(with_early_exit("      exits: [4, 0]\n")),
            "cfg.yaml:5:18: models[0].early_exit.exits[1]: must be at least 1 (an exit after that many "
            "layers), got 0");
  EXPECT_EQ(config_error(with_early_exit("      exits: [4, six]\n")),
            "cfg.yaml:5:18: models[0].early_exit.exits[1]: expected an integer, got 'six'");
  EXPECT_EQ(config_error(with_early_exit("      exits: 4\n")),
            "cfg.yaml:5:14: models[0].early_exit.exits: expected a list of integers such as [6, 12], "
            "got '4'");
  EXPECT_EQ(config_error(with_early_exit("      exit_every: -2\n")),
            "cfg.yaml:5:19: models[0].early_exit.exit_every: must be at least 0 (0 = use exits), got -2");
  EXPECT_EQ(config_error(with_early_exit("      exit_min_layer: 0\n")),
            "cfg.yaml:5:23: models[0].early_exit.exit_min_layer: must be at least 1, got 0");
  EXPECT_EQ(config_error(with_early_exit("      exits: [4]\n      exit_every: 2\n")),
            "cfg.yaml:6:19: models[0].early_exit.exit_every: is set together with exits; give either "
            "exits (a list of layers) or exit_every (every k-th layer), not both");
}

TEST(EarlyExitConfigErrors, LoadLayersOverrideAndLimits) {
  EXPECT_EQ(config_error(with_early_exit("      load_layers: -1\n")),
            "cfg.yaml:5:20: models[0].early_exit.load_layers: must be at least 0 (0 = all layers), got -1");
  EXPECT_EQ(config_error(with_early_exit("      allow_request_override: maybe\n")),
            "cfg.yaml:5:31: models[0].early_exit.allow_request_override: expected true or false, got "
            "'maybe'");
  EXPECT_EQ(config_error(with_early_exit("      allowed_policies: [full, turbo]\n")),
            "cfg.yaml:5:32: models[0].early_exit.allowed_policies[1]: must be one of full, per-token, "
            "batch-sync, fixed-depth, self-speculative, got 'turbo'");
  EXPECT_TRUE(starts_with(config_error(with_early_exit("      min_threshold: 2\n")),
                          "cfg.yaml:5:22: models[0].early_exit.min_threshold: must be between 0 and 1"));
}

// ---- keys that must agree

TEST(EarlyExitConfigErrors, PoliciesThatNeedExitPoints) {
  for (const char* policy : {"per-token", "batch-sync"}) {
    EXPECT_EQ(config_error(with_early_exit(std::string("      policy: ") + policy + "\n")),
              std::string("cfg.yaml:5:15: models[0].early_exit.policy: '") + policy +
                  "' needs exit points; set exits (e.g. [8, 16, 24]) or exit_every (e.g. 4), or use "
                  "policy: full");
  }
  // Self-speculative may draft with a heads file's lookahead head instead (the model checks it has one).
  EXPECT_EQ(config_error(with_early_exit("      policy: self-speculative\n")),
            "cfg.yaml:5:15: models[0].early_exit.policy: 'self-speculative' drafts at an exit point or with a "
            "lookahead head; set exits (e.g. [8, 16, 24]), or heads to a file from `helios calibrate --lookahead` "
            "with depth: the model's layer count");
  EXPECT_EQ(config_error(with_early_exit("      policy: self-speculative\n      heads: m.exits.gguf\n")), "");
}

TEST(EarlyExitConfigErrors, ProbeNeedsHeads) {
  EXPECT_TRUE(starts_with(config_error(with_early_exit("      measure: probe\n")),
                          "cfg.yaml:5:16: models[0].early_exit.measure: 'probe' needs the probes of a "
                          "calibrated sidecar; set heads"));
  EXPECT_EQ(config_error(with_early_exit("      measure: probe\n      heads: m.exits.gguf\n")), "");
}

TEST(EarlyExitConfigErrors, LoadLayersAgreesWithPolicyAndDepth) {
  EXPECT_TRUE(starts_with(
      config_error(with_early_exit("      policy: self-speculative\n      exits: [2]\n      load_layers: 8\n")),
      "cfg.yaml:7:20: models[0].early_exit.load_layers: is 8, but self-speculative verifies drafts "
      "with the full model"));
  EXPECT_EQ(config_error(with_early_exit("      policy: fixed-depth\n      depth: 12\n      load_layers: 8\n")),
            "cfg.yaml:6:14: models[0].early_exit.depth: 12 is deeper than load_layers (8); lower depth or "
            "load more layers");
}

TEST(EarlyExitConfigErrors, DefaultWithinTheRequestLimits) {
  EXPECT_EQ(config_error(with_early_exit("      threshold: 0.3\n      min_threshold: 0.5\n")),
            "cfg.yaml:5:18: models[0].early_exit.threshold: threshold (0.3) is below min_threshold (0.5); "
            "the default must be one requests may ask for");
  // threshold not given: its default (0.9) is below min_threshold, which the error points at.
  EXPECT_TRUE(starts_with(config_error(with_early_exit("      min_threshold: 0.95\n")),
                          "cfg.yaml:5:22: models[0].early_exit.min_threshold: threshold (0.9) is below"));
  EXPECT_EQ(config_error(with_early_exit("      allowed_policies: [per-token]\n")),
            "cfg.yaml:5:25: models[0].early_exit.allowed_policies: does not include the default policy "
            "'full'; add it, or change policy");
}

TEST(EarlyExitConfigErrors, SecondModelNamesItsIndex) {
  EXPECT_TRUE(starts_with(
      config_error("models:\n  - {name: a, path: /a.gguf}\n  - name: b\n    path: /b.gguf\n"
                   "    early_exit: {policy: none}\n"),
      "cfg.yaml:5:26: models[1].early_exit.policy: must be one of"));
}

}  // namespace
}  // namespace helios::testing
