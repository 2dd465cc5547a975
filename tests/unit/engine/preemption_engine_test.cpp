// Preemption does not change what a request generates: a recomputed sequence replays each
// generated token's exit layer, so its K/V (filled from exit states where the policy fills) is
// what it was; swap keeps the K/V itself. Full, per-token, fixed-depth and self-speculative give
// the same tokens and exits with and without preemption; batch-sync, whose exits depend on the
// requests sharing a step, gets the same K/V back. A request that can never fit the
// cache is refused with RESOURCE_EXHAUSTED, and the others finish.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "helios/kv_cache.h"
#include "helios/sampler.h"
#include "unit/engine/engine_test_util.h"

namespace helios {
namespace {

using testing::drain;
using testing::engine_options;
using testing::kStoryPrompts;
using testing::make_generation;
using testing::Outcome;
using testing::Served;

ExitRule rule_of(ExitPolicy policy, float threshold, int32_t depth) {
  ExitRule r;
  r.policy = policy;
  r.threshold = threshold;
  r.depth = depth;
  r.draft_tokens = 3;
  return r;
}

// The four prompts in flight at once, greedy.
std::vector<Outcome> serve_all(Served& s, const ExitRule& rule, int32_t max_tokens) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    auto stream = s.engine->submit(make_generation(*s.model, std::to_string(i), kStoryPrompts[i], rule, 0.0f, max_tokens));
    EXPECT_TRUE(stream.ok()) << stream.status().message();
    if (stream.ok()) streams.push_back(*stream);
  }
  std::vector<Outcome> out;
  for (auto& stream : streams) out.push_back(drain(*stream));
  return out;
}

// Exits at 2 and 3 of 5 layers: at a 0.9 threshold per-token and batch-sync rows leave at
// either or run to the end (the logit lens after one layer of stories260K is always confident).
const std::vector<int32_t> kExits = {2, 3};

// Batch-sync rows leave when every row of the step is confident, so a request's tokens depend on
// which requests share its steps, and a preemption changes that. What the replay guarantees is
// the K/V: a sequence decoded beside another under batch-sync, then recomputed alone as one
// prefill with its recorded exit layers, holds the same K/V at every layer and position.
TEST(EnginePreemption, BatchSyncRecomputeWithKnownExitsRebuildsTheSameKv) {
  auto backend = make_cpu_backend(1);
  auto loaded = Model::load(testing::stories260k_path(), *backend);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Model& model = **loaded;
  ASSERT_TRUE(model.set_exits(kExits, nullptr).ok());
  const ExitRule rule = rule_of(ExitPolicy::kBatchSync, 0.9f, 0);
  constexpr int32_t kBlock = 16, kBlocks = 16, kSteps = 40;
  const ModelConfig c = model.kv_config();
  auto kv = KvCacheStorage::create(*backend, c, kBlocks, kBlock);
  ASSERT_TRUE(kv.ok());
  BlockAllocator blocks(kBlocks);
  std::vector<std::vector<TokenId>> seqs = {model.tokenizer().encode(kStoryPrompts[0], true, false),
                                           model.tokenizer().encode(kStoryPrompts[2], true, false)};
  std::vector<BlockTable> tables(2);
  for (auto& t : tables) ASSERT_TRUE(reserve_tokens(blocks, t, 128, kBlock));
  std::vector<int32_t> exits_a;  // where each input of sequence 0 left, from its last prompt token
  for (int32_t step = 0; step < kSteps; ++step) {
    ForwardBatch batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      SequenceBatchEntry e;
      const int32_t start = step == 0 ? 0 : static_cast<int32_t>(seqs[i].size()) - 1;
      e.tokens.assign(seqs[i].begin() + start, seqs[i].end());
      e.start_pos = start;
      e.blocks = &tables[i];
      e.exit = rule;
      batch.seqs.push_back(std::move(e));
    }
    auto fr = model.forward(batch, *kv);
    ASSERT_TRUE(fr.ok()) << fr.status().message();
    for (size_t r = 0; r < fr->row_seq.size(); ++r) seqs[fr->row_seq[r]].push_back(argmax(fr->row(r), fr->n_vocab));
    exits_a.push_back(fr->row_exit_layer[0]);
  }
  const int32_t n_prompt = static_cast<int32_t>(model.tokenizer().encode(kStoryPrompts[0], true, false).size());
  ASSERT_GT(std::count_if(exits_a.begin(), exits_a.end(), [&](int32_t l) { return l < model.n_layers_loaded(); }), 0)
      << "no row left early: the test proves nothing";

  // Sequence 0 again, as one prefill of everything but its pending token, into a fresh cache.
  auto recompute = [&](bool replay) {
    auto kv2 = KvCacheStorage::create(*backend, c, kBlocks, kBlock);
    EXPECT_TRUE(kv2.ok());
    BlockAllocator blocks2(kBlocks);
    BlockTable table;
    EXPECT_TRUE(reserve_tokens(blocks2, table, 128, kBlock));
    ForwardBatch batch;
    SequenceBatchEntry e;
    e.tokens.assign(seqs[0].begin(), seqs[0].end() - 1);
    e.blocks = &table;
    e.logits = LogitsWanted::kNone;
    e.exit = rule;
    if (replay) {
      e.known_exit_layers.assign(n_prompt - 1, 0);
      e.known_exit_layers.insert(e.known_exit_layers.end(), exits_a.begin(), exits_a.end());
    }
    batch.seqs.push_back(std::move(e));
    EXPECT_TRUE(model.forward(batch, *kv2).ok());
    // The largest K/V difference over every layer and computed position.
    const int64_t per_block = kv->words_per_block(), row = c.kv_dim();
    std::vector<float> a(per_block), b(per_block);
    float worst = 0;
    const auto n_positions = static_cast<int32_t>(seqs[0].size()) - 1;
    for (int32_t pos = 0; pos < n_positions; ++pos) {
      kv->read_block(tables[0].block_ids[pos / kBlock], a.data());
      kv2->read_block(table.block_ids[pos / kBlock], b.data());
      for (int32_t l = 0; l < 2 * c.n_layer; ++l) {  // K then V of each layer
        const int64_t at = (static_cast<int64_t>(l) * kBlock + pos % kBlock) * row;
        for (int64_t j = 0; j < row; ++j) worst = std::max(worst, std::abs(a[at + j] - b[at + j]));
      }
    }
    return worst;
  };
  EXPECT_LT(recompute(true), 1e-4f) << "the replayed K/V is the K/V the decode wrote";
  EXPECT_GT(recompute(false), 1e-2f) << "a full-depth recompute gives other K/V: the replay is what makes it equal";
}

struct PolicyCase {
  const char* name;
  ExitRule rule;
};

std::vector<PolicyCase> policies() {
  return {{"full", rule_of(ExitPolicy::kFull, 0.9f, 0)},
          {"per-token", rule_of(ExitPolicy::kPerToken, 0.9f, 0)},
          {"fixed-depth", rule_of(ExitPolicy::kFixedDepth, 0.9f, 3)},
          {"self-speculative", rule_of(ExitPolicy::kSelfSpeculative, 0.9f, 2)}};
}

void expect_preemption_changes_nothing(PreemptionMode mode, int32_t n_swap_blocks,
                                       kernels::KvType kv_type = kernels::KvType::kF32) {
  constexpr int32_t kTokens = 60;  // 4 sequences of ~65 tokens: 5 blocks each, 20 in all
  for (const PolicyCase& p : policies()) {
    EngineOptions roomy_options = engine_options(64), tight_options = engine_options(12, 512, mode, n_swap_blocks);
    roomy_options.kv_type = tight_options.kv_type = kv_type;
    Served roomy(roomy_options, kExits);
    Served tight(tight_options, kExits);
    if (!roomy.engine || !tight.engine) return;
    const std::vector<Outcome> want = serve_all(roomy, p.rule, kTokens);
    const std::vector<Outcome> got = serve_all(tight, p.rule, kTokens);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(want[i].ids.size(), static_cast<size_t>(kTokens)) << p.name;
      EXPECT_EQ(got[i].ids, want[i].ids) << p.name << ": prompt " << kStoryPrompts[i];
      EXPECT_EQ(got[i].exit_layers, want[i].exit_layers) << p.name << ": prompt " << kStoryPrompts[i];
    }
    EXPECT_GT(tight.engine->status().preemptions, 0) << p.name << ": the cache was meant to run short";
    EXPECT_EQ(roomy.engine->status().preemptions, 0) << p.name;
  }
}

TEST(EnginePreemption, RecomputeGivesTheSameTokensAndExitsUnderEveryPolicy) {
  expect_preemption_changes_nothing(PreemptionMode::kRecompute, 0);
}

TEST(EnginePreemption, SwapGivesTheSameTokensAndExitsUnderEveryPolicy) {
  expect_preemption_changes_nothing(PreemptionMode::kSwap, 64);
}

// An f16 cache swaps its blocks as raw words, and recompute rewrites the same rounded values.
TEST(EnginePreemption, AnF16CacheSwapsAndRecomputesWithoutChangingTheTokens) {
  expect_preemption_changes_nothing(PreemptionMode::kSwap, 64, kernels::KvType::kF16);
  expect_preemption_changes_nothing(PreemptionMode::kRecompute, 0, kernels::KvType::kF16);
}

TEST(EnginePreemption, TheRulesThatReplayReallyLeaveEarly) {
  // Without early exits the replay above would prove nothing: the per-token and batch-sync runs
  // mix exit layers, and their deeper K/V comes from exit states.
  for (ExitPolicy policy : {ExitPolicy::kPerToken, ExitPolicy::kBatchSync}) {
    Served s(engine_options(64), kExits);
    if (!s.engine) return;
    const std::vector<Outcome> out = serve_all(s, rule_of(policy, 0.9f, 0), 60);
    int32_t early = 0, deep = 0;
    for (const Outcome& o : out) {
      for (int32_t l : o.exit_layers) (l < 5 ? early : deep) += 1;
    }
    EXPECT_GT(early, 0) << exit_policy_name(policy);
    EXPECT_GT(deep, 0) << exit_policy_name(policy);
    EXPECT_GT(s.engine->status().kv_fill_layers_total, 0) << exit_policy_name(policy);
  }
}

TEST(EnginePreemption, ARequestThatCanNeverFitIsRefusedAndTheOthersFinish) {
  // 4 blocks of 16 tokens: a request for 100 tokens never fits, one for 20 does.
  Served s(engine_options(4));
  if (!s.engine) return;
  auto big = s.engine->submit(make_generation(*s.model, "big", "Once upon a time", {}, 0.0f, 100));
  auto small = s.engine->submit(make_generation(*s.model, "small", "Lily and Tom", {}, 0.0f, 20));
  ASSERT_TRUE(big.ok() && small.ok());
  const Outcome refused = drain(**big), served = drain(**small);
  EXPECT_EQ(refused.finish, FinishReason::kAborted);
  EXPECT_EQ(refused.error_code, StatusCode::kResourceExhausted);
  EXPECT_NE(refused.error.find("KV cache cannot hold this request"), std::string::npos) << refused.error;
  EXPECT_EQ(served.finish, FinishReason::kLength);
  EXPECT_EQ(served.ids.size(), 20u);
}

}  // namespace
}  // namespace helios
