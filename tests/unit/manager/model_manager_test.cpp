// The model manager's decisions, driven with made-up engines' reports: Top-K selection, the PHT
// and its exit profile, the loaded depth, CBC, extend vs switch, re-assessment.
#include "helios/model_manager.h"

#include <gtest/gtest.h>

#include <cmath>

#include "helios/model_tools.h"
#include "test_paths.h"

namespace helios {
namespace {

// A model of `layers` equal layers of `layer_mib` MiB each plus `shared_mib` MiB.
CandidateModel candidate(const std::string& name, int32_t layers, int64_t layer_mib, int64_t shared_mib,
                         std::vector<int32_t> exits, double tok_s = 0) {
  CandidateModel m;
  m.name = name;
  m.footprint.shared_bytes = shared_mib << 20;
  m.footprint.shared_params = (shared_mib << 20) * 2;
  m.footprint.layer_bytes.assign(layers, layer_mib << 20);
  m.footprint.layer_params.assign(layers, (layer_mib << 20) * 2);
  m.exits = std::move(exits);
  m.telemetry.throughput_tok_s = tok_s;
  m.kv_bytes_per_token = 1 << 10;
  return m;
}

// A finished request: `tokens` tokens over `decode_s`, every token with these exit confidences.
RequestRecord record(int32_t tokens, double decode_s, std::vector<float> confidences, double logprob_each = -1.0) {
  RequestRecord r;
  r.completion_tokens = tokens;
  r.ttft_s = 0.1;
  r.decode_s = decode_s;
  r.sum_logprob = logprob_each * tokens;
  if (!confidences.empty()) r.exit_confidence.assign(tokens, confidences);
  return r;
}

TEST(ModelFootprint, SplitsTheFileIntoSharedAndPerLayerBytes) {
  SyntheticModelSpec s;
  s.n_layer = 3;
  const std::string path = testing::temp_dir() + "/footprint.gguf";
  ASSERT_TRUE(make_synthetic_model(s, path).ok());
  auto f = model_footprint(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_EQ(f->n_layers(), 3);
  EXPECT_EQ(f->layer_bytes[0], f->layer_bytes[2]);  // equal shapes
  EXPECT_GT(f->shared_bytes, 0);                     // the embeddings and the final norm
  EXPECT_EQ(f->bytes_at_depth(0), f->shared_bytes);
  EXPECT_EQ(f->bytes_at_depth(2), f->shared_bytes + 2 * f->layer_bytes[0]);
  EXPECT_EQ(f->params_at_depth(3), s.n_params());
  EXPECT_FALSE(model_footprint(testing::temp_dir() + "/missing.gguf").ok());
}

TEST(TokenizerDifference, SameVocabularyIsEqualAndAnotherNamesBothFiles) {
  SyntheticModelSpec a, b, c;
  b.n_layer = 4;
  b.seed = 9;  // other weights, same byte-level vocabulary
  c.n_vocab = 300;
  const std::string dir = testing::temp_dir();
  ASSERT_TRUE(make_synthetic_model(a, dir + "/tok_a.gguf").ok());
  ASSERT_TRUE(make_synthetic_model(b, dir + "/tok_b.gguf").ok());
  ASSERT_TRUE(make_synthetic_model(c, dir + "/tok_c.gguf").ok());
  auto same = tokenizer_difference(dir + "/tok_a.gguf", dir + "/tok_b.gguf");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, "");
  auto other = tokenizer_difference(dir + "/tok_a.gguf", dir + "/tok_c.gguf");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->find("tok_a.gguf"), std::string::npos) << *other;
  EXPECT_NE(other->find("tok_c.gguf"), std::string::npos) << *other;
}

TEST(SelectCandidates, RanksByTheSloWithinTheBudget) {
  std::vector<CandidateModel> repo = {candidate("small", 4, 10, 10, {2}, 80), candidate("big", 8, 40, 20, {4}, 20),
                                      candidate("mid", 6, 20, 10, {3}, 50)};
  repo[0].telemetry.perplexity = 12;
  repo[1].telemetry.perplexity = 6;
  repo[2].telemetry.perplexity = 8;
  auto by_speed = select_candidates(repo, SloMode::kThroughput, 3, 1LL << 40, 16);
  ASSERT_TRUE(by_speed.ok());
  EXPECT_EQ(*by_speed, (std::vector<size_t>{0, 2, 1}));
  auto by_quality = select_candidates(repo, SloMode::kAccuracy, 2, 1LL << 40, 16);
  ASSERT_TRUE(by_quality.ok());
  EXPECT_EQ(*by_quality, (std::vector<size_t>{1, 2}));  // top 2
  auto by_energy = select_candidates(repo, SloMode::kEnergy, 3, 1LL << 40, 16);
  ASSERT_TRUE(by_energy.ok());
  EXPECT_EQ(by_energy->front(), 0u);  // the fewest bytes to read per token
  // big needs 340 MiB: a 200 MiB budget leaves it out.
  auto fits = select_candidates(repo, SloMode::kAccuracy, 3, 200LL << 20, 16);
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(*fits, (std::vector<size_t>{2, 0}));
  auto none = select_candidates(repo, SloMode::kThroughput, 3, 10LL << 20, 16);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("memory_budget"), std::string::npos);
}

TEST(PerformanceHistory, ExitProfileCountsATokenFromItsFirstConfidentExit) {
  PerformanceHistory pht;
  PhtRow& r = pht.row("m", 8);
  r.exits = {2, 4, 6};
  r.leave_by_exit.assign(3, 0);
  pht.record("m", 8, record(4, 0.4, {0.95f, 0.1f, 0.1f}), 0.9f, 1);  // leaves at 2
  pht.record("m", 8, record(4, 0.4, {0.1f, 0.1f, 0.92f}), 0.9f, 1);  // leaves at 6
  pht.record("m", 8, record(2, 0.2, {0.1f, 0.1f, 0.1f}), 0.9f, 1);   // never
  const PhtRow* row = pht.find("m", 8);
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->observed_tokens, 10);
  EXPECT_DOUBLE_EQ(row->leave_share(2), 0.4);
  EXPECT_DOUBLE_EQ(row->leave_share(4), 0.4);
  EXPECT_DOUBLE_EQ(row->leave_share(6), 0.8);
  EXPECT_EQ(row->requests, 3);
  EXPECT_EQ(row->decode_tokens, 7);
  EXPECT_NEAR(row->throughput_tok_s(), 7 / 1.0, 1e-9);
  EXPECT_NEAR(row->perplexity(), std::exp(1.0), 1e-9);
  EXPECT_EQ(choose_depth(*row, 8, 0.74), 6);
  EXPECT_EQ(choose_depth(*row, 8, 0.4), 2);
  EXPECT_EQ(choose_depth(*row, 8, 0.9), 8) << "no exit serves 90%: every layer";
}

TEST(BreachCounter, CountsOverASlidingWindow) {
  BreachCounter cbc(4, 2);
  EXPECT_FALSE(cbc.add(true));
  EXPECT_FALSE(cbc.add(true));
  EXPECT_FALSE(cbc.add(false));
  EXPECT_FALSE(cbc.add(false));
  EXPECT_FALSE(cbc.add(true));   // the first breach slid out: 2 in the window
  EXPECT_EQ(cbc.breaches(), 2);
  EXPECT_FALSE(cbc.add(true));   // and the second: still 2
  EXPECT_TRUE(cbc.add(true));    // 3 > CBCmax
  cbc.reset();
  EXPECT_EQ(cbc.breaches(), 0);
  EXPECT_EQ(cbc.tokens_seen(), 0);
}

TEST(EnergyEstimate, GrowsWithBytesAndShrinksWithTheBatch) {
  constexpr int64_t kGiB = 1LL << 30;
  EXPECT_GT(estimate_joules_per_token(2 * kGiB, kGiB, 1), estimate_joules_per_token(kGiB, kGiB / 2, 1));
  EXPECT_GT(estimate_joules_per_token(kGiB, kGiB / 2, 1), estimate_joules_per_token(kGiB, kGiB / 2, 8));
  // 1 GiB at batch 1 and 0.5 G weights: 0.268 J + 2.47 mJ.
  EXPECT_NEAR(estimate_joules_per_token(kGiB, kGiB / 2, 1), 1073741824 * 250e-12 + 2.0 * 536870912 * 2.3e-12, 1e-9);
}

ManagerParams small_params() {
  ManagerParams p;
  p.evaluation_requests = 2;
  p.threshold = 0.9f;
  p.prefix_coverage = 0.7;
  p.cbc_window = 10;
  p.cbc_max = 5;
  p.reassess_every = 6;
  return p;
}

// Evaluates both candidates: `a` is fast and confident at its exit 4; `b` is slow.
ModelManager evaluated_manager(std::vector<Decision>* decisions) {
  ModelManager m({candidate("a", 8, 10, 10, {4, 6}), candidate("b", 12, 30, 10, {6, 9})}, small_params());
  for (int i = 0; i < 4; ++i) {
    auto [target, d] = m.route();
    if (d) decisions->push_back(*d);
    EXPECT_TRUE(target.observe);
    EXPECT_EQ(target.candidate, static_cast<size_t>(i / 2)) << "request " << i;
    EXPECT_EQ(target.depth, i < 2 ? 8 : 12);
    const bool fast = target.candidate == 0;
    auto done = m.on_finished(target, record(10, fast ? 0.5 : 2.0, fast ? std::vector<float>{0.95f, 0.99f}
                                                                          : std::vector<float>{0.2f, 0.95f}), 1);
    if (done) decisions->push_back(*done);
  }
  return m;
}

TEST(ModelManager, EvaluatesEachCandidateThenServesTheBestAtItsCoveringPrefix) {
  std::vector<Decision> decisions;
  ModelManager m = evaluated_manager(&decisions);
  ASSERT_EQ(decisions.size(), 3u);
  EXPECT_EQ(decisions[0].kind, DecisionKind::kEvaluate);
  EXPECT_EQ(decisions[1].kind, DecisionKind::kEvaluate);
  EXPECT_EQ(decisions[1].target.candidate, 1u);
  EXPECT_EQ(decisions[2].kind, DecisionKind::kChoose);
  EXPECT_FALSE(m.evaluating());
  EXPECT_EQ(m.current().candidate, 0u) << "a: 18 tok/s beats b's 4.5";
  EXPECT_EQ(m.current().depth, 4) << "every token of a left by exit 4";
  EXPECT_FALSE(m.current().observe);
  EXPECT_NE(decisions[2].reason.find("tok/s"), std::string::npos) << decisions[2].reason;
  const PhtRow* row = m.history().find("a", 8);
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->requests, 2);
  EXPECT_DOUBLE_EQ(row->leave_share(4), 1.0);
  auto [next, d] = m.route();
  EXPECT_FALSE(d.has_value());
  EXPECT_EQ(next.depth, 4);
}

TEST(ModelManager, AccuracySloPicksTheLowerPerplexity) {
  ManagerParams p = small_params();
  p.slo = SloMode::kAccuracy;
  ModelManager m({candidate("a", 8, 10, 10, {4}), candidate("b", 8, 10, 10, {4})}, p);
  for (int i = 0; i < 4; ++i) {
    auto [t, d] = m.route();
    m.on_finished(t, record(10, 1.0, {0.5f}, t.candidate == 0 ? -2.0 : -1.0), 1);
  }
  EXPECT_FALSE(m.evaluating());
  EXPECT_EQ(m.current().candidate, 1u);
  EXPECT_EQ(m.current().depth, 8) << "50% confident at exit 4 is short of the 70% coverage";
}

TEST(ModelManager, BreachesBeyondCbcMaxExtendWhenTheDeeperPrefixIsCheaper) {
  std::vector<Decision> decisions;
  ModelManager m = evaluated_manager(&decisions);
  const ServingTarget t = m.route().first;
  ASSERT_EQ(t.depth, 4);
  // 5 breaches in a window of 10 is the maximum; the 6th crosses it.
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(m.on_token(t, 0.5f, 1).has_value());
  EXPECT_EQ(m.breaches().breaches(), 5);
  EXPECT_FALSE(m.on_token(t, 0.95f, 1).has_value()) << "a confident token is no breach";
  auto d = m.on_token(t, 0.5f, 1);
  ASSERT_TRUE(d.has_value());
  // Extending a to its exit 6 keeps 70 MiB of weights; b at its covering exit 9, 280 MiB.
  EXPECT_EQ(d->kind, DecisionKind::kExtend);
  EXPECT_EQ(d->target.candidate, 0u);
  EXPECT_EQ(d->target.depth, 6);
  EXPECT_NE(d->reason.find("CBCmax 5"), std::string::npos) << d->reason;
  EXPECT_EQ(m.breaches().breaches(), 0) << "reset after the decision";
  // Tokens of the old target no longer count.
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(m.on_token(t, 0.1f, 1).has_value());
}

TEST(ModelManager, SwitchesWhenTheOtherCandidatesPrefixIsCheaper) {
  // a: 8 layers of 40 MiB, exits at 2 and 7; b: 8 layers of 5 MiB, all its tokens leave at 2.
  ModelManager m({candidate("a", 8, 40, 10, {2, 7}), candidate("b", 8, 5, 10, {2, 4})}, small_params());
  for (int i = 0; i < 4; ++i) {
    auto [t, d] = m.route();
    const bool a = t.candidate == 0;
    m.on_finished(t, record(10, a ? 0.5 : 1.0, a ? std::vector<float>{0.95f, 0.95f} : std::vector<float>{0.95f, 0.95f}), 1);
  }
  ASSERT_EQ(m.current().candidate, 0u);
  ASSERT_EQ(m.current().depth, 2);
  const ServingTarget t = m.current();
  std::optional<Decision> d;
  for (int i = 0; i < 6 && !d; ++i) d = m.on_token(t, 0.1f, 1);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind, DecisionKind::kSwitch) << d->reason;
  EXPECT_EQ(d->target.candidate, 1u);
  EXPECT_EQ(d->target.depth, 2);
}

TEST(ModelManager, FullDepthHasNoBreaches) {
  ModelManager m({candidate("a", 8, 10, 10, {4})}, small_params());
  for (int i = 0; i < 2; ++i) {
    auto [t, d] = m.route();
    m.on_finished(t, record(10, 1.0, {0.1f}), 1);
  }
  ASSERT_EQ(m.current().depth, 8);
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(m.on_token(m.current(), 0.0f, 1).has_value());
}

TEST(ModelManager, ReassessesEveryRiRequests) {
  std::vector<Decision> decisions;
  ModelManager m = evaluated_manager(&decisions);
  for (int i = 0; i < 6; ++i) {
    auto [t, d] = m.route();
    EXPECT_FALSE(d.has_value()) << "request " << i;
    m.on_finished(t, record(5, 0.2, {}), 1);
  }
  auto [t, d] = m.route();  // the 7th since the choice: RI = 6 reached
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind, DecisionKind::kReassess);
  EXPECT_TRUE(m.evaluating());
  EXPECT_TRUE(t.observe);
  EXPECT_EQ(t.candidate, 0u);
  EXPECT_EQ(m.history().find("a", 8)->requests, 0) << "the evaluation rows start afresh";
  EXPECT_EQ(m.history().find("a", 4)->requests, 6) << "the served prefix keeps its history";
}

}  // namespace
}  // namespace helios
