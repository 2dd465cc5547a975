// Observe mode in the engine: a request that asks gets, per generated token, what the exit head
// at every exit point below the loaded depth said (the top-1 fixed-depth decoding there would
// pick after the same tokens), its tokens are those it gets without observe mode, and the
// requests sharing its steps that did not ask get their usual tokens and no observations.
#include <gtest/gtest.h>

#include "unit/engine/engine_test_util.h"

namespace helios {
namespace {

using testing::drain;
using testing::engine_options;
using testing::kStoryPrompts;
using testing::make_generation;
using testing::Outcome;

const std::vector<int32_t> kExits = {1, 2, 3};  // of stories260K's 5 layers

GenerationRequest observing(GenerationRequest r) {
  r.observe_exits = true;
  return r;
}

Outcome serve(Engine& engine, GenerationRequest r) {
  auto stream = engine.submit(std::move(r));
  EXPECT_TRUE(stream.ok()) << stream.status().message();
  return stream.ok() ? drain(**stream) : Outcome{};
}

// The exit head at `layer` on the last position of `tokens`, as fixed-depth decoding runs it.
ConfidenceStats fixed_depth_top1(Model& model, const std::vector<TokenId>& tokens, int32_t layer) {
  auto kv = KvCacheStorage::create(model.backend(), model.kv_config(), 8, 16);
  EXPECT_TRUE(kv.ok()) << kv.status().message();
  BlockAllocator blocks(8);
  BlockTable table;
  EXPECT_TRUE(reserve_tokens(blocks, table, static_cast<int32_t>(tokens.size()), 16));
  ForwardBatch batch;
  SequenceBatchEntry e;
  e.tokens = tokens;
  e.blocks = &table;
  e.exit.policy = ExitPolicy::kFixedDepth;
  e.exit.depth = layer;
  batch.seqs.push_back(e);
  auto fr = model.forward(batch, *kv);
  EXPECT_TRUE(fr.ok()) << fr.status().message();
  if (!fr.ok()) return {};
  EXPECT_EQ(fr->row_exit_layer[0], layer);
  return confidence_stats(fr->row(0), fr->n_vocab);
}

TEST(ObserveEngine, ObservesEveryExitAsFixedDepthWouldWithoutChangingTheTokens) {
  testing::Served s(engine_options(256), kExits);
  const GenerationRequest plain = make_generation(*s.model, "plain", kStoryPrompts[0], {}, 0.0f);
  const Outcome alone = serve(*s.engine, plain);
  ASSERT_EQ(alone.ids.size(), 48u);
  for (const auto& seen : alone.observed) EXPECT_TRUE(seen.empty());

  // Side by side, so the steps run in observe mode for both.
  GenerationRequest beside = plain;
  beside.client_id = "beside";
  auto a = s.engine->submit(observing(make_generation(*s.model, "observed", kStoryPrompts[0], {}, 0.0f)));
  auto b = s.engine->submit(beside);
  ASSERT_TRUE(a.ok() && b.ok());
  const Outcome observed = drain(**a), other = drain(**b);
  EXPECT_EQ(observed.ids, alone.ids) << "observe mode changed the tokens";
  EXPECT_EQ(other.ids, alone.ids) << "observe mode changed a request that did not ask for it";
  for (const auto& seen : other.observed) EXPECT_TRUE(seen.empty());
  ASSERT_EQ(observed.observed.size(), observed.ids.size());

  s.engine.reset();  // the model is the test's alone now
  std::vector<TokenId> tokens = plain.prompt;
  for (size_t j = 0; j < observed.ids.size(); ++j) {
    ASSERT_EQ(observed.observed[j].size(), kExits.size()) << "token " << j;
    for (size_t e = 0; e < kExits.size(); ++e) {
      const ConfidenceStats want = fixed_depth_top1(*s.model, tokens, kExits[e]);
      const ExitObservation& got = observed.observed[j][e];
      EXPECT_EQ(got.top1, want.top1) << "token " << j << ", exit " << kExits[e];
      EXPECT_NEAR(got.top1_prob, want.top1_prob, 1e-4) << "token " << j << ", exit " << kExits[e];
    }
    tokens.push_back(observed.ids[j]);
  }
}

TEST(ObserveEngine, ARowThatLeftEarlyHasNoObservationsPastItsExit) {
  // Threshold 0: every row leaves at layer 1, so a decode step has no token left to observe at 2
  // and 3; the token still has an entry for each exit point, empty (top1 -1) past layer 1.
  testing::Served s(engine_options(256), kExits);
  ExitRule eager;
  eager.policy = ExitPolicy::kPerToken;
  eager.threshold = 0.0f;
  const Outcome plain = serve(*s.engine, make_generation(*s.model, "plain", kStoryPrompts[1], eager, 0.0f));
  const Outcome observed =
      serve(*s.engine, observing(make_generation(*s.model, "observed", kStoryPrompts[1], eager, 0.0f)));
  EXPECT_EQ(observed.ids, plain.ids);
  ASSERT_EQ(observed.observed.size(), observed.ids.size());
  for (size_t j = 0; j < observed.ids.size(); ++j) {
    EXPECT_EQ(observed.exit_layers[j], 1);
    ASSERT_EQ(observed.observed[j].size(), kExits.size()) << "token " << j;
    // At its exit the head's top-1 is the greedy token itself.
    EXPECT_EQ(observed.observed[j][0].top1, observed.ids[j]) << "token " << j;
    EXPECT_EQ(observed.observed[j][1].top1, -1) << "token " << j;
    EXPECT_EQ(observed.observed[j][2].top1, -1) << "token " << j;
  }
}

}  // namespace
}  // namespace helios
