// Exit policy / measure names and exit-point resolution.
#include <gtest/gtest.h>

#include <vector>

#include "helios/early_exit.h"

namespace helios {
namespace {

TEST(ExitPolicyNames, RoundTripEveryPolicy) {
  for (ExitPolicy p : {ExitPolicy::kFull, ExitPolicy::kPerToken, ExitPolicy::kBatchSync, ExitPolicy::kFixedDepth,
                       ExitPolicy::kSelfSpeculative}) {
    auto parsed = parse_exit_policy(exit_policy_name(p));
    ASSERT_TRUE(parsed.ok()) << exit_policy_name(p);
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_STREQ(exit_policy_name(ExitPolicy::kPerToken), "per-token");
  EXPECT_STREQ(exit_policy_name(ExitPolicy::kSelfSpeculative), "self-speculative");
}

TEST(ExitPolicyNames, UnknownPolicyListsTheValidOnes) {
  auto parsed = parse_exit_policy("x");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(),
            "unknown exit policy 'x'; valid: full, per-token, batch-sync, fixed-depth, self-speculative");
  EXPECT_FALSE(parse_exit_policy("Full").ok());  // names are case-sensitive
  EXPECT_FALSE(parse_exit_policy("").ok());
}

TEST(ConfidenceMeasureNames, RoundTripEveryMeasure) {
  for (ConfidenceMeasure m : {ConfidenceMeasure::kTop1Prob, ConfidenceMeasure::kMargin, ConfidenceMeasure::kEntropy,
                              ConfidenceMeasure::kProbe, ConfidenceMeasure::kSaturation}) {
    auto parsed = parse_confidence_measure(confidence_measure_name(m));
    ASSERT_TRUE(parsed.ok()) << confidence_measure_name(m);
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_STREQ(confidence_measure_name(ConfidenceMeasure::kTop1Prob), "top1");
}

TEST(ConfidenceMeasureNames, UnknownMeasureListsTheValidOnes) {
  auto parsed = parse_confidence_measure("top-1");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(),
            "unknown confidence measure 'top-1'; valid: top1, margin, entropy, probe, saturation, agreement");
}

TEST(ConfidenceMeasureNames, OnlyProbeAndSaturationAreCheap) {
  EXPECT_TRUE(is_cheap_measure(ConfidenceMeasure::kProbe));
  EXPECT_TRUE(is_cheap_measure(ConfidenceMeasure::kSaturation));
  EXPECT_FALSE(is_cheap_measure(ConfidenceMeasure::kTop1Prob));
  EXPECT_FALSE(is_cheap_measure(ConfidenceMeasure::kMargin));
  EXPECT_FALSE(is_cheap_measure(ConfidenceMeasure::kEntropy));
}

TEST(ExitRule, ThresholdZeroAlwaysLeavesAndOneNever) {
  ExitRule rule;
  rule.threshold = 0.0f;
  EXPECT_TRUE(rule.confident(4, 0.0f));
  rule.threshold = 1.0f;
  EXPECT_FALSE(rule.confident(4, 1.0f));
  rule.threshold = 0.5f;
  EXPECT_TRUE(rule.confident(4, 0.5f));
  EXPECT_FALSE(rule.confident(4, 0.49f));
}

TEST(ExitRule, PerExitThresholdsOverrideTheRulesOne) {
  ExitRule rule;
  rule.threshold = 0.5f;
  rule.exit_thresholds = {{8, 0.95f}, {16, 1.0f}};
  EXPECT_FLOAT_EQ(rule.threshold_at(4), 0.5f);
  EXPECT_FALSE(rule.confident(8, 0.9f));
  EXPECT_TRUE(rule.confident(8, 0.95f));
  EXPECT_FALSE(rule.confident(16, 1.0f));  // 1: never at that exit
  EXPECT_TRUE(rule.confident(12, 0.6f));
}

std::vector<int32_t> resolved(const ExitPointsSpec& spec, int32_t n_layers) {
  auto layers = resolve_exit_points(spec, n_layers);
  EXPECT_TRUE(layers.ok()) << layers.status().to_string();
  return layers.ok() ? *layers : std::vector<int32_t>{};
}

TEST(ExitPoints, EmptySpecHasNoExits) { EXPECT_TRUE(resolved({}, 30).empty()); }

TEST(ExitPoints, EveryStartsAtMinLayerAndStopsBeforeTheLastLayer) {
  ExitPointsSpec spec;
  spec.every = 4;
  spec.min_layer = 2;
  EXPECT_EQ(resolved(spec, 12), (std::vector<int32_t>{2, 6, 10}));
  spec.min_layer = 3;
  EXPECT_EQ(resolved(spec, 12), (std::vector<int32_t>{3, 7, 11}));  // 11: the last exit of 12 layers
  EXPECT_EQ(resolved(spec, 11), (std::vector<int32_t>{3, 7}));      // 11 is the model's own head
}

TEST(ExitPoints, EveryOneCoversEveryExitLayer) {
  ExitPointsSpec spec;
  spec.every = 1;
  EXPECT_EQ(resolved(spec, 5), (std::vector<int32_t>{1, 2, 3, 4}));
}

TEST(ExitPoints, ExplicitLayersAreSortedUniqueAndMergedWithEvery) {
  ExitPointsSpec spec;
  spec.layers = {9, 3, 9, 1};
  EXPECT_EQ(resolved(spec, 10), (std::vector<int32_t>{1, 3, 9}));
  spec.every = 4;
  spec.min_layer = 4;
  EXPECT_EQ(resolved(spec, 10), (std::vector<int32_t>{1, 3, 4, 8, 9}));
}

TEST(ExitPoints, ExplicitLayerOutOfRangeIsNamed) {
  ExitPointsSpec spec;
  spec.layers = {3, 30};
  auto layers = resolve_exit_points(spec, 30);
  ASSERT_FALSE(layers.ok());
  EXPECT_EQ(layers.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(layers.status().message().find("exit layer 30"), std::string::npos) << layers.status().message();
  EXPECT_NE(layers.status().message().find("[1, 29]"), std::string::npos) << layers.status().message();
  spec.layers = {0};
  EXPECT_FALSE(resolve_exit_points(spec, 30).ok());
}

TEST(ExitPoints, NegativeEveryAndZeroMinLayerAreErrors) {
  ExitPointsSpec spec;
  spec.every = -1;
  EXPECT_EQ(resolve_exit_points(spec, 10).status().code(), StatusCode::kInvalidArgument);
  spec.every = 2;
  spec.min_layer = 0;
  EXPECT_EQ(resolve_exit_points(spec, 10).status().code(), StatusCode::kInvalidArgument);
}

TEST(ExitPoints, OneLayerModelHasNoExits) {
  ExitPointsSpec spec;
  spec.every = 1;
  EXPECT_TRUE(resolved(spec, 1).empty());
  spec.layers = {1};
  EXPECT_FALSE(resolve_exit_points(spec, 1).ok());
}

}  // namespace
}  // namespace helios
