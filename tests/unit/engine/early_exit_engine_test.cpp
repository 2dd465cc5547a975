// The engine with early exit: batched self-speculative requests give exactly the tokens of
// full-depth ones (greedy and seeded sampling, with other policies in the same steps), exit
// statistics add up, and a rule the model cannot run is refused at submit.
#include <gtest/gtest.h>

#include <filesystem>

#include "unit/engine/engine_test_util.h"

namespace helios {
namespace {

using testing::drain;
using testing::engine_options;
using testing::Outcome;

// stories260K with exits at 1, 2 and 3.
struct Served : testing::Served {
  explicit Served(int32_t n_kv_blocks = 256, int32_t max_batched_tokens = 512)
      : testing::Served(engine_options(n_kv_blocks, max_batched_tokens)) {}
};

GenerationRequest request(const Model& model, const std::string& id, const std::string& text, ExitRule rule,
                          float temperature) {
  return testing::make_generation(model, id, text, rule, temperature);
}

const auto& kPrompts = testing::kStoryPrompts;

TEST(EarlyExitEngine, BatchedSelfSpeculativeEqualsFull) {
  Served s;
  ExitRule spec;
  spec.policy = ExitPolicy::kSelfSpeculative;
  spec.depth = 2;
  spec.draft_tokens = 3;
  ExitRule eager;  // per-token requests share the steps, leaving at layer 1
  eager.policy = ExitPolicy::kPerToken;
  eager.threshold = 0.0f;
  for (float temperature : {0.0f, 0.9f}) {
    std::vector<std::shared_ptr<RequestStream>> full, fast, other;
    int n = 0;
    for (const char* p : kPrompts) {
      const std::string tag = std::to_string(temperature) + "-" + std::to_string(n++);
      full.push_back(*s.engine->submit(request(*s.model, "full-" + tag, p, {}, temperature)));
      fast.push_back(*s.engine->submit(request(*s.model, "spec-" + tag, p, spec, temperature)));
      other.push_back(*s.engine->submit(request(*s.model, "eager-" + tag, p, eager, temperature)));
    }
    for (size_t i = 0; i < full.size(); ++i) {
      const Outcome a = drain(*full[i]), b = drain(*fast[i]), c = drain(*other[i]);
      EXPECT_EQ(a.ids.size(), 48u);
      EXPECT_EQ(a.ids, b.ids) << kPrompts[i] << " T " << temperature;
      for (int32_t l : a.exit_layers) EXPECT_EQ(l, 5);
      for (int32_t l : c.exit_layers) EXPECT_EQ(l, 1);
    }
  }
  const EngineStatus st = s.engine->status();
  EXPECT_GT(st.draft_tokens_total, 0);
  EXPECT_GT(st.draft_tokens_accepted, 0) << "equal to full because drafts were confirmed, not all thrown away";
  EXPECT_LE(st.draft_tokens_accepted, st.draft_tokens_total);
  int64_t counted = 0;
  for (int64_t n : st.exit_layer_counts) counted += n;
  EXPECT_EQ(counted, st.generated_tokens_total);
  EXPECT_EQ(st.exit_layer_counts[1], 2 * 4 * 48);  // the per-token requests
  EXPECT_GT(st.kv_fill_layers_total, 0);
}

// Drafting `drafts` every round (threshold 0) unless a threshold is given.
ExitRule speculative(int32_t depth, int32_t drafts, float threshold = 0.0f) {
  ExitRule r;
  r.policy = ExitPolicy::kSelfSpeculative;
  r.depth = depth;
  r.draft_tokens = drafts;
  r.threshold = threshold;
  return r;
}

// The four prompts, all in flight at once on one engine, greedy; their token ids.
std::vector<std::vector<TokenId>> serve_all(Served& s, const ExitRule& rule) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(*s.engine->submit(request(*s.model, std::to_string(i), kPrompts[i], rule, 0.0f)));
  std::vector<std::vector<TokenId>> ids;
  for (auto& stream : streams) ids.push_back(drain(*stream).ids);
  return ids;
}

TEST(EarlyExitEngine, SelfSpeculativeSurvivesAFullCache) {
  // 14 blocks, two fewer than the four requests hold at their longest (4 each): late rounds find
  // no blocks for their lookahead and draft less; the output holds.
  Served small(14);
  Served big;
  const auto full = serve_all(big, ExitRule{});
  EXPECT_EQ(serve_all(small, speculative(3, 8)), full);
  // The same requests with room for every lookahead: the full cache really cut the drafts.
  EXPECT_EQ(serve_all(big, speculative(3, 8)), full);
  const EngineStatus cut = small.engine->status(), roomy = big.engine->status();
  EXPECT_GT(cut.draft_tokens_accepted, 0) << "rounds that found blocks still speculated";
  EXPECT_LT(cut.draft_tokens_total, roomy.draft_tokens_total);
}

TEST(EarlyExitEngine, DraftsStayWithinTheStepTokenBudget) {
  // A budget of 6 tokens for 4 decoding sequences leaves 2 drafts a step in all: fewer drafts,
  // the same output.
  Served tight(256, 6);
  Served loose;
  EXPECT_EQ(serve_all(tight, speculative(3, 4)), serve_all(loose, speculative(3, 4)));
  EXPECT_LT(tight.engine->status().draft_tokens_total, loose.engine->status().draft_tokens_total);
}

TEST(EarlyExitEngine, DraftsOnlyWhileTheDraftHeadIsSure) {
  Served full_s, always_s, sure_s, never_s;
  const auto full = serve_all(full_s, ExitRule{});
  EXPECT_EQ(serve_all(always_s, speculative(3, 4)), full);
  EXPECT_EQ(serve_all(sure_s, speculative(3, 4, 0.5f)), full);
  EXPECT_EQ(serve_all(never_s, speculative(3, 4, 1.0f)), full);
  const EngineStatus always = always_s.engine->status(), sure = sure_s.engine->status(),
                     never = never_s.engine->status();
  EXPECT_GT(sure.draft_tokens_accepted, 0);
  EXPECT_LT(sure.draft_tokens_total, always.draft_tokens_total);
  EXPECT_GT(static_cast<double>(sure.draft_tokens_accepted) / sure.draft_tokens_total,
            static_cast<double>(always.draft_tokens_accepted) / always.draft_tokens_total);
  EXPECT_EQ(never.draft_tokens_total, 0);
  // Every token still counts its work: a round without drafts runs the stack once.
  EXPECT_EQ(never.layers_computed_total, never.generated_tokens_total * full_s.model->n_layers_loaded());
}

TEST(EarlyExitEngine, DraftsAmongTheFirstTokenIdsKeepTheOutput) {
  Served full_s, narrow_s, mixed_s;
  const auto full = serve_all(full_s, ExitRule{});
  ExitRule narrow = speculative(3, 4);
  narrow.draft_vocab = 448;  // of stories260K's 512, whose first 259 are special and byte tokens
  EXPECT_EQ(serve_all(narrow_s, narrow), full);
  EXPECT_GT(narrow_s.engine->status().draft_tokens_accepted, 0);
  // Requests with different draft vocabularies share a round's passes.
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    ExitRule r = speculative(3, 4);
    r.draft_vocab = i % 2 ? 384 : 0;
    streams.push_back(*mixed_s.engine->submit(request(*mixed_s.model, std::to_string(i), kPrompts[i], r, 0.0f)));
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(drain(*streams[i]).ids, full[i]) << kPrompts[i];
}

TEST(EarlyExitEngine, RefusesARuleTheModelCannotRun) {
  Served s;
  ExitRule probe;
  probe.policy = ExitPolicy::kPerToken;
  probe.measure = ConfidenceMeasure::kProbe;  // no calibrated probes
  auto r = s.engine->submit(request(*s.model, "x", "Hello", probe, 0.0f));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("probe"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace helios
