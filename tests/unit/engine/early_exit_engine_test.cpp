// The engine with early exit: batched self-speculative requests give exactly the tokens of
// full-depth ones (greedy and seeded sampling, with other policies in the same steps), exit
// statistics add up, and a rule the model cannot run is refused at submit.
#include <gtest/gtest.h>

#include <filesystem>

#include "helios/engine.h"
#include "test_paths.h"

namespace helios {
namespace {

struct Served {
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;

  explicit Served(const std::string& path, int32_t n_kv_blocks = 256, int32_t max_batched_tokens = 512) {
    auto m = Model::load(path, *backend);
    EXPECT_TRUE(m.ok()) << m.status().message();
    model = std::move(*m);
    EXPECT_TRUE(model->set_exits({1, 2, 3}, nullptr).ok());
    EngineOptions options;
    options.n_kv_blocks = n_kv_blocks;
    options.block_size = 16;
    options.scheduler.max_batched_tokens = max_batched_tokens;
    auto e = Engine::start(*model, options, nullptr);
    EXPECT_TRUE(e.ok()) << e.status().message();
    engine = std::move(*e);
  }
};

GenerationRequest request(const Model& model, const std::string& id, const std::string& text, ExitRule rule,
                          float temperature) {
  GenerationRequest r;
  r.client_id = id;
  r.prompt = model.tokenizer().encode(text, true, false);
  r.max_tokens = 48;
  r.ignore_eos = true;
  r.sampling.temperature = temperature;
  r.sampling.seed = 3;
  r.exit = rule;
  return r;
}

struct Outcome {
  std::vector<TokenId> ids;
  std::vector<int32_t> exit_layers;
  GenerationFinish finish = GenerationFinish::kNone;
};

Outcome drain(RequestStream& stream) {
  Outcome o;
  for (;;) {
    auto u = stream.pop(std::chrono::milliseconds(60000));
    if (!u) {
      ADD_FAILURE() << "stream timed out";
      return o;
    }
    for (const auto& t : u->tokens) {
      o.ids.push_back(t.id);
      o.exit_layers.push_back(t.exit_layer);
    }
    if (u->finish != GenerationFinish::kNone) {
      o.finish = u->finish;
      return o;
    }
  }
}

const char* kPrompts[] = {"Once upon a time", "The little dog ran", "Lily and Tom", "One day, a big bird"};

TEST(EarlyExitEngine, BatchedSelfSpeculativeEqualsFull) {
  const std::string path = testing::stories260k_path();
  Served s(path);
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

ExitRule speculative(int32_t depth, int32_t drafts) {
  ExitRule r;
  r.policy = ExitPolicy::kSelfSpeculative;
  r.depth = depth;
  r.draft_tokens = drafts;
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
  Served small(testing::stories260k_path(), 14);
  Served big(testing::stories260k_path());
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
  Served tight(testing::stories260k_path(), 256, 6);
  Served loose(testing::stories260k_path());
  EXPECT_EQ(serve_all(tight, speculative(3, 4)), serve_all(loose, speculative(3, 4)));
  EXPECT_LT(tight.engine->status().draft_tokens_total, loose.engine->status().draft_tokens_total);
}

TEST(EarlyExitEngine, RefusesARuleTheModelCannotRun) {
  const std::string path = testing::stories260k_path();
  Served s(path);
  ExitRule probe;
  probe.policy = ExitPolicy::kPerToken;
  probe.measure = ConfidenceMeasure::kProbe;  // no calibrated probes
  auto r = s.engine->submit(request(*s.model, "x", "Hello", probe, 0.0f));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("probe"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace helios
