#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "helios/sampler.h"

namespace helios {
namespace {

std::map<TokenId, int> histogram(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::map<TokenId, int> counts;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    ++counts[s.sample(l.data(), static_cast<int32_t>(l.size()), {})];
  }
  return counts;
}

TEST(Sampler, GreedyPicksArgmaxAndLowestIndexOnTies) {
  SamplingParams p;
  Sampler s(p);
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(l.data(), 4, {}), 1);
}

TEST(Sampler, TopKOneIsGreedyAtAnyTemperature) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  auto counts = histogram(p, {0.0f, 1.0f, 0.5f}, 200);
  EXPECT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts.begin()->first, 1);
}

TEST(Sampler, TopKLimitsTheCandidates) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  auto counts = histogram(p, {0.0f, 2.0f, 1.9f, -5.0f}, 2000);
  for (const auto& [id, n] : counts) EXPECT_TRUE(id == 1 || id == 2) << "token " << id;
  EXPECT_EQ(counts.size(), 2u);
}

TEST(Sampler, TopPKeepsTheSmallestSetWithEnoughMass) {
  // Probabilities ≈ 0.64, 0.24, 0.09, 0.03: top_p 0.8 keeps the first two.
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.8f;
  auto counts = histogram(p, {3.0f, 2.0f, 1.0f, 0.0f}, 4000);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[0], counts[1]);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.2f;  // keeps tokens with p ≥ 0.2 · p_max
  auto counts = histogram(p, {2.0f, 1.5f, -3.0f}, 3000);
  EXPECT_EQ(counts.count(2), 0u);
  EXPECT_EQ(counts.size(), 2u);
}

TEST(Sampler, SameSeedSameDrawsDifferentSeedDifferentDraws) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 1.7f);
  auto draws = [&](uint64_t seed) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = seed;
    Sampler s(p);
    std::vector<TokenId> out;
    for (int i = 0; i < 40; ++i) {
      std::vector<float> l = logits;
      out.push_back(s.sample(l.data(), 50, {}));
    }
    return out;
  };
  EXPECT_EQ(draws(7), draws(7));
  EXPECT_NE(draws(7), draws(8));
}

TEST(Sampler, TemperatureFollowsTheSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  auto counts = histogram(p, {std::log(3.0f), 0.0f}, 20000);  // p = 0.75, 0.25
  EXPECT_NEAR(counts[0] / 20000.0, 0.75, 0.02);
}

TEST(Sampler, RepetitionPenaltyDemotesSeenTokens) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {1.0f, 1.5f, -0.5f};
  EXPECT_EQ(s.sample(l.data(), 3, {1}), 0) << "1.5 / 2 = 0.75 < 1.0";
  EXPECT_FLOAT_EQ(l[1], 0.75f);
  std::vector<float> neg = {-1.0f, -0.6f};
  Sampler s2(p);
  EXPECT_EQ(s2.sample(neg.data(), 2, {1}), 0) << "-0.6 * 2 = -1.2 < -1.0";
}

TEST(SamplingParams, ValidateNamesTheField) {
  SamplingParams p;
  EXPECT_TRUE(p.validate().ok());
  p.temperature = NAN;
  EXPECT_NE(p.validate().message().find("temperature"), std::string::npos);
  p = {};
  p.temperature = -1;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.top_p = 0;
  EXPECT_NE(p.validate().message().find("top_p"), std::string::npos);
  p = {};
  p.top_p = 1.5f;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.top_k = -1;
  EXPECT_NE(p.validate().message().find("top_k"), std::string::npos);
  p = {};
  p.min_p = 2;
  EXPECT_NE(p.validate().message().find("min_p"), std::string::npos);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_NE(p.validate().message().find("repetition_penalty"), std::string::npos);
}

TEST(StopMatcher, EmitsTextBeforeTheStopString) {
  StopMatcher m({"END"});
  std::string out = m.push("hello E");
  EXPECT_EQ(out, "hello ") << "'E' may start the stop string: held back";
  out += m.push("N");
  out += m.push("D and more");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "hello ");
  EXPECT_EQ(m.push("x"), "");
}

TEST(StopMatcher, ReleasesHeldTextWhenItCannotMatch) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("E"), "");
  EXPECT_EQ(m.push("x"), "Ex");
  EXPECT_EQ(m.push("EN"), "");
  EXPECT_EQ(m.flush(), "EN");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.push("hello world"), "hel");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace helios
