#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <random>
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

// The sampler's definition with every candidate sorted: what Sampler::sample computes while
// putting in order only the prefix it looks at.
TokenId sample_fully_sorted(const SamplingParams& p, const std::vector<float>& logits, std::mt19937_64& rng) {
  std::vector<std::pair<float, TokenId>> c;
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({logits[i] / p.temperature, static_cast<TokenId>(i)});
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  if (p.top_k > 0) c.resize(std::min<size_t>(p.top_k, c.size()));
  const float max_logit = c[0].first;
  double sum = 0;
  for (const auto& x : c) sum += std::exp(x.first - max_logit);
  std::vector<float> prob;
  for (const auto& x : c) prob.push_back(static_cast<float>(std::exp(x.first - max_logit) / sum));
  size_t keep = c.size();
  if (p.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      mass += prob[i];
      if (mass >= p.top_p) { keep = i + 1; break; }
    }
  }
  if (p.min_p > 0.0f) {
    while (keep > 1 && prob[keep - 1] < p.min_p * prob[0]) --keep;
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += prob[i];
  std::uniform_real_distribution<double> uniform(0.0, total);
  double r = uniform(rng);
  for (size_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r <= 0) return c[i].second;
  }
  return c[keep - 1].second;
}

TEST(Sampler, DrawsWhatSortingEveryCandidateGivesOnALargeVocabulary) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> logits(32768);
  for (float& l : logits) l = normal(gen);
  for (int i = 0; i < 40; ++i) logits[gen() % logits.size()] += 9.0f;  // a head of likely tokens
  logits[5] = logits[77];                                                // a tie
  struct Case { float temperature; int32_t top_k; float top_p, min_p; };
  for (const Case& k : {Case{0.7f, 0, 1.0f, 0.0f}, Case{1.0f, 0, 0.9f, 0.0f}, Case{1.3f, 0, 0.95f, 0.05f},
                        Case{0.8f, 40, 0.9f, 0.0f}, Case{1.0f, 0, 1.0f, 0.1f}, Case{3.0f, 0, 0.5f, 0.0f}}) {
    SamplingParams p;
    p.temperature = k.temperature;
    p.top_k = k.top_k;
    p.top_p = k.top_p;
    p.min_p = k.min_p;
    p.seed = 11;
    Sampler s(p);
    std::mt19937_64 rng(p.seed);
    int differ = 0;
    for (int draw = 0; draw < 60; ++draw) {
      std::vector<float> l = logits;
      differ += s.sample(l.data(), static_cast<int32_t>(l.size()), {}) != sample_fully_sorted(p, logits, rng);
    }
    EXPECT_EQ(differ, 0) << "temperature " << k.temperature << " top_k " << k.top_k << " top_p " << k.top_p
                         << " min_p " << k.min_p;
  }
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

TEST(Sampler, LogitBiasShiftsTheChoiceAndNeverTouchesOtherTokens) {
  SamplingParams p;
  p.logit_bias = {{2, 1.5f}, {7, 100.0f}};  // 7 is past this vocabulary: ignored
  Sampler s(p);
  std::vector<float> l = {1.0f, 2.0f, 1.0f};
  EXPECT_EQ(s.sample(l.data(), 3, {}), 2) << "1.0 + 1.5 = 2.5 > 2.0";
  EXPECT_FLOAT_EQ(l[0], 1.0f);
  EXPECT_FLOAT_EQ(l[1], 2.0f);
  p.logit_bias = {{1, -100.0f}};
  Sampler banned(p);
  p.temperature = 1.0f;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> m = {0.0f, 50.0f, 0.0f};
    ASSERT_NE(banned.sample(m.data(), 3, {}), 1) << "a -100 bias bans the token";
  }
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountOnlyAcceptedTokens) {
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Sampler s(p);
  // The prompt's tokens (history) are not penalised, only what the generation took.
  std::vector<float> l = {2.0f, 1.5f, 0.0f};
  EXPECT_EQ(s.sample(l.data(), 3, {0, 0, 0}), 0);
  s.accept(0);
  l = {2.0f, 1.5f, 0.0f};
  EXPECT_EQ(s.sample(l.data(), 3, {0}), 1) << "one count: 2.0 - 0.5 - 0.25 = 1.25 < 1.5";
  EXPECT_FLOAT_EQ(l[0], 1.25f);
  s.accept(1);
  s.accept(1);
  l = {2.0f, 1.5f, 0.0f};
  EXPECT_EQ(s.sample(l.data(), 3, {0}), 0) << "two counts of 1: 1.5 - 1.0 - 0.25 = 0.25 < 1.25";
  EXPECT_FLOAT_EQ(l[1], 0.25f);
  EXPECT_FLOAT_EQ(l[2], 0.0f);
  // Negative penalties encourage repeats.
  SamplingParams q;
  q.presence_penalty = -1.0f;
  Sampler r(q);
  r.accept(2);
  std::vector<float> m = {0.5f, 0.0f, 0.0f};
  EXPECT_EQ(r.sample(m.data(), 3, {}), 2);
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
  p = {};
  p.presence_penalty = 2.5f;
  EXPECT_NE(p.validate().message().find("presence_penalty"), std::string::npos);
  p = {};
  p.frequency_penalty = NAN;
  EXPECT_NE(p.validate().message().find("frequency_penalty"), std::string::npos);
  p = {};
  p.logit_bias = {{3, 101.0f}};
  EXPECT_NE(p.validate().message().find("logit_bias"), std::string::npos);
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_NE(p.validate().message().find("logit_bias"), std::string::npos);
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
