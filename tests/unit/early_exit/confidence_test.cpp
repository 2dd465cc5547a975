// Softmax confidence statistics, the probe score and the saturation cosine, against values
// computed by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "helios/early_exit.h"

namespace helios {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

ConfidenceStats stats_of(const std::vector<float>& logits) {
  return confidence_stats(logits.data(), static_cast<int32_t>(logits.size()));
}

TEST(ConfidenceStats, UniformDistribution) {
  const ConfidenceStats s = stats_of(std::vector<float>(8, 3.5f));
  EXPECT_EQ(s.top1, 0);
  EXPECT_NEAR(s.top1_prob, 0.125f, 1e-7);
  EXPECT_NEAR(s.margin, 0.0f, 1e-7);
  EXPECT_NEAR(s.entropy, std::log(8.0f), 1e-6);
  EXPECT_NEAR(confidence_value(s, ConfidenceMeasure::kEntropy, 8), 0.0f, 1e-6);
}

TEST(ConfidenceStats, OneHotViaMinusInfinity) {
  const ConfidenceStats s = stats_of({-kInf, 2.0f, -kInf, -kInf});
  EXPECT_EQ(s.top1, 1);
  EXPECT_FLOAT_EQ(s.top1_prob, 1.0f);
  EXPECT_FLOAT_EQ(s.margin, 1.0f);
  EXPECT_FLOAT_EQ(s.entropy, 0.0f);
  EXPECT_FLOAT_EQ(confidence_value(s, ConfidenceMeasure::kEntropy, 4), 1.0f);
}

TEST(ConfidenceStats, NearlyOneHotWithLargeLogits) {
  // Logits far beyond exp()'s range must not overflow: the max is subtracted first.
  const ConfidenceStats s = stats_of({1000.0f, 0.0f, -1000.0f});
  EXPECT_EQ(s.top1, 0);
  EXPECT_FLOAT_EQ(s.top1_prob, 1.0f);
  EXPECT_FLOAT_EQ(s.margin, 1.0f);
  EXPECT_NEAR(s.entropy, 0.0f, 1e-6);
}

TEST(ConfidenceStats, HandComputedTwoLevels) {
  // logits {log 3, 0, 0, -inf}: p = {3/5, 1/5, 1/5, 0}.
  const ConfidenceStats s = stats_of({std::log(3.0f), 0.0f, 0.0f, -kInf});
  EXPECT_EQ(s.top1, 0);
  EXPECT_NEAR(s.top1_prob, 0.6f, 1e-6);
  EXPECT_NEAR(s.margin, 0.4f, 1e-6);
  const double entropy = -(0.6 * std::log(0.6) + 2 * 0.2 * std::log(0.2));
  EXPECT_NEAR(s.entropy, entropy, 1e-6);
  EXPECT_NEAR(confidence_value(s, ConfidenceMeasure::kTop1Prob, 4), 0.6f, 1e-6);
  EXPECT_NEAR(confidence_value(s, ConfidenceMeasure::kMargin, 4), 0.4f, 1e-6);
  EXPECT_NEAR(confidence_value(s, ConfidenceMeasure::kEntropy, 4), 1.0 - entropy / std::log(4.0), 1e-6);
}

TEST(ConfidenceStats, TiesPickTheLowestIndexWithZeroMargin) {
  const ConfidenceStats s = stats_of({0.0f, 1.0f, -2.0f, 1.0f});
  EXPECT_EQ(s.top1, 1);
  EXPECT_FLOAT_EQ(s.margin, 0.0f);
  const double sum = 1 + 2 * std::exp(1.0) + std::exp(-2.0);
  EXPECT_NEAR(s.top1_prob, std::exp(1.0) / sum, 1e-6);
}

TEST(ConfidenceStats, SecondBestBeforeTheBest) {
  // top-2 is found even when it comes before top-1.
  const ConfidenceStats s = stats_of({1.0f, 0.0f, 2.0f});
  EXPECT_EQ(s.top1, 2);
  const double sum = std::exp(1.0) + 1 + std::exp(2.0);
  EXPECT_NEAR(s.margin, (std::exp(2.0) - std::exp(1.0)) / sum, 1e-6);
}

TEST(ConfidenceStats, SingleTokenVocabulary) {
  const ConfidenceStats s = stats_of({-4.0f});
  EXPECT_EQ(s.top1, 0);
  EXPECT_FLOAT_EQ(s.top1_prob, 1.0f);
  EXPECT_FLOAT_EQ(s.margin, 1.0f);
  EXPECT_FLOAT_EQ(s.entropy, 0.0f);
  EXPECT_FLOAT_EQ(confidence_value(s, ConfidenceMeasure::kEntropy, 1), 1.0f);
}

TEST(ConfidenceStats, AllMinusInfinityIsUniform) {
  const ConfidenceStats s = stats_of({-kInf, -kInf});
  EXPECT_EQ(s.top1, 0);
  EXPECT_FLOAT_EQ(s.top1_prob, 0.5f);
  EXPECT_FLOAT_EQ(s.margin, 0.0f);
  EXPECT_NEAR(s.entropy, std::log(2.0f), 1e-6);
}

TEST(ConfidenceStats, NanLogitCountsAsImpossible) {
  const ConfidenceStats s = stats_of({std::nanf(""), 0.0f, 0.0f});
  EXPECT_EQ(s.top1, 1);
  EXPECT_FLOAT_EQ(s.top1_prob, 0.5f);
  EXPECT_TRUE(std::isfinite(s.entropy));
}

TEST(ConfidenceStats, CheapMeasuresHaveNoSoftmaxValue) {
  const ConfidenceStats s = stats_of({1.0f, 0.0f});
  EXPECT_EQ(confidence_value(s, ConfidenceMeasure::kProbe, 2), 0.0f);
  EXPECT_EQ(confidence_value(s, ConfidenceMeasure::kSaturation, 2), 0.0f);
}

TEST(ProbeScore, SigmoidOfTheRmsNormalisedDotProduct) {
  ExitHeadParams head;
  head.probe_weight = {0.5f, -1.0f, 2.0f, 0.0f};
  head.probe_bias = -0.25f;
  const std::vector<float> h = {2.0f, 4.0f, -2.0f, 0.0f};
  const double rms = std::sqrt((4.0 + 16.0 + 4.0) / 4.0 + 1e-6);
  const double z = (0.5 * 2 - 1.0 * 4 + 2.0 * -2) / rms - 0.25;
  EXPECT_NEAR(probe_score(head, h.data(), 4), 1.0 / (1.0 + std::exp(-z)), 1e-6);
}

TEST(ProbeScore, ScaleOfTheHiddenStateDropsOut) {
  ExitHeadParams head;
  head.probe_weight = {1.0f, 2.0f, -0.5f};
  head.probe_bias = 0.1f;
  const std::vector<float> h = {0.3f, -1.2f, 2.0f};
  std::vector<float> scaled = h;
  for (float& v : scaled) v *= 1000.0f;
  EXPECT_NEAR(probe_score(head, h.data(), 3), probe_score(head, scaled.data(), 3), 1e-5);
}

TEST(ProbeScore, NoProbeScoresZeroAndSaturatesWithoutOverflow) {
  ExitHeadParams head;
  const std::vector<float> h = {1.0f, 2.0f};
  EXPECT_EQ(probe_score(head, h.data(), 2), 0.0f);
  head.probe_weight = {1.0f, 1.0f};
  head.probe_bias = -1e30f;
  EXPECT_EQ(probe_score(head, h.data(), 2), 0.0f);
  head.probe_bias = 1e30f;
  EXPECT_EQ(probe_score(head, h.data(), 2), 1.0f);
  const std::vector<float> zeros = {0.0f, 0.0f};
  head.probe_bias = 0.0f;
  EXPECT_FLOAT_EQ(probe_score(head, zeros.data(), 2), 0.5f);  // rms epsilon: no 0/0
}

TEST(CosineSimilarity, HandComputedValues) {
  const std::vector<float> a = {1.0f, 0.0f, 0.0f};
  const std::vector<float> b = {1.0f, 1.0f, 0.0f};
  const std::vector<float> c = {-2.0f, 0.0f, 0.0f};
  EXPECT_NEAR(cosine_similarity(a.data(), b.data(), 3), 1.0 / std::sqrt(2.0), 1e-7);
  EXPECT_FLOAT_EQ(cosine_similarity(a.data(), c.data(), 3), -1.0f);
  EXPECT_FLOAT_EQ(cosine_similarity(b.data(), b.data(), 3), 1.0f);
}

TEST(CosineSimilarity, ZeroVectorGivesZero) {
  const std::vector<float> a = {1.0f, 2.0f};
  const std::vector<float> zero = {0.0f, 0.0f};
  EXPECT_EQ(cosine_similarity(a.data(), zero.data(), 2), 0.0f);
  EXPECT_EQ(cosine_similarity(zero.data(), zero.data(), 2), 0.0f);
}

TEST(CosineSimilarity, LargeValuesDoNotOverflow) {
  const std::vector<float> a = {3e30f, 4e30f};
  const std::vector<float> b = {3e30f, 4e30f};
  EXPECT_FLOAT_EQ(cosine_similarity(a.data(), b.data(), 2), 1.0f);
}

}  // namespace
TEST(AgreementCurve, SharesAtOrAboveEachPointNeverOverstate) {
  // 10 tokens by confidence: the top 4 agree, then a miss, then alternating.
  const std::vector<float> p = {0.99f, 0.95f, 0.9f, 0.85f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.3f};
  const std::vector<uint8_t> agrees = {1, 1, 1, 1, 0, 1, 0, 1, 0, 0};
  std::vector<float> xs, ys;
  fit_agreement_curve(p, agrees, 10, &xs, &ys);
  ASSERT_EQ(xs.size(), 10u);
  EXPECT_TRUE(std::is_sorted(xs.begin(), xs.end()));
  EXPECT_TRUE(std::is_sorted(ys.begin(), ys.end()));
  EXPECT_FLOAT_EQ(ys.back(), 1.0f);       // at 0.99: 1 of 1
  EXPECT_FLOAT_EQ(ys[xs.size() - 5], 0.8f);  // at 0.8: 4 of 5
  EXPECT_FLOAT_EQ(ys.front(), 0.6f);      // at 0.3: 6 of 10
  // At 0.6: 5 of 7 agree (0.714); at 0.7 it is 5 of 6 (0.833), capped by 0.8 at 0.8 above it.
  EXPECT_NEAR(ys[3], 5.0f / 7.0f, 1e-6);
  EXPECT_FLOAT_EQ(ys[4], 0.8f);
  for (size_t k = 0; k < xs.size(); ++k) {  // never more than the share truly at or above
    int n = 0, a = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] >= xs[k]) ++n, a += agrees[i];
    }
    EXPECT_LE(ys[k], static_cast<float>(a) / n + 1e-6f) << "point " << k;
  }
}

TEST(AgreementCurve, ConfidenceInterpolatesAndIsFlatBeyondTheEnds) {
  ExitHeadParams head;
  EXPECT_FLOAT_EQ(agreement_confidence(head, 0.42f), 0.42f);  // no curve: top-1 itself
  head.curve_prob = {0.2f, 0.6f};
  head.curve_agreement = {0.5f, 0.9f};
  EXPECT_FLOAT_EQ(agreement_confidence(head, 0.1f), 0.5f);
  EXPECT_FLOAT_EQ(agreement_confidence(head, 0.4f), 0.7f);
  EXPECT_FLOAT_EQ(agreement_confidence(head, 0.9f), 0.9f);
  EXPECT_EQ(parse_confidence_measure("agreement").value(), ConfidenceMeasure::kAgreement);
}

}  // namespace helios
