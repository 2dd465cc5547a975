// The intercepts section: defaults, each key, and each error in FILE:LINE:COLUMN form.
// with_model() prepends three lines, so `intercepts:` is line 4 and its first key line 5.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "test_paths.h"

namespace helios::testing {
namespace {

void expect_intercepts_eq(const InterceptConfig& a, const InterceptConfig& b) {
  EXPECT_EQ(a.default_hold, b.default_hold);
  EXPECT_EQ(a.pause_priors, b.pause_priors);
  EXPECT_EQ(a.profile_at_start, b.profile_at_start);
  EXPECT_DOUBLE_EQ(a.paused_idle_timeout_s, b.paused_idle_timeout_s);
}

InterceptConfig parse_intercepts(const std::string& section) {
  StatusOr<HeliosConfig> parsed = parse_config(with_model(section), "cfg.yaml");
  EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
  return parsed.ok() ? parsed->intercepts : InterceptConfig{};
}

TEST(InterceptsConfig, AbsentOrEmptyGivesDefaults) {
  for (const char* section : {"", "intercepts:\n", "intercepts: {}\n", "intercepts:\n  pause_priors:\n"}) {
    SCOPED_TRACE(section);
    expect_intercepts_eq(parse_intercepts(section), InterceptConfig{});
  }
  const InterceptConfig defaults;
  EXPECT_EQ(defaults.default_hold, HoldPolicy::kMinWaste);
  EXPECT_EQ(defaults.pause_priors, default_pause_priors());
  EXPECT_TRUE(defaults.profile_at_start);
  EXPECT_DOUBLE_EQ(defaults.paused_idle_timeout_s, 300);
}

TEST(InterceptsConfig, DefaultYamlStatesTheStructDefaults) {
  StatusOr<HeliosConfig> loaded = load_config(source_dir() + "/configs/default.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  expect_intercepts_eq(loaded->intercepts, InterceptConfig{});
}

TEST(InterceptsConfig, Hold) {
  for (HoldPolicy p : {HoldPolicy::kDiscard, HoldPolicy::kImprovedDiscard, HoldPolicy::kPreserve, HoldPolicy::kSwap,
                       HoldPolicy::kMinWaste}) {
    const std::string name = hold_policy_name(p);
    EXPECT_EQ(parse_intercepts("intercepts:\n  hold: " + name + "\n").default_hold, p) << name;
  }
}

TEST(InterceptsConfig, PausePriorsOverrideAndAdd) {
  const InterceptConfig c = parse_intercepts("intercepts:\n  pause_priors:\n    qa: 2.5\n    search: 1.25\n    math: 0\n");
  std::map<std::string, double> expected = default_pause_priors();
  expected["qa"] = 2.5;
  expected["search"] = 1.25;
  expected["math"] = 0;
  EXPECT_EQ(c.pause_priors, expected);
  EXPECT_EQ(parse_intercepts("intercepts:\n  pause_priors: {tts: 1e-3}\n").pause_priors.at("tts"), 1e-3);
}

TEST(InterceptsConfig, ProfileAtStartAndIdleTimeout) {
  const InterceptConfig c =
      parse_intercepts("intercepts:\n  profile_at_start: false\n  paused_idle_timeout_s: 12.5\n");
  EXPECT_FALSE(c.profile_at_start);
  EXPECT_DOUBLE_EQ(c.paused_idle_timeout_s, 12.5);
  EXPECT_TRUE(parse_intercepts("intercepts:\n  profile_at_start: true\n").profile_at_start);
}

TEST(InterceptsConfig, OtherSectionsAreUntouched) {
  StatusOr<HeliosConfig> parsed = parse_config(with_model("intercepts:\n  hold: swap\n"), "cfg.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  HeliosConfig expected;
  expected.models.push_back(model_entry("m", "/m.gguf"));
  expect_config_eq(*parsed, expected);
}

// ---- errors ----

TEST(InterceptsConfig, SectionMustBeAMap) {
  EXPECT_EQ(config_error(with_model("intercepts: 5\n")),
            "cfg.yaml:4:13: intercepts: expected a map of keys (hold, pause_priors, profile_at_start, "
            "paused_idle_timeout_s), got '5'");
}

TEST(InterceptsConfig, UnknownKey) {
  EXPECT_EQ(config_error(with_model("intercepts:\n  hold_policy: swap\n")),
            "cfg.yaml:5:3: intercepts.hold_policy: unknown key; did you mean 'hold'? Valid 'intercepts' keys: "
            "hold, pause_priors, profile_at_start, paused_idle_timeout_s");
  EXPECT_TRUE(starts_with(config_error(with_model("intercepts:\n  paused_idle_timeout: 30\n")),
                          "cfg.yaml:5:3: intercepts.paused_idle_timeout: unknown key; did you mean "
                          "'paused_idle_timeout_s'?"));
}

TEST(InterceptsConfig, UnknownHoldListsTheNames) {
  EXPECT_EQ(config_error(with_model("intercepts:\n  hold: min_waste\n")),
            "cfg.yaml:5:9: intercepts.hold: must be one of discard, improved-discard, preserve, swap, min-waste, "
            "got 'min_waste'; did you mean 'min-waste'?");
  EXPECT_EQ(config_error(with_model("intercepts:\n  hold: [swap]\n")),
            "cfg.yaml:5:9: intercepts.hold: expected a string, got a list");
}

TEST(InterceptsConfig, PausePriorsMustBeAMap) {
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors: 5\n")),
            "cfg.yaml:5:17: intercepts.pause_priors: expected a map of kind: seconds, e.g. {chatbot: 28.6, "
            "qa: 0.69}, got '5'");
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors: [1, 2]\n")),
            "cfg.yaml:5:17: intercepts.pause_priors: expected a map of kind: seconds, e.g. {chatbot: 28.6, "
            "qa: 0.69}, got a list");
}

TEST(InterceptsConfig, PausePriorValues) {
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors:\n    qa: -1\n")),
            "cfg.yaml:6:9: intercepts.pause_priors.qa: must be at least 0 seconds, got -1");
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors:\n    qa: fast\n")),
            "cfg.yaml:6:9: intercepts.pause_priors.qa: expected a number, got 'fast'");
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors:\n    qa: \"1\"\n")),
            "cfg.yaml:6:9: intercepts.pause_priors.qa: expected a number, got the quoted string '1'; write it "
            "without quotes");
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors:\n    qa: {a: 1}\n")),
            "cfg.yaml:6:9: intercepts.pause_priors.qa: expected a number, got a map");
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors:\n    qa: .inf\n")),
            "cfg.yaml:6:9: intercepts.pause_priors.qa: expected a number, got '.inf'");
}

TEST(InterceptsConfig, PausePriorKinds) {
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors:\n    qa: 1\n    qa: 2\n")),
            "cfg.yaml:7:5: intercepts.pause_priors.qa: given twice (first at line 6); give each key once");
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors:\n    \"\": 1\n")),
            "cfg.yaml:6:9: intercepts.pause_priors: a kind needs a name, got an empty key");
  EXPECT_EQ(config_error(with_model("intercepts:\n  pause_priors:\n    [a]: 1\n")),
            "cfg.yaml:6:5: intercepts.pause_priors: expected a key name, got a list");
}

TEST(InterceptsConfig, ProfileAtStartIsABool) {
  EXPECT_EQ(config_error(with_model("intercepts:\n  profile_at_start: yes\n")),
            "cfg.yaml:5:21: intercepts.profile_at_start: expected true or false, got 'yes'");
}

TEST(InterceptsConfig, IdleTimeoutMustBePositive) {
  EXPECT_EQ(config_error(with_model("intercepts:\n  paused_idle_timeout_s: 0\n")),
            "cfg.yaml:5:26: intercepts.paused_idle_timeout_s: must be more than 0 seconds, got 0");
  EXPECT_EQ(config_error(with_model("intercepts:\n  paused_idle_timeout_s: -5\n")),
            "cfg.yaml:5:26: intercepts.paused_idle_timeout_s: must be more than 0 seconds, got -5");
  EXPECT_EQ(config_error(with_model("intercepts:\n  paused_idle_timeout_s: soon\n")),
            "cfg.yaml:5:26: intercepts.paused_idle_timeout_s: expected a number, got 'soon'");
}

}  // namespace
}  // namespace helios::testing
