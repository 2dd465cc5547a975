// The sampler's draw as data (Sampler::plan_draw) and its CPU twin (kernels::ref_sample_rows), the
// reference the CUDA kernel is checked against: over every sampler setting, the twin takes the
// host sampler's token to the bit, step after step of one seeded generation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "helios/backend.h"
#include "helios/sampler.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

// Logits like a model's: normal, with a few strong candidates, and (when `ties`) rounded to a
// coarse grid so that many are equal and the order of equal values decides.
std::vector<float> logits_like_a_model(int32_t n_vocab, std::mt19937& rng, bool ties) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(n_vocab);
  for (float& v : x) v = normal(rng);
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  for (int i = 0; i < 5; ++i) x[pick(rng)] += 8.0f;
  if (ties) {
    for (float& v : x) v = std::round(v * 2.0f) / 2.0f;
  }
  return x;
}

struct Case {
  std::string name;
  SamplingParams params;
  bool ties = false;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](std::string name, auto set, bool ties = false) {
    Case c;
    c.name = std::move(name);
    c.params.seed = 11 + out.size();
    set(c.params);
    c.ties = ties;
    out.push_back(c);
  };
  add("temperature", [](SamplingParams& p) { p.temperature = 0.8f; });
  add("hot", [](SamplingParams& p) { p.temperature = 2.5f; });
  add("top_k", [](SamplingParams& p) { p.temperature = 1.0f; p.top_k = 40; });
  add("top_k past the vocabulary", [](SamplingParams& p) { p.temperature = 1.0f; p.top_k = 1 << 20; });
  add("top_p", [](SamplingParams& p) { p.temperature = 0.7f; p.top_p = 0.9f; });
  add("tight top_p", [](SamplingParams& p) { p.temperature = 1.3f; p.top_p = 0.05f; });
  add("min_p", [](SamplingParams& p) { p.temperature = 1.0f; p.min_p = 0.05f; });
  add("all cuts", [](SamplingParams& p) { p.temperature = 0.9f; p.top_k = 100; p.top_p = 0.8f; p.min_p = 0.02f; });
  add("repetition", [](SamplingParams& p) { p.temperature = 0.8f; p.repetition_penalty = 1.3f; p.repetition_window = 16; });
  add("presence and frequency", [](SamplingParams& p) {
    p.temperature = 1.0f;
    p.presence_penalty = 0.7f;
    p.frequency_penalty = -0.4f;
  });
  add("bias", [](SamplingParams& p) {
    p.temperature = 1.0f;
    p.logit_bias = {{3, 9.0f}, {7, -100.0f}, {900, 4.5f}, {1 << 30, 5.0f}};  // the last past the vocabulary
  });
  add("everything", [](SamplingParams& p) {
    p.temperature = 0.6f;
    p.top_k = 50;
    p.top_p = 0.95f;
    p.min_p = 0.01f;
    p.repetition_penalty = 0.8f;
    p.presence_penalty = 0.3f;
    p.frequency_penalty = 0.5f;
    p.logit_bias = {{5, 2.0f}};
  });
  add("greedy with penalties", [](SamplingParams& p) { p.repetition_penalty = 1.5f; p.frequency_penalty = 1.0f; });
  add("ties", [](SamplingParams& p) { p.temperature = 1.0f; p.top_p = 0.9f; }, true);
  add("ties, greedy", [](SamplingParams& p) { p.presence_penalty = 0.1f; }, true);
  return out;
}

// The twin's token for the draw `planned` plans over the raw row (and its log-probability).
int32_t twin_token(Sampler& planned, const std::vector<float>& raw, const std::vector<TokenId>& history,
                   float* logprob) {
  const auto n_vocab = static_cast<int32_t>(raw.size());
  std::optional<SampleDraw> draw = planned.plan_draw(history, n_vocab);
  EXPECT_TRUE(draw.has_value());
  if (!draw) return -1;
  draw->row.adjust_end = static_cast<int32_t>(draw->adjust.size());
  int32_t token = -1;
  kernels::ref_sample_rows(raw.data(), n_vocab, &draw->row, 1, draw->adjust.data(), &token, logprob);
  return token;
}

// One seeded generation of `steps` tokens over rows like a model's: the twin takes the host
// sampler's token at every step, with the host's log-probability. With `nans`, each row loses its
// best logit, about a tenth of the rest and ids 0 and 7 (a bias or penalty names them in some
// cases) to NaN, and no NaN is ever taken.
void expect_the_twin_takes_the_hosts_tokens(const Case& c, int32_t n_vocab, int steps, bool nans) {
  Sampler host(c.params), planned(c.params);
  std::mt19937 rng(n_vocab + c.params.seed);
  std::bernoulli_distribution broken(0.1);
  std::vector<TokenId> history = {1, 0, 1, 1};
  for (int step = 0; step < steps; ++step) {
    std::vector<float> raw = logits_like_a_model(n_vocab, rng, c.ties);
    if (nans) {
      raw[kernels::ref_argmax(raw.data(), n_vocab)] = NAN;
      for (float& v : raw) v = broken(rng) ? NAN : v;
      raw[0] = raw[std::min(7, n_vocab - 1)] = NAN;
    }
    std::vector<float> scratch = raw;
    const TokenId want = host.sample(scratch.data(), n_vocab, history);
    float logprob = 0;
    const int32_t got = twin_token(planned, raw, history, &logprob);
    ASSERT_EQ(got, want) << "step " << step;
    ASSERT_FALSE(std::isnan(raw[got])) << "step " << step;
    EXPECT_FLOAT_EQ(logprob, static_cast<float>(kernels::cpu_log_softmax(raw.data(), n_vocab).at(raw[got])));

    host.accept(want);
    planned.accept(want);
    history.push_back(want);
  }
}

TEST(SampleRows, TheTwinTakesTheHostSamplersTokenStepAfterStep) {
  for (int32_t n_vocab : {2, 1000, 49152}) {
    for (const Case& c : cases()) {
      SCOPED_TRACE(c.name + ", n_vocab " + std::to_string(n_vocab));
      expect_the_twin_takes_the_hosts_tokens(c, n_vocab, 24, false);
    }
  }
}

// A NaN logit counts as −inf: greedy or drawn, over every sampler setting, the host sampler and the
// twin take the same token and never one whose logit is NaN while a number is left.
TEST(SampleRows, ANanLogitIsNeverPickedWhileANumberIsLeft) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    expect_the_twin_takes_the_hosts_tokens(c, 1000, 12, true);
  }
}

// +inf logits (a 16-bit overflow) share the mass: every setting takes one of them, host and twin
// alike. A tiny temperature that overflows the largest logits to +inf draws among those, not the
// least likely token.
TEST(SampleRows, InfiniteLogitsTakeTheMass) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    std::mt19937 rng(c.params.seed);
    std::vector<float> raw = logits_like_a_model(1000, rng, c.ties);
    raw[11] = raw[500] = INFINITY;
    Sampler host(c.params), planned(c.params);
    std::vector<float> scratch = raw;
    const TokenId want = host.sample(scratch.data(), 1000, {1, 0});
    EXPECT_TRUE(want == 11 || want == 500) << want;
    float logprob = 0;
    EXPECT_EQ(twin_token(planned, raw, {1, 0}, &logprob), want);
    EXPECT_FLOAT_EQ(logprob, std::log(0.5f)) << "two +inf share the mass";
  }
  for (const float temperature : {1e-39f, 1e-30f}) {
    std::vector<float> x(64);
    for (int32_t i = 0; i < 64; ++i) x[i] = -1.0f - 0.01f * i;
    x[40] = 0.9f;  // over 1e-39, past FLT_MAX
    for (const double uniform : {0.0, 0.5, 0.999}) {
      kernels::SampleRow row;
      row.temperature = temperature;
      row.uniform = uniform;
      int32_t token = -1;
      float logprob = 0;
      kernels::ref_sample_rows(x.data(), 64, &row, 1, nullptr, &token, &logprob);
      EXPECT_EQ(token, 40) << "temperature " << temperature << ", uniform " << uniform;
    }
    SamplingParams p;
    p.temperature = temperature;
    Sampler host(p);
    std::vector<float> logits = x;
    EXPECT_EQ(host.sample(logits.data(), 64, {}), 40) << "temperature " << temperature;
  }
}

TEST(SampleRows, ARowWithNoNumberGivesTheFirstIdWhenGreedy) {
  // No number at all: the first id, as ref_argmax gives.
  std::vector<float> nans(16, NAN);
  nans[9] = -INFINITY;
  kernels::SampleRow greedy;
  int32_t token = -1;
  float logprob = 0;
  kernels::ref_sample_rows(nans.data(), 16, &greedy, 1, nullptr, &token, &logprob);
  EXPECT_EQ(token, 0);
  Sampler host(SamplingParams{});
  EXPECT_EQ(host.sample(nans.data(), 16, {}), 0);
}

TEST(SampleRows, APlanAdjustsEachTokenOnceInTheHostOrder) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.logit_bias = {{4, 2.0f}, {2, -1.0f}};
  p.repetition_penalty = 2.0f;
  p.repetition_window = 3;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  s.accept(4);
  s.accept(4);
  // The window holds 3, 4, 9 (9 is past the vocabulary); 1 fell out of it.
  auto draw = s.plan_draw({1, 1, 3, 4, 9}, 8);
  ASSERT_TRUE(draw.has_value());
  ASSERT_EQ(draw->adjust.size(), 3u);
  EXPECT_EQ(draw->adjust[0].token, 2);
  EXPECT_EQ(draw->adjust[0].bias, -1.0f);
  EXPECT_EQ(draw->adjust[0].repeat, 0);
  EXPECT_EQ(draw->adjust[1].token, 3);
  EXPECT_EQ(draw->adjust[1].repeat, 1);
  EXPECT_EQ(draw->adjust[1].subtract, 0.0f);
  EXPECT_EQ(draw->adjust[2].token, 4);
  EXPECT_EQ(draw->adjust[2].bias, 2.0f);
  EXPECT_EQ(draw->adjust[2].repeat, 1);
  EXPECT_EQ(draw->adjust[2].subtract, 0.25f * 2 + 0.5f);
  EXPECT_EQ(draw->row.temperature, 1.0f);
  EXPECT_EQ(draw->row.repetition_penalty, 2.0f);
  EXPECT_GE(draw->row.uniform, 0.0);
  EXPECT_LT(draw->row.uniform, 1.0);
}

// -0 and +0 are equal logits to the host sampler, so the lower id wins their tie, greedy or drawn.
TEST(SampleRows, MinusZeroAndZeroAreOneValue) {
  std::vector<float> x(16, -4.0f);
  x[2] = -0.0f;
  x[5] = 0.0f;
  for (float temperature : {0.0f, 1.0f}) {
    kernels::SampleRow row;
    row.temperature = temperature;
    row.top_k = 1;  // only the top of the order: the tie's first
    row.uniform = 0.5;
    int32_t token = -1;
    float logprob = 0;
    kernels::ref_sample_rows(x.data(), 16, &row, 1, nullptr, &token, &logprob);
    EXPECT_EQ(token, 2) << "temperature " << temperature;
    SamplingParams p;
    p.temperature = temperature;
    p.top_k = 1;
    Sampler host(p);
    std::vector<float> logits = x;  // the host sampler adjusts its row in place
    EXPECT_EQ(host.sample(logits.data(), 16, {}), 2) << "temperature " << temperature;
  }
}

TEST(SampleRows, ABiasNamingATokenTwiceStaysOnTheHost) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.logit_bias = {{4, 2.0f}, {4, 1.0f}};
  Sampler s(p);
  EXPECT_FALSE(s.plan_draw({}, 8).has_value());
}

// Backend::sample_rows' default downloads the rows it samples, wherever they are in the logits.
TEST(SampleRows, TheBackendSamplesTheRowsItIsGiven) {
  auto backend = make_cpu_backend(1);
  const int32_t n_vocab = 300;
  std::mt19937 rng(9);
  std::vector<float> logits;
  for (int r = 0; r < 4; ++r) {
    auto row = logits_like_a_model(n_vocab, rng, false);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  float* device = backend->alloc(logits.size());
  backend->upload(device, logits.data(), logits.size());
  std::vector<kernels::SampleRow> rows(2);
  rows[0].logits_row = 3;
  rows[0].temperature = 1.0f;
  rows[0].uniform = 0.4;
  rows[1].logits_row = 1;
  rows[1].temperature = 0.0f;
  rows[1].adjust_begin = 0;
  rows[1].adjust_end = 1;
  const kernels::LogitAdjust ban{7, -1000.0f, 0, 0.0f};
  std::vector<int32_t> got(2);
  std::vector<float> got_logprob(2);
  backend->sample_rows(device, n_vocab, rows.data(), 2, &ban, 1, got.data(), got_logprob.data());
  std::vector<int32_t> want(2);
  std::vector<float> want_logprob(2);
  kernels::ref_sample_rows(logits.data(), n_vocab, rows.data(), 2, &ban, want.data(), want_logprob.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_logprob, want_logprob);
  // Row 1 is greedy: its argmax unless that is the banned token 7.
  std::vector<float> row1(logits.begin() + n_vocab, logits.begin() + 2 * n_vocab);
  row1[7] -= 1000.0f;
  EXPECT_EQ(got[1], std::max_element(row1.begin(), row1.end()) - row1.begin());
  backend->free(device);
}

}  // namespace
}  // namespace helios
