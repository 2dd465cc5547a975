// The lookahead head: its training pairs, its fit on stories260K, the sidecar that carries it, and
// self-speculative decoding at the model's depth drafting with it — full's tokens, greedy and
// sampled, from `generate` and from the engine with several requests in a step.
#include <gtest/gtest.h>

#include <filesystem>

#include "helios/calibrate.h"
#include "helios/generate.h"
#include "helios/model_setup.h"
#include "stories_model.h"
#include "unit/engine/engine_test_util.h"

namespace helios {
namespace {

TEST(LookaheadStates, PairEachPositionWithTheNextInItsSequence) {
  HiddenStates data;
  data.n_embd = 2;
  data.layers = {1, 3};
  data.states = {{}, {0, 0, 1, 1, 2, 2, 10, 10, 11, 11}};  // positions 0..2 of one sequence, 0..1 of another
  data.final_top1 = {5, 6, 7, 8, 9};
  data.sequence = {0, 0, 0, 1, 1};
  data.tokens = {20, 21, 22, 30, 31};
  const HiddenStates pairs = lookahead_states(data);
  EXPECT_EQ(pairs.layers, (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(pairs.states[0], (std::vector<float>{0, 0, 1, 1, 10, 10}));
  EXPECT_EQ(pairs.states[1], (std::vector<float>{1, 1, 2, 2, 11, 11}));
  EXPECT_EQ(pairs.final_top1, (std::vector<int32_t>{6, 7, 9}));  // the next position's top-1
  EXPECT_EQ(pairs.sequence, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(pairs.tokens, (std::vector<TokenId>{21, 22, 31}));  // the next input
}

// A lookahead head fitted on stories260K's calibration text (ridge only: a second or two).
struct Fitted {
  testing::StoriesModel s;
  CalibrationResult result;
  ExitHeadSet heads;

  static Fitted& get() {
    static Fitted f = [] {
      Fitted f;
      const auto sequences = make_token_sequences(f.s.model->tokenizer(), testing::calibration_documents(), 128, 4096);
      auto data = collect_hidden_states(*f.s.model, sequences, {});
      EXPECT_TRUE(data.ok()) << data.status().to_string();
      EXPECT_EQ(data->layers, (std::vector<int32_t>{5})) << "no exits: the last layer alone";
      auto fit = fit_lookahead_head(*f.s.model, *data, CalibrationOptions{});
      EXPECT_TRUE(fit.ok()) << fit.status().to_string();
      f.result = std::move(*fit);
      f.heads.model_name = f.s.model->config().name;
      f.heads.n_layer = f.s.model->config().n_layer;
      f.heads.n_embd = f.s.model->config().n_embd;
      f.heads.has_lookahead = true;
      f.heads.lookahead = f.result.heads.heads.at(0);
      return f;
    }();
    return f;
  }
};

TEST(LookaheadHead, GuessesTheTokenAfterNextBetterThanTheModelsOwnHead) {
  const Fitted& f = Fitted::get();
  ASSERT_EQ(f.result.exits.size(), 1u);
  const ExitCalibration& e = f.result.exits[0];
  EXPECT_TRUE(e.lookahead);
  EXPECT_EQ(e.layer, 5);
  EXPECT_EQ(f.heads.lookahead.layer, 5);
  const size_t dd = 64 * 64;
  EXPECT_EQ(f.heads.lookahead.adapter_weight.size(), dd);
  EXPECT_EQ(f.heads.lookahead.token_weight.size(), dd) << "it reads the next token too";
  // The "logit lens" here is the model's own head at t, guessing t + 2 as if it were t + 1.
  EXPECT_GT(e.adapter_agreement, e.lens_agreement + 0.05) << "ridge " << e.adapter_agreement << " lens " << e.lens_agreement;
  EXPECT_NE(calibration_table(f.result).find("5 (lookahead: t + 2)"), std::string::npos);
}

TEST(LookaheadHead, SidecarRoundTripsAndOldFilesHaveNone) {
  const Fitted& f = Fitted::get();
  const size_t dd = 64 * 64;
  const ModelConfig& c = f.s.model->config();
  const std::string path = testing::temp_dir() + "/stories.lookahead.exits.gguf";
  ASSERT_TRUE(save_exit_heads(f.heads, path).ok());
  auto loaded = load_exit_heads(path, c);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_TRUE(loaded->heads.empty());
  ASSERT_TRUE(loaded->has_lookahead);
  EXPECT_EQ(loaded->lookahead.layer, 5);
  EXPECT_EQ(loaded->lookahead.adapter_weight, f.heads.lookahead.adapter_weight);
  EXPECT_EQ(loaded->lookahead.adapter_bias, f.heads.lookahead.adapter_bias);
  EXPECT_EQ(loaded->lookahead.token_weight, f.heads.lookahead.token_weight);
  EXPECT_EQ(loaded->lookahead.kind, f.heads.lookahead.kind);
  // Beside exit heads, and a file without one loads without one.
  ExitHeadSet both = f.heads;
  ExitHeadParams exit2;
  exit2.layer = 2;
  both.heads.push_back(exit2);
  ASSERT_TRUE(save_exit_heads(both, path).ok());
  loaded = load_exit_heads(path, c);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->heads.size(), 1u);
  EXPECT_TRUE(loaded->has_lookahead);
  both.has_lookahead = false;
  ASSERT_TRUE(save_exit_heads(both, path).ok());
  loaded = load_exit_heads(path, c);
  ASSERT_TRUE(loaded.ok());
  EXPECT_FALSE(loaded->has_lookahead);
  // A lookahead head reads the last layer, nothing else; only it has a token map.
  ExitHeadSet wrong = f.heads;
  wrong.lookahead.layer = 3;
  const Status st = save_exit_heads(wrong, path);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("lookahead"), std::string::npos) << st.message();
  ExitHeadSet mapped_exit = both;
  mapped_exit.heads[0].token_weight.assign(dd, 0.0f);
  EXPECT_FALSE(save_exit_heads(mapped_exit, path).ok());
}

TEST(LookaheadHead, SelfSpeculativeAtTheModelsDepthNeedsOne) {
  testing::StoriesModel s;
  Model& m = *s.model;
  ExitRule rule;
  rule.policy = ExitPolicy::kSelfSpeculative;
  rule.depth = m.n_layers_loaded();
  ASSERT_TRUE(m.set_exits({2}, nullptr).ok());
  const Status none = m.check_exit_rule(rule);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("--lookahead"), std::string::npos) << none.message();
  EXPECT_FALSE(m.lookahead(nullptr, nullptr, 0).ok()) << "no head to run";
  ASSERT_TRUE(m.set_exits({}, &Fitted::get().heads).ok());
  EXPECT_TRUE(m.has_lookahead());
  EXPECT_TRUE(m.check_exit_rule(rule).ok());
  rule.depth = 0;  // no exit points: self-speculative drafts with the lookahead head
  EXPECT_EQ(m.resolve_exit_rule(rule).depth, 5);
  ASSERT_TRUE(m.set_exits({2}, &Fitted::get().heads).ok());
  EXPECT_EQ(m.resolve_exit_rule(rule).depth, 2) << "an exit point comes first";
}

// A server's default rule: self-speculative with no exit points drafts with the heads file's
// lookahead head at the model's depth; another depth is refused naming the valid ones.
TEST(LookaheadHead, ModelSetupResolvesTheDefaultRuleToIt) {
  const std::string path = testing::temp_dir() + "/stories.setup.exits.gguf";
  ASSERT_TRUE(save_exit_heads(Fitted::get().heads, path).ok());
  auto backend = make_cpu_backend(1);
  ModelSetupOptions o;
  o.path = testing::stories260k_path();
  o.heads_path = path;
  o.names.rule_prefix = "early_exit.";
  ExitRule rule;
  rule.policy = ExitPolicy::kSelfSpeculative;
  o.default_rule = rule;
  auto setup = setup_model(*backend, o);
  ASSERT_TRUE(setup.ok()) << setup.status().to_string();
  EXPECT_TRUE(setup->model->has_lookahead());
  EXPECT_EQ(setup->default_rule.depth, 5);
  rule.depth = 3;
  o.default_rule = rule;
  setup = setup_model(*backend, o);
  ASSERT_FALSE(setup.ok());
  EXPECT_NE(setup.status().message().find("valid: 5 (lookahead head)"), std::string::npos) << setup.status().message();
}

TEST(LookaheadHead, DraftsAreVerifiedToFullsTokens) {
  testing::StoriesModel s;
  Model& m = *s.model;
  ASSERT_TRUE(m.set_exits({}, &Fitted::get().heads).ok());
  int64_t accepted[2] = {0, 0};  // per draft vocabulary, over every prompt and temperature
  for (const char* text : {"Once upon a time", "The little dog", "Lily and Tom went to the park."}) {
    const auto prompt = m.tokenizer().encode(text, true, false);
    for (float temperature : {0.0f, 0.8f}) {
      GenerateOptions opt;
      opt.max_tokens = 48;
      opt.ignore_eos = true;
      opt.sampling.temperature = temperature;
      opt.sampling.seed = 11;
      auto full = generate(m, prompt, opt);
      ASSERT_TRUE(full.ok());
      opt.exit.policy = ExitPolicy::kSelfSpeculative;
      opt.exit.depth = m.n_layers_loaded();
      opt.exit.threshold = 0.0f;  // every guess drafted
      for (int v = 0; v < 2; ++v) {
        opt.exit.draft_vocab = v == 0 ? 0 : 384;  // 384: past tok512's 259 special and byte tokens
        auto spec = generate(m, prompt, opt);
        ASSERT_TRUE(spec.ok()) << spec.status().message();
        EXPECT_EQ(spec->tokens, full->tokens) << "'" << text << "' T " << temperature << " vocab " << v;
        // One draft a round at most.
        const int64_t rounds = static_cast<int64_t>(spec->tokens.size()) - 1 - spec->accepted;
        EXPECT_LE(spec->drafted, rounds);
        EXPECT_GT(spec->drafted, 0);
        accepted[v] += spec->accepted;
      }
      opt.exit.draft_vocab = 0;
      opt.exit.threshold = 1.0f;  // never sure: no drafts, full's tokens
      auto none = generate(m, prompt, opt);
      ASSERT_TRUE(none.ok());
      EXPECT_EQ(none->tokens, full->tokens);
      EXPECT_EQ(none->drafted, 0);
    }
  }
  // Equal because drafts were confirmed, not because every draft was thrown away.
  EXPECT_GT(accepted[0], 0);
  EXPECT_GT(accepted[1], 0);
}

TEST(LookaheadHead, EngineRoundsGiveFullsTokens) {
  testing::Served s(testing::engine_options(256), {}, &Fitted::get().heads);
  ASSERT_NE(s.engine, nullptr);
  ExitRule spec;
  spec.policy = ExitPolicy::kSelfSpeculative;
  spec.depth = s.model->n_layers_loaded();
  spec.threshold = 0.0f;
  for (float temperature : {0.0f, 0.9f}) {
    std::vector<std::shared_ptr<RequestStream>> full, fast;
    int n = 0;
    for (const char* p : testing::kStoryPrompts) {
      const std::string tag = std::to_string(temperature) + "-" + std::to_string(n++);
      full.push_back(*s.engine->submit(testing::make_generation(*s.model, "full-" + tag, p, {}, temperature)));
      fast.push_back(*s.engine->submit(testing::make_generation(*s.model, "ahead-" + tag, p, spec, temperature)));
    }
    for (size_t i = 0; i < full.size(); ++i) {
      const testing::Outcome a = testing::drain(*full[i]), b = testing::drain(*fast[i]);
      EXPECT_EQ(a.ids.size(), 48u);
      EXPECT_EQ(a.ids, b.ids) << testing::kStoryPrompts[i] << " T " << temperature;
    }
  }
  const EngineStatus st = s.engine->status();
  EXPECT_GT(st.draft_tokens_accepted, 0);
  EXPECT_LE(st.draft_tokens_accepted, st.draft_tokens_total);
}

}  // namespace
}  // namespace helios
