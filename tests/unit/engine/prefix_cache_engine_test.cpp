// Prefix caching in the engine: a request whose prompt starts with an earlier one's prompt and
// output reuses those blocks, and greedy outputs are the same with the cache on and off — under
// every exit policy, under preemption, and for sessions whose discarded context comes back.
#include <gtest/gtest.h>

#include "unit/engine/engine_test_util.h"

namespace helios {
namespace {

using testing::drain;
using testing::engine_options;
using testing::kStoryPrompts;
using testing::make_generation;
using testing::Served;

ExitRule rule_of(ExitPolicy policy) {
  ExitRule r;
  r.policy = policy;
  r.threshold = 0.5f;
  r.depth = policy == ExitPolicy::kFixedDepth ? 3 : 0;
  return r;
}

// Two turns of four conversations: the second turn's prompt is the first's prompt, its output
// and a new line. Returns every output, in order.
std::vector<std::vector<TokenId>> two_turns(Served& s, const ExitRule& rule) {
  std::vector<std::vector<TokenId>> outputs;
  std::vector<std::vector<TokenId>> contexts;
  for (int turn = 0; turn < 2; ++turn) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r = make_generation(*s.model, "t" + std::to_string(turn) + "-" + std::to_string(i),
                                            kStoryPrompts[i], rule, 0.0f, 40);
      if (turn == 1) {
        r.prompt = contexts[i];
        auto more = s.model->tokenizer().encode(" The next day", false, false);
        r.prompt.insert(r.prompt.end(), more.begin(), more.end());
      }
      auto stream = s.engine->submit(r);
      EXPECT_TRUE(stream.ok()) << stream.status().message();
      if (!stream.ok()) return outputs;
      streams.push_back(*stream);
      if (turn == 0) contexts.push_back(r.prompt);
    }
    for (int i = 0; i < 4; ++i) {
      auto out = drain(*streams[i]);
      EXPECT_TRUE(out.error.empty()) << out.error;
      if (turn == 0) contexts[i].insert(contexts[i].end(), out.ids.begin(), out.ids.end());
      outputs.push_back(out.ids);
    }
  }
  return outputs;
}

TEST(PrefixCacheEngine, SecondTurnsHitTheCacheAndGenerateWhatTheyWouldWithout) {
  for (ExitPolicy policy : {ExitPolicy::kFull, ExitPolicy::kPerToken, ExitPolicy::kFixedDepth, ExitPolicy::kBatchSync}) {
    EngineOptions on = engine_options(64), off = engine_options(64);
    off.prefix_caching = false;
    Served cached(on), uncached(off);
    ASSERT_TRUE(cached.engine && uncached.engine);
    EXPECT_EQ(two_turns(cached, rule_of(policy)), two_turns(uncached, rule_of(policy)))
        << exit_policy_name(policy);
    const PrefixCacheStats stats = cached.engine->status().prefix_cache;
    EXPECT_TRUE(stats.enabled);
    EXPECT_GT(stats.query_blocks, 0);
    // Full depth: every prompt block and the full-depth output blocks are found again.
    if (policy == ExitPolicy::kFull) {
      EXPECT_GE(stats.hit_blocks, 8) << "hits " << stats.hit_blocks;
    }
    EXPECT_EQ(uncached.engine->status().prefix_cache.hit_blocks, 0);
  }
}

TEST(PrefixCacheEngine, TheSamePromptAgainComputesOnlyItsLastBlock) {
  Served s(engine_options(64));
  ASSERT_TRUE(s.engine);
  GenerationRequest r = make_generation(*s.model, "a", "", ExitRule{}, 0.0f, 4);
  for (int i = 0; i < 40; ++i) r.prompt.push_back(300 + i);
  auto first = s.engine->submit(r);
  ASSERT_TRUE(first.ok());
  const auto a = drain(**first);
  r.client_id = "b";
  auto second = s.engine->submit(r);
  ASSERT_TRUE(second.ok());
  const auto b = drain(**second);
  EXPECT_EQ(a.ids, b.ids);
  const PrefixCacheStats stats = s.engine->status().prefix_cache;
  EXPECT_EQ(stats.hit_blocks, 2);  // 40 prompt tokens: two full blocks of 16 before the last token
  EXPECT_EQ(stats.hit_tokens, 32);
}

// A self-speculative request's prompt ran plain passes: its blocks are published (its generated
// ones, from speculative rounds, are not), and a request of any policy finds them.
TEST(PrefixCacheEngine, ASelfSpeculativePromptIsCachedItsDraftsAreNot) {
  Served s(engine_options(64));
  ASSERT_TRUE(s.engine);
  ExitRule spec;
  spec.policy = ExitPolicy::kSelfSpeculative;
  spec.depth = 2;
  spec.threshold = 0.0f;
  GenerationRequest r = make_generation(*s.model, "spec", "", spec, 0.0f, 40);
  for (int i = 0; i < 40; ++i) r.prompt.push_back(300 + i);
  auto first = s.engine->submit(r);
  ASSERT_TRUE(first.ok());
  const auto a = drain(**first);
  EXPECT_GT(s.engine->status().draft_tokens_total, 0);
  // The prompt and its output again, under full: only the two whole prompt blocks are found.
  GenerationRequest again = make_generation(*s.model, "full", "", ExitRule{}, 0.0f, 4);
  again.prompt = r.prompt;
  again.prompt.insert(again.prompt.end(), a.ids.begin(), a.ids.end());
  auto second = s.engine->submit(again);
  ASSERT_TRUE(second.ok());
  drain(**second);
  const PrefixCacheStats stats = s.engine->status().prefix_cache;
  EXPECT_EQ(stats.hit_blocks, 2);  // blocks 0-31 of the prompt; 32-47 holds drafted rows
  EXPECT_EQ(stats.hit_tokens, 32);
}

TEST(PrefixCacheEngine, PreemptionWithTheCacheChangesNothing) {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    EngineOptions tight = engine_options(10, 512, mode, 64), roomy = engine_options(64);
    roomy.prefix_caching = false;
    Served small(tight), big(roomy);
    ASSERT_TRUE(small.engine && big.engine);
    EXPECT_EQ(two_turns(small, ExitRule{}), two_turns(big, ExitRule{}));
    EXPECT_GT(small.engine->status().preemptions, 0);
    EXPECT_EQ(small.engine->status().kv_blocks_used, 0);
  }
}

}  // namespace
}  // namespace helios
