// Early exit in the forward pass: the K/V filled for skipped layers against a slow reference, the
// per-policy layer accounting, threshold edges, batch-sync coupling, chunking invariance with
// exits, and self-speculative decoding equal to full depth token for token.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <filesystem>

#include "helios/generate.h"
#include "helios/gguf.h"
#include "helios/model.h"
#include "helios/model_tools.h"
#include "test_paths.h"
#include "unit/model/six_layer_model.h"

namespace helios {
namespace {

constexpr int32_t kLayers = testing::kSixLayers;

std::string six_layer_model() {
  static const std::string path = testing::write_six_layer_model(5, "six_layers.gguf");
  return path;
}

// One model, one cache, sequences with their own block tables.
struct Fixture {
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCacheStorage> kv;
  BlockAllocator allocator{64};
  std::vector<BlockTable> tables = std::vector<BlockTable>(8);

  explicit Fixture(const std::string& path, std::vector<int32_t> exits = {2, 4}) {
    auto m = Model::load(path, *backend);
    EXPECT_TRUE(m.ok()) << m.status().message();
    model = std::move(*m);
    EXPECT_TRUE(model->set_exits(exits, nullptr).ok());
    auto s = KvCacheStorage::create(*backend, model->config(), 64, 4);
    kv = std::make_unique<KvCacheStorage>(std::move(*s));
    for (auto& t : tables) EXPECT_TRUE(reserve_tokens(allocator, t, 32, 4));
  }

  ForwardResult run(ForwardBatch batch) {
    auto r = model->forward(batch, *kv);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? std::move(*r) : ForwardResult{};
  }
  SequenceBatchEntry entry(int seq, std::vector<TokenId> tokens, int32_t start, ExitRule rule = {},
                           LogitsWanted logits = LogitsWanted::kLast) {
    SequenceBatchEntry e;
    e.tokens = std::move(tokens);
    e.start_pos = start;
    e.blocks = &tables[seq];
    e.logits = logits;
    e.exit = rule;
    return e;
  }
};

ExitRule per_token(float threshold) {
  ExitRule r;
  r.policy = ExitPolicy::kPerToken;
  r.threshold = threshold;
  return r;
}

const std::vector<TokenId> kPrompt = {1, 72, 101, 108, 108, 111};

TEST(EarlyExitForward, FilledKvMatchesASlowReferenceFromTheExitState) {
  Fixture f(six_layer_model());
  ForwardBatch prefill;
  prefill.seqs.push_back(f.entry(0, kPrompt, 0));
  f.run(prefill);

  // Threshold 0: the decode token leaves at the first exit (layer 2); layers 3..6 get its K/V
  // from h_2.
  ForwardBatch step;
  step.return_hidden = true;
  const auto pos = static_cast<int32_t>(kPrompt.size());
  step.seqs.push_back(f.entry(0, {50}, pos, per_token(0.0f)));
  const ForwardResult r = f.run(step);
  ASSERT_EQ(r.row_exit_layer.size(), 1u);
  EXPECT_EQ(r.row_exit_layer[0], 2);
  EXPECT_EQ(r.layer_rows, 2);
  EXPECT_EQ(r.fill_rows, kLayers - 2);

  // The reference: for each skipped layer j, rope(W_k rmsnorm(h_2)) and W_v rmsnorm(h_2).
  auto file = GgufFile::open(six_layer_model());
  ASSERT_TRUE(file.ok());
  const ModelConfig& c = f.model->config();
  auto tensor = [&](const std::string& name) {
    const GgufTensorInfo* t = (*file)->find_tensor(name);
    std::vector<float> v(t->n_elements());
    EXPECT_TRUE(dequantize_row(t->type, t->data, v.data(), t->n_elements()).ok());
    return v;
  };
  const std::vector<float> h(r.hidden.begin(), r.hidden.begin() + c.n_embd);
  const int32_t slot = f.tables[0].slot(pos, 4);
  for (int32_t j = 2; j < kLayers; ++j) {
    const std::string p = "blk." + std::to_string(j) + ".";
    const auto norm = tensor(p + "attn_norm.weight"), wk = tensor(p + "attn_k.weight"), wv = tensor(p + "attn_v.weight");
    double ss = 0;
    for (float v : h) ss += static_cast<double>(v) * v;
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / c.n_embd) + c.rms_eps);
    std::vector<float> xn(c.n_embd), k(c.kv_dim(), 0.0f), v(c.kv_dim(), 0.0f);
    for (int i = 0; i < c.n_embd; ++i) xn[i] = h[i] * inv * norm[i];
    for (int o = 0; o < c.kv_dim(); ++o) {
      for (int i = 0; i < c.n_embd; ++i) {
        k[o] += wk[static_cast<size_t>(o) * c.n_embd + i] * xn[i];
        v[o] += wv[static_cast<size_t>(o) * c.n_embd + i] * xn[i];
      }
    }
    for (int hd = 0; hd < c.n_head_kv; ++hd) {
      for (int i = 0; i < c.n_rot / 2; ++i) {
        const double theta = pos * std::pow(c.rope_freq_base, -2.0 * i / c.n_rot);
        float* x = k.data() + hd * c.head_dim;
        const float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = static_cast<float>(x0 * std::cos(theta) - x1 * std::sin(theta));
        x[2 * i + 1] = static_cast<float>(x0 * std::sin(theta) + x1 * std::cos(theta));
      }
    }
    const kernels::PagedKV cache = f.kv->layer(j);  // CPU backend memory is host memory
    const float* ck = static_cast<const float*>(cache.k) + static_cast<size_t>(slot) * c.kv_dim();
    const float* cv = static_cast<const float*>(cache.v) + static_cast<size_t>(slot) * c.kv_dim();
    for (int o = 0; o < c.kv_dim(); ++o) {
      EXPECT_NEAR(ck[o], k[o], 1e-4f * (1 + std::fabs(k[o]))) << "layer " << j + 1 << " k[" << o << "]";
      EXPECT_NEAR(cv[o], v[o], 1e-4f * (1 + std::fabs(v[o]))) << "layer " << j + 1 << " v[" << o << "]";
    }
  }
}

TEST(EarlyExitForward, LayerAccountingPerPolicy) {
  Fixture f(six_layer_model());
  ForwardBatch prefill;
  prefill.seqs.push_back(f.entry(0, kPrompt, 0));
  f.run(prefill);
  const auto pos = static_cast<int32_t>(kPrompt.size());
  struct Case {
    ExitRule rule;
    int32_t exit_layer, layer_rows, fill_rows;
  };
  ExitRule fixed;
  fixed.policy = ExitPolicy::kFixedDepth;
  fixed.depth = 4;
  ExitRule fixed_default = fixed;
  fixed_default.depth = 0;  // the loaded depth
  const Case cases[] = {
      {ExitRule{}, kLayers, kLayers, 0},       // full
      {per_token(0.0f), 2, 2, kLayers - 2},    // threshold 0: the first exit
      {per_token(1.0f), kLayers, kLayers, 0},  // threshold 1: never early
      {fixed, 4, 4, 0},                        // fixed depth: no fill, nothing deeper reads it
      {fixed_default, kLayers, kLayers, 0},
  };
  for (const Case& c : cases) {
    ForwardBatch step;
    step.seqs.push_back(f.entry(0, {50}, pos, c.rule));
    const ForwardResult r = f.run(step);
    SCOPED_TRACE(exit_policy_name(c.rule.policy));
    EXPECT_EQ(r.row_exit_layer[0], c.exit_layer);
    EXPECT_EQ(r.layer_rows, c.layer_rows);
    EXPECT_EQ(r.fill_rows, c.fill_rows);
    EXPECT_GE(r.row_confidence[0], 0.0f);
    EXPECT_LE(r.row_confidence[0], 1.0f);
  }
}

// Observe mode runs every exit head beside the full-depth pass: the logits are those of a plain
// pass bit for bit, and each exit's top-1 is what a fixed-depth pass leaving there predicts.
TEST(EarlyExitForward, ObserveModeRecordsEachExitWithoutChangingTheOutput) {
  Fixture f(six_layer_model());
  auto pass = [&](int seq, bool observe, ExitRule rule) {
    ForwardBatch b;
    b.observe_exits = observe;
    b.seqs.push_back(f.entry(seq, kPrompt, 0, rule, LogitsWanted::kAll));
    return f.run(b);
  };
  const ForwardResult plain = pass(0, false, {});
  const ForwardResult seen = pass(1, true, {});
  ASSERT_EQ(seen.logits, plain.logits);
  EXPECT_TRUE(plain.observed.empty());
  ASSERT_EQ(seen.observed_layers, (std::vector<int32_t>{2, 4}));
  ASSERT_EQ(seen.observed.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    ExitRule fixed;
    fixed.policy = ExitPolicy::kFixedDepth;
    fixed.depth = seen.observed_layers[e];
    const ForwardResult at_exit = pass(2 + static_cast<int>(e), false, fixed);
    ASSERT_EQ(seen.observed[e].size(), kPrompt.size());
    for (size_t r = 0; r < kPrompt.size(); ++r) {
      const float* row = at_exit.row(r);
      const auto top1 = static_cast<int32_t>(std::max_element(row, row + at_exit.n_vocab) - row);
      EXPECT_EQ(seen.observed[e][r].top1, top1) << "exit " << fixed.depth << " row " << r;
      EXPECT_NEAR(seen.observed[e][r].top1_prob, at_exit.row_confidence[r], 1e-6);
    }
  }
  EXPECT_EQ(seen.head_rows, plain.head_rows + 2 * static_cast<int64_t>(kPrompt.size()));
}

TEST(EarlyExitForward, PerExitThresholdsDecideWhereTokensLeave) {
  Fixture f(six_layer_model());
  ForwardBatch prefill;
  prefill.seqs.push_back(f.entry(0, kPrompt, 0));
  f.run(prefill);
  ExitRule rule = per_token(0.0f);
  rule.exit_thresholds = {{2, 1.0f}};  // never at the first exit: the rule's 0 applies at the second
  ForwardBatch step;
  step.seqs.push_back(f.entry(0, {50}, static_cast<int32_t>(kPrompt.size()), rule));
  const ForwardResult r = f.run(step);
  EXPECT_EQ(r.row_exit_layer[0], 4);
  EXPECT_EQ(r.fill_rows, kLayers - 4);

  ExitRule calibrated = per_token(0.5f);
  calibrated.calibrated_thresholds = true;  // the identity heads here have no fitted thresholds
  EXPECT_FALSE(f.model->check_exit_rule(calibrated).ok());
}

TEST(EarlyExitForward, BatchSyncWaitsForTheLeastConfidentSequence) {
  Fixture f(six_layer_model());
  ForwardBatch prefill;
  for (int s = 0; s < 3; ++s) prefill.seqs.push_back(f.entry(s, kPrompt, 0));
  f.run(prefill);
  const auto pos = static_cast<int32_t>(kPrompt.size());
  ExitRule eager;  // would leave at the first exit alone
  eager.policy = ExitPolicy::kBatchSync;
  eager.threshold = 0.0f;
  ExitRule never = eager;
  never.threshold = 1.0f;

  ForwardBatch together;  // an eager batch-sync row with one that is never confident
  together.seqs.push_back(f.entry(0, {50}, pos, eager));
  together.seqs.push_back(f.entry(1, {51}, pos, never));
  together.seqs.push_back(f.entry(2, {52}, pos, per_token(0.0f)));  // per-token is not held back
  const ForwardResult r = f.run(together);
  EXPECT_EQ(r.row_exit_layer[0], kLayers);
  EXPECT_EQ(r.row_exit_layer[1], kLayers);
  EXPECT_EQ(r.row_exit_layer[2], 2);

  ForwardBatch eager_only;
  eager_only.seqs.push_back(f.entry(0, {53}, pos + 1, eager));
  eager_only.seqs.push_back(f.entry(1, {54}, pos + 1, eager));
  const ForwardResult e = f.run(eager_only);
  EXPECT_EQ(e.row_exit_layer[0], 2);
  EXPECT_EQ(e.row_exit_layer[1], 2);
  EXPECT_EQ(e.fill_rows, 2 * (kLayers - 2));
}

// Tokens of a chunk that leave early must still be visible to the chunk's later tokens in the
// deeper layers: a chunk and the same tokens one at a time give the same logits and exits.
TEST(EarlyExitForward, ChunkWithExitsEqualsTokenByToken) {
  Fixture f(six_layer_model());
  const std::vector<TokenId> text = {1, 80, 81, 82, 83, 84, 85, 86, 87, 88};
  const ExitRule rule = per_token(0.029f);  // some leave, some do not (random weights: low confidence)
  ForwardBatch chunk;
  chunk.seqs.push_back(f.entry(0, text, 0, rule, LogitsWanted::kAll));
  const ForwardResult a = f.run(chunk);
  std::vector<float> logits;
  std::vector<int32_t> exits;
  for (size_t i = 0; i < text.size(); ++i) {
    ForwardBatch one;
    one.seqs.push_back(f.entry(1, {text[i]}, static_cast<int32_t>(i), rule));
    const ForwardResult b = f.run(one);
    logits.insert(logits.end(), b.logits.begin(), b.logits.end());
    exits.push_back(b.row_exit_layer[0]);
  }
  EXPECT_EQ(a.row_exit_layer, exits);
  ASSERT_EQ(a.logits.size(), logits.size());
  for (size_t i = 0; i < logits.size(); ++i) ASSERT_NEAR(a.logits[i], logits[i], 1e-4f) << i;
  bool some_early = false, some_full = false;
  for (int32_t l : exits) (l < kLayers ? some_early : some_full) = true;
  std::string seen;
  for (size_t i = 0; i < exits.size(); ++i) seen += std::to_string(exits[i]) + ":" + std::to_string(a.row_confidence[i]) + " ";
  EXPECT_TRUE(some_early && some_full) << "the threshold should split the tokens; adjust it: " << seen;
}

TEST(EarlyExitForward, PartialPassesAreChecked) {
  Fixture f(six_layer_model());
  ForwardBatch bad;
  bad.first_layer = 2;  // no hidden_in
  bad.seqs.push_back(f.entry(0, {5}, 0));
  EXPECT_FALSE(f.model->forward(bad, *f.kv).ok());
  ForwardBatch mixed;
  mixed.last_layer = 2;
  mixed.seqs.push_back(f.entry(0, {5}, 0, per_token(0.5f)));
  EXPECT_FALSE(f.model->forward(mixed, *f.kv).ok());
  ExitRule probe = per_token(0.5f);
  probe.measure = ConfidenceMeasure::kProbe;  // no calibrated probes here
  EXPECT_FALSE(f.model->check_exit_rule(probe).ok());
  ExitRule spec;
  spec.policy = ExitPolicy::kSelfSpeculative;
  spec.depth = 3;  // not an exit point
  EXPECT_FALSE(f.model->check_exit_rule(spec).ok());
  EXPECT_FALSE(f.model->set_exits({kLayers}, nullptr).ok());
}

// Self-speculative decoding is lossless: the same tokens as full depth, greedy and seeded sampling.
void expect_speculative_equals_full(const std::string& path, const std::vector<std::string>& prompts,
                                    int32_t draft_layer, std::vector<int32_t> draft_counts) {
  ASSERT_TRUE(std::filesystem::exists(path))
      << "no model at " << path
      << (path.find("stories") != std::string::npos ? ": it comes from tests/data (git checkout -- tests/data)"
                                                      : ": run scripts/fetch_model.sh");
  auto backend = make_cpu_backend(2);
  auto model = Model::load(path, *backend);
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE((*model)->set_exits({draft_layer}, nullptr).ok());
  for (const std::string& text : prompts) {
    const auto prompt = (*model)->tokenizer().encode(text, true, false);
    for (float temperature : {0.0f, 0.8f}) {
      GenerateOptions opt;
      opt.max_tokens = 40;
      opt.ignore_eos = true;
      opt.sampling.temperature = temperature;
      opt.sampling.seed = 7;
      auto full = generate(**model, prompt, opt);
      ASSERT_TRUE(full.ok());
      for (int32_t drafts : draft_counts) {
        opt.exit.policy = ExitPolicy::kSelfSpeculative;
        opt.exit.depth = draft_layer;
        opt.exit.draft_tokens = drafts;
        opt.exit.threshold = 0.0f;  // every draft, sure or not
        auto spec = generate(**model, prompt, opt);
        ASSERT_TRUE(spec.ok()) << spec.status().message();
        EXPECT_EQ(spec->tokens, full->tokens) << "'" << text << "' drafts " << drafts << " T " << temperature;
        // Equal because drafts were confirmed, not because every draft was thrown away.
        EXPECT_GT(spec->drafted, 0);
        EXPECT_GT(spec->accepted, 0) << "'" << text << "' drafts " << drafts << " T " << temperature;
        opt.exit = {};
      }
    }
  }
}

// A draft below the threshold ends the round's drafting: fewer drafts the higher the threshold,
// none at 1, every draft at 0, and the output is full's whatever the threshold.
TEST(SelfSpeculative, DraftsWhileTheDraftHeadIsSure) {
  auto backend = make_cpu_backend(2);
  auto model = Model::load(testing::stories260k_path(), *backend);
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE((*model)->set_exits({3}, nullptr).ok());
  const auto prompt = (*model)->tokenizer().encode("Once upon a time", true, false);
  GenerateOptions opt;
  opt.max_tokens = 60;
  opt.ignore_eos = true;
  auto full = generate(**model, prompt, opt);
  ASSERT_TRUE(full.ok());
  opt.exit.policy = ExitPolicy::kSelfSpeculative;
  opt.exit.depth = 3;
  opt.exit.draft_tokens = 4;
  std::vector<GenerateResult> runs;
  for (float threshold : {0.0f, 0.5f, 1.0f}) {
    opt.exit.threshold = threshold;
    auto spec = generate(**model, prompt, opt);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    EXPECT_EQ(spec->tokens, full->tokens) << "threshold " << threshold;
    runs.push_back(std::move(*spec));
  }
  const GenerateResult &always = runs[0], &sure = runs[1], &never = runs[2];
  // Always drafting: each round after the prefill's token emits its confirmed drafts and one
  // more, and drafts 4 but near max_tokens (the last four rounds at worst: 3, 2, 1 and 0 drafts).
  const int64_t rounds = static_cast<int64_t>(always.tokens.size()) - 1 - always.accepted;
  EXPECT_GE(always.drafted, 4 * rounds - (1 + 2 + 3 + 4));
  EXPECT_LE(always.drafted, 4 * rounds);
  EXPECT_GT(sure.drafted, 0);
  EXPECT_LT(sure.drafted, always.drafted);
  EXPECT_GT(sure.accepted, 0);
  // Sure drafts are right more often than all drafts.
  EXPECT_GT(static_cast<double>(sure.accepted) / sure.drafted, static_cast<double>(always.accepted) / always.drafted);
  EXPECT_EQ(never.drafted, 0);
  EXPECT_EQ(never.accepted, 0);
}

// A draft head over the first token ids: the same logits there as the whole head (the LM head's
// first rows, whatever its layout), kLogitOff past them, top-1 and confidence over those ids.
TEST(SelfSpeculative, DraftVocabularyIsTheHeadsFirstRows) {
  const std::string path = testing::default_model_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << "no model at " << path << ": run scripts/fetch_model.sh";
  Fixture f(path, {16});
  Model* model = f.model.get();
  const int32_t n_vocab = model->config().n_vocab, vocab = 4096;
  const auto prompt = model->tokenizer().encode("The capital of France is", true, false);
  auto run = [&](int seq, int32_t head_vocab) {
    ForwardBatch b;
    b.last_layer = 16;
    b.head_vocab = head_vocab;
    b.seqs.push_back(f.entry(seq, prompt, 0, {}, LogitsWanted::kAll));
    return f.run(b);
  };
  const ForwardResult whole = run(0, 0), first = run(1, vocab);
  ASSERT_EQ(first.row_seq.size(), prompt.size());
  for (size_t r = 0; r < prompt.size(); ++r) {
    for (int32_t i = 0; i < n_vocab; ++i) {
      if (i < vocab) {
        ASSERT_EQ(first.row(r)[i], whole.row(r)[i]) << "row " << r << " token " << i;
      } else {
        ASSERT_EQ(first.row(r)[i], ForwardBatch::kLogitOff) << "row " << r << " token " << i;
      }
    }
    EXPECT_LT(argmax(first.row(r), n_vocab), vocab);
    EXPECT_GE(first.row_confidence[r], whole.row_confidence[r]) << "the same top logit over fewer tokens";
  }
  ForwardBatch bad;
  bad.head_vocab = 100;  // not a multiple of 64
  bad.seqs.push_back(f.entry(2, prompt, 0));
  EXPECT_FALSE(model->forward(bad, *f.kv).ok());
  // Self-speculative drafting among them gives full's tokens.
  GenerateOptions opt;
  opt.max_tokens = 32;
  opt.ignore_eos = true;
  auto full = generate(*model, prompt, opt);
  opt.exit.policy = ExitPolicy::kSelfSpeculative;
  opt.exit.depth = 16;
  opt.exit.threshold = 0.0f;
  opt.exit.draft_vocab = vocab;
  auto spec = generate(*model, prompt, opt);
  ASSERT_TRUE(full.ok() && spec.ok());
  EXPECT_EQ(spec->tokens, full->tokens);
  EXPECT_GT(spec->accepted, 0);
  opt.exit.draft_vocab = 100;
  EXPECT_FALSE(generate(*model, prompt, opt).ok()) << "draft_vocab must be a multiple of 64";
}

TEST(SelfSpeculative, EqualsFullOnStories260K) {
  expect_speculative_equals_full(testing::stories260k_path(),
                                 {"Once upon a time", "The little dog", "Lily and Tom went to the park."}, 2, {1, 3, 6});
}

TEST(SelfSpeculative, EqualsFullOnSmolLM2) {
  expect_speculative_equals_full(testing::default_model_path(),
                                 {"The capital of France is"}, 16, {4});
}

}  // namespace
}  // namespace helios
