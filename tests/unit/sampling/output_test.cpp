// The output path from a row's top-1 alone (what a greedy request reads when the logits stay on
// the device) against the same path from the whole row, on SmolLM2's real vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "helios/gguf.h"
#include "helios/output.h"
#include "kernels/kernels.h"
#include "test_paths.h"

namespace helios {
namespace {

std::unique_ptr<Tokenizer> default_tokenizer() {
  const std::string path = testing::default_model_path();
  EXPECT_TRUE(std::filesystem::exists(path)) << "no model at " << path << ": run scripts/fetch_model.sh";
  auto file = GgufFile::open(path);
  EXPECT_TRUE(file.ok()) << file.status().to_string();
  auto spec = tokenizer_spec_from_gguf(**file);
  EXPECT_TRUE(spec.ok()) << spec.status().to_string();
  auto tok = Tokenizer::create(std::move(*spec));
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return tok.ok() ? std::move(*tok) : nullptr;
}

TEST(RequestOutput, OnlyPlainGreedyReadsTheTop1Alone) {
  auto tok = default_tokenizer();
  ASSERT_NE(tok, nullptr);
  OutputOptions plain;
  EXPECT_TRUE(RequestOutput(*tok, plain).reads_only_top1());
  plain.top_logprobs = 0;  // the taken token's logprob: log(top1_prob)
  EXPECT_TRUE(RequestOutput(*tok, plain).reads_only_top1());
  plain.stop = {"\n"};     // stops read the text, not the logits
  plain.stop_token_ids = {5};
  EXPECT_TRUE(RequestOutput(*tok, plain).reads_only_top1());
  auto with = [&](auto change) {
    OutputOptions o;
    change(o);
    return RequestOutput(*tok, o).reads_only_top1();
  };
  EXPECT_FALSE(with([](OutputOptions& o) { o.sampling.temperature = 0.7f; }));
  EXPECT_FALSE(with([](OutputOptions& o) { o.top_logprobs = 3; }));
  EXPECT_FALSE(with([](OutputOptions& o) { o.sampling.logit_bias = {{7, 2.0f}}; }));
  EXPECT_FALSE(with([](OutputOptions& o) { o.sampling.repetition_penalty = 1.1f; }));
  EXPECT_FALSE(with([](OutputOptions& o) { o.sampling.presence_penalty = 0.5f; }));
  EXPECT_FALSE(with([](OutputOptions& o) { o.sampling.frequency_penalty = 0.5f; }));
  EXPECT_FALSE(with([](OutputOptions& o) { o.json_grammars = {JsonGrammar::any_object()}; }));
}

// Random rows, some with ties for the top: the same tokens, text, stops and finish either way,
// and the logprob within float rounding.
TEST(RequestOutput, TakingTheTop1EqualsTakingTheRow) {
  auto tok = default_tokenizer();
  ASSERT_NE(tok, nullptr);
  const int32_t n_vocab = tok->n_vocab();
  OutputOptions opt;
  opt.max_tokens = 200;
  opt.stop = {"ing"};
  RequestOutput whole(*tok, opt), top1(*tok, opt);
  std::mt19937 rng(9);
  std::normal_distribution<float> noise(0.0f, 2.0f);
  std::vector<float> logits(n_vocab);
  std::vector<TokenId> history = {1};
  int steps = 0;
  while (whole.finish() == FinishReason::kNone) {
    for (float& l : logits) l = noise(rng);
    // ordinary tokens (past the special ones at the start) on top, tied every third step
    logits[1000 + (steps * 7919) % (n_vocab - 1000)] = 12.0f;
    if (steps % 3 == 0) logits[1000 + (steps * 104729) % (n_vocab - 1000)] = 12.0f;  // the lower id wins
    logits[tok->eos()] = -50.0f;
    int32_t best = 0;
    float p1 = 0, margin = 0, entropy = 0;
    kernels::ref_exit_stats(logits.data(), 1, n_vocab, &best, &p1, &margin, &entropy);
    const TokenEvent a = whole.take(logits.data(), n_vocab, history, 3, 0.5f);
    const TokenEvent b = top1.take_top1(best, p1, 3, 0.5f);
    ASSERT_EQ(a.id, b.id) << "step " << steps;
    EXPECT_EQ(a.text, b.text);
    EXPECT_NEAR(a.logprob, b.logprob, 1e-5f);
    EXPECT_EQ(b.exit_layer, 3);
    EXPECT_EQ(whole.finish(), top1.finish());
    history.push_back(a.id);
    ++steps;
  }
  EXPECT_GT(steps, 1);
}

// Top log-probabilities follow the sampler's order: highest first, ties to the lower id, and a NaN
// logit (as −inf) never above a number; the taken token is the first of them when greedy.
TEST(RequestOutput, TopLogprobsPassOverNanAndBreakTiesByTheLowerId) {
  OutputOptions four;
  four.top_logprobs = 4;
  auto tok = default_tokenizer();
  ASSERT_NE(tok, nullptr);
  RequestOutput out(*tok, four);
  std::vector<float> logits(tok->n_vocab(), -5.0f);
  for (TokenId t : {1500, 1300, 1200, 1100, 1400}) logits[t] = 7.0f;  // a tie of five: the lowest ids
  for (TokenId t : {0, 2, 1000, 2000}) logits[t] = NAN;  // among the first k the sort looks at, too
  const TokenEvent ev = out.take(logits.data(), tok->n_vocab(), {1}, 0, 0.0f);
  EXPECT_EQ(ev.id, 1100);
  ASSERT_EQ(ev.top_logprobs.size(), 4u);
  const std::vector<TokenId> want = {1100, 1200, 1300, 1400};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(ev.top_logprobs[i].first, want[i]) << "place " << i;
    EXPECT_TRUE(std::isfinite(ev.top_logprobs[i].second)) << "place " << i;
  }
  EXPECT_FLOAT_EQ(ev.top_logprobs[0].second, ev.logprob);
}

}  // namespace
}  // namespace helios
