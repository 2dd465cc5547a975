// Calibration end to end on stories260K: text loading in every supported shape, the hidden-state
// collection, the per-exit fits, the sidecar round trip, and the host exit head matching the
// forward pass's exit head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "helios/calibrate.h"
#include "helios/distill.h"
#include "helios/sampler.h"
#include "stories_model.h"

namespace helios {
namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = testing::temp_dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(CalibrationText, PlainTextSplitsOnBlankLines) {
  const auto docs = load_text_documents(write_file("plain.txt", "first line\nsame paragraph\n\n  \nsecond\n\n\nthird\n"));
  ASSERT_TRUE(docs.ok()) << docs.status().to_string();
  EXPECT_EQ(*docs, (std::vector<std::string>{"first line\nsame paragraph", "second", "third"}));
}

TEST(CalibrationText, ConversationsAreOneDocumentWithTheirTurnsJoined) {
  // The ShareGPT shape: a JSON list of {id, conversations: [{from, value}]}.
  const auto docs = load_text_documents(write_file(
      "sharegpt.json",
      R"([{"id": "a1", "conversations": [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "Hi!"}]},
          {"id": "b2", "messages": [{"role": "user", "content": "Second conversation"}]}])"));
  ASSERT_TRUE(docs.ok()) << docs.status().to_string();
  EXPECT_EQ(*docs, (std::vector<std::string>{"Hello there\n\nHi!", "Second conversation"}));
}

TEST(CalibrationText, JsonlGsm8kAndLooseStrings) {
  const auto gsm = load_text_documents(write_file(
      "gsm.jsonl", "{\"question\": \"What is 2+2?\", \"answer\": \"2+2=<<2+2=4>>4\\n#### 4\"}\n\n"
                   "{\"question\": \"And 3+3?\", \"answer\": \"6\"}\n"));
  ASSERT_TRUE(gsm.ok()) << gsm.status().to_string();
  EXPECT_EQ(*gsm, (std::vector<std::string>{"What is 2+2?\n2+2=<<2+2=4>>4\n#### 4", "And 3+3?\n6"}));
  // Objects of prompts (ReAct's prompt files): long strings are documents, short ones are not.
  const auto loose = load_text_documents(write_file(
      "prompts.json", R"({"webthink": "Question: a long enough prompt to count as a document.", "id": "short"})"));
  ASSERT_TRUE(loose.ok()) << loose.status().to_string();
  EXPECT_EQ(*loose, (std::vector<std::string>{"Question: a long enough prompt to count as a document."}));
}

TEST(CalibrationText, ErrorsNameTheFile) {
  const auto missing = load_text_documents(testing::temp_dir() + "/nope.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.txt"), std::string::npos);
  const auto bad = load_text_documents(write_file("bad.jsonl", "{\"text\": \"fine\"}\nnot json\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(load_text_documents(write_file("empty.txt", "\n\n   \n")).ok());
}

TEST(CalibrationText, RealDataFilesLoad) {
  for (const char* rel : {"/sharegpt/ShareGPT_V3_filtered_first80_prompts.json",
                          "/sharegpt/medicalgpt_sharegpt_zh_first4.jsonl", "/intercept/gsm8k_test_first20.jsonl",
                          "/intercept/glaive_toolcall_en_demo_first4.json", "/intercept/react_prompts_naive_first2.json"}) {
    const auto docs = load_text_documents(testing::test_data_dir() + rel);
    ASSERT_TRUE(docs.ok()) << rel << ": " << docs.status().to_string();
    EXPECT_GT(docs->size(), 0u) << rel;
  }
}

TEST(CalibrationText, SequencesTakeEveryDocumentsFirstChunkFirst) {
  testing::StoriesModel s;
  ASSERT_NE(s.model, nullptr);
  const Tokenizer& tok = s.model->tokenizer();
  const std::string long_doc(4000, 'a');
  const std::vector<std::string> docs{long_doc, "Once upon a time there was a cat.", "The dog ran home."};
  const auto seqs = make_token_sequences(tok, docs, 32, 100);
  int64_t total = 0;
  for (const auto& q : seqs) {
    EXPECT_LE(q.size(), 32u);
    EXPECT_GE(q.size(), 2u);
    total += static_cast<int64_t>(q.size());
  }
  EXPECT_EQ(total, 100);
  ASSERT_GE(seqs.size(), 3u);
  // The short documents come right after the long one's first chunk, not after all of it.
  EXPECT_EQ(seqs[1], tok.encode(docs[1], true, false));
  EXPECT_EQ(seqs[2], tok.encode(docs[2], true, false));
  EXPECT_EQ(default_exit_heads_path("models/stories260K.gguf"), "models/stories260K.exits.gguf");
}

TEST(CalibrationText, FilesTakeTurns) {
  const std::vector<std::string> docs = interleave_documents({{"a0", "a1", "a2", "a3"}, {"b0"}, {"c0", "c1"}});
  EXPECT_EQ(docs, (std::vector<std::string>{"a0", "b0", "c0", "a1", "c1", "a2", "a3"}));
  EXPECT_TRUE(interleave_documents({}).empty());
  EXPECT_TRUE(interleave_documents({{}, {}}).empty());
}

// One calibration shared by the tests below (stories260K, ~4K tokens: a second or two).
struct Calibrated {
  testing::StoriesModel s;
  HiddenStates data;
  CalibrationResult result;
  std::vector<std::vector<TokenId>> sequences;

  static Calibrated& get() {
    static Calibrated c = [] {
      Calibrated c;
      const auto docs = testing::calibration_documents();
      c.sequences = make_token_sequences(c.s.model->tokenizer(), docs, 128, 4096);
      auto data = collect_hidden_states(*c.s.model, c.sequences, {3, 1, 2, 4});
      EXPECT_TRUE(data.ok()) << data.status().to_string();
      c.data = std::move(*data);
      auto result = fit_exit_heads(*c.s.model, c.data, CalibrationOptions{});
      EXPECT_TRUE(result.ok()) << result.status().to_string();
      c.result = std::move(*result);
      return c;
    }();
    return c;
  }
};

TEST(Calibrate, CollectsStatesAtTheExitsAndTheLastLayer) {
  const Calibrated& c = Calibrated::get();
  EXPECT_EQ(c.data.layers, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(c.data.n_tokens(), 4096);
  for (const auto& st : c.data.states) EXPECT_EQ(st.size(), static_cast<size_t>(4096 * 64));
  EXPECT_FALSE(collect_hidden_states(*c.s.model, c.sequences, {5}).ok()) << "layer 5 is the model's own head";
}

TEST(Calibrate, SidecarRoundTripsWithHeadsAtTheExits) {
  const Calibrated& c = Calibrated::get();
  const std::string path = testing::temp_dir() + "/stories.exits.gguf";
  ASSERT_TRUE(save_exit_heads(c.result.heads, path).ok());
  auto loaded = load_exit_heads(path, c.s.model->config());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  ASSERT_EQ(loaded->heads.size(), 4u);
  for (int32_t layer : {1, 2, 3, 4}) {
    const ExitHeadParams* h = loaded->find(layer);
    ASSERT_NE(h, nullptr) << "layer " << layer;
    EXPECT_EQ(h->probe_weight.size(), 64u);
    EXPECT_EQ(h->n_tokens, 4096);
  }
}

TEST(Calibrate, ExitThresholdIsTheLowestConfidenceThatStillMeetsTheTarget) {
  // Sorted by confidence: the top 4 all agree, the 5th does not, then two agree and three do not.
  const std::vector<float> p = {0.99f, 0.95f, 0.9f, 0.85f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.3f};
  const std::vector<uint8_t> agree = {1, 1, 1, 1, 0, 1, 1, 0, 0, 0};
  double coverage = 0;
  EXPECT_FLOAT_EQ(fit_exit_threshold(p, agree, 0.8, 1, &coverage), 0.6f);  // 6 of 7 agree
  EXPECT_DOUBLE_EQ(coverage, 0.7);
  EXPECT_FLOAT_EQ(fit_exit_threshold(p, agree, 1.0, 1, &coverage), 0.85f);
  EXPECT_FLOAT_EQ(fit_exit_threshold(p, agree, 1.0, 5, &coverage), 1.0f);  // too few above any threshold
  EXPECT_DOUBLE_EQ(coverage, 0.0);
  EXPECT_FLOAT_EQ(fit_exit_threshold({}, {}, 0.9, 1, nullptr), 1.0f);
}

TEST(Calibrate, FittedThresholdsKeepLeavingTokensAgreeing) {
  const Calibrated& c = Calibrated::get();
  for (const ExitCalibration& e : c.result.exits) {
    EXPECT_GT(e.threshold, 0.0) << "layer " << e.layer;
    EXPECT_LE(e.threshold, 1.0) << "layer " << e.layer;
    EXPECT_FLOAT_EQ(c.result.heads.find(e.layer)->threshold, static_cast<float>(e.threshold));
  }
  // A model with the fitted heads runs the calibrated rule.
  Model& m = *c.s.model;
  ASSERT_TRUE(m.set_exits({1, 2, 3, 4}, &c.result.heads).ok());
  ExitRule rule;
  rule.policy = ExitPolicy::kPerToken;
  rule.calibrated_thresholds = true;
  ASSERT_TRUE(m.check_exit_rule(rule).ok()) << m.check_exit_rule(rule).message();
  const ExitRule resolved = m.resolve_exit_rule(rule);
  EXPECT_EQ(resolved.exit_thresholds.size(), 4u);
  ASSERT_TRUE(m.set_exits({1, 2, 3, 4}, nullptr).ok());
}

// An exit head's agreement on the held-out tokens (every 5th sequence), measured here from the
// collected states: how often its top-1 is the final layer's.
double held_out_agreement(Calibrated& c, int32_t layer, const std::vector<float>& w, const std::vector<float>& b) {
  const int32_t d = c.data.n_embd;
  const std::vector<float>& states = c.data.at(layer);
  std::vector<float> rows;
  std::vector<int32_t> final_top1;
  for (int64_t i = 0; i < c.data.n_tokens(); ++i) {
    if (c.data.sequence[i] % 5 != 4) continue;
    rows.insert(rows.end(), states.begin() + i * d, states.begin() + (i + 1) * d);
    final_top1.push_back(c.data.final_top1[i]);
  }
  auto top1 = exit_head_top1(*c.s.model, rows.data(), static_cast<int64_t>(final_top1.size()), w, b);
  EXPECT_TRUE(top1.ok()) << top1.status().to_string();
  if (!top1.ok() || final_top1.empty()) return -1;
  int64_t same = 0;
  for (size_t i = 0; i < final_top1.size(); ++i) same += (*top1)[i] == final_top1[i];
  return static_cast<double>(same) / static_cast<double>(final_top1.size());
}

TEST(Calibrate, HeldOutAgreementBeatsTheLogitLensAndTheProbeBeatsTheBaseRate) {
  Calibrated& c = Calibrated::get();
  ASSERT_EQ(c.result.exits.size(), 4u);
  for (const ExitCalibration& e : c.result.exits) {
    const ExitHeadParams* h = c.result.heads.find(e.layer);
    ASSERT_NE(h, nullptr);
    // The adapter is kept exactly when it agrees more often than the lens, and then it is the
    // head in the sidecar; else the exit keeps the identity.
    EXPECT_EQ(e.adapter_kept, e.adapter_agreement > e.lens_agreement) << "layer " << e.layer;
    EXPECT_EQ(h->adapter_weight.empty(), !e.adapter_kept) << "layer " << e.layer;
    // The reported agreements are those of the heads themselves on the held-out tokens: the
    // lens's, and the kept head's (which the sidecar records and the probe's labels are about).
    const double lens = held_out_agreement(c, e.layer, {}, {});
    const double kept = held_out_agreement(c, e.layer, h->adapter_weight, h->adapter_bias);
    EXPECT_DOUBLE_EQ(lens, e.lens_agreement) << "layer " << e.layer;
    EXPECT_DOUBLE_EQ(kept, e.adapter_kept ? e.adapter_agreement : e.lens_agreement) << "layer " << e.layer;
    EXPECT_GE(kept, lens) << "layer " << e.layer << ": the kept head is never worse than the lens";
    EXPECT_FLOAT_EQ(h->agreement, static_cast<float>(kept)) << "layer " << e.layer;
    EXPECT_DOUBLE_EQ(e.base_rate, kept) << "layer " << e.layer;
    // A probe is worth something only if it beats always guessing the majority class.
    EXPECT_GT(e.probe_accuracy, std::max(e.base_rate, 1 - e.base_rate)) << "layer " << e.layer;
    EXPECT_GT(e.n_held_out, 500);
  }
  // The shallow exits of this model are far from its last layer: the adapter must help a lot.
  EXPECT_TRUE(c.result.exits[0].adapter_kept);
  EXPECT_GT(c.result.exits[0].adapter_agreement, c.result.exits[0].lens_agreement + 0.05);
}

// The held-out sequence 4 through the model with its exit heads as set, leaving at `layer`
// (fixed depth): each row's top-1. Its rows of the collected states start at *first_row.
std::vector<int32_t> fixed_depth_top1(Calibrated& c, int32_t layer, int64_t* first_row) {
  Model& m = *c.s.model;
  const auto& seq = c.sequences[4];
  auto kv = KvCacheStorage::create(m.backend(), m.config(), 8, 16);
  EXPECT_TRUE(kv.ok());
  BlockAllocator alloc(8);
  BlockTable table;
  EXPECT_TRUE(reserve_tokens(alloc, table, static_cast<int32_t>(seq.size()), 16));
  ForwardBatch fixed;
  fixed.seqs.push_back({seq, 0, &table, LogitsWanted::kAll, ExitRule{ExitPolicy::kFixedDepth}});
  fixed.seqs[0].exit.depth = layer;
  auto fr = m.forward(fixed, *kv);
  EXPECT_TRUE(fr.ok()) << fr.status().to_string();
  std::vector<int32_t> top1;
  for (size_t i = 0; fr.ok() && i < seq.size(); ++i) {
    EXPECT_EQ(fr->row_exit_layer[i], layer);
    top1.push_back(argmax(fr->row(i), fr->n_vocab));
  }
  *first_row = std::find(c.data.sequence.begin(), c.data.sequence.end(), 4) - c.data.sequence.begin();
  return top1;
}

TEST(Calibrate, HostExitHeadMatchesTheForwardPassExitHead) {
  Calibrated& c = Calibrated::get();
  Model& m = *c.s.model;
  ASSERT_TRUE(m.set_exits({1, 2, 3, 4}, &c.result.heads).ok());
  for (int32_t layer : {1, 3}) {
    int64_t first = 0;
    const std::vector<int32_t> forward_top1 = fixed_depth_top1(c, layer, &first);
    const auto n = static_cast<int64_t>(forward_top1.size());
    const ExitHeadParams* h = c.result.heads.find(layer);
    auto top1 = exit_head_top1(m, c.data.at(layer).data() + first * 64, n, h->adapter_weight, h->adapter_bias);
    ASSERT_TRUE(top1.ok()) << top1.status().to_string();
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) same += (*top1)[i] == forward_top1[i];
    EXPECT_GE(same, n - 1) << "layer " << layer << ": the calibration's head must be the one forward runs";
  }
  ExitRule probe{ExitPolicy::kPerToken, ConfidenceMeasure::kProbe, 0.5f};
  EXPECT_TRUE(m.check_exit_rule(probe).ok()) << "the fitted probes make the probe measure usable";
  ASSERT_TRUE(m.set_exits({1, 2, 3, 4}, nullptr).ok());
  EXPECT_FALSE(m.check_exit_rule(probe).ok());
}

// Distillation from the ridge fit: the kept head is the best of the three on held-out agreement,
// and with a curve the agreement measure means what it says on the held-out tokens.
TEST(Calibrate, DistilledHeadsAndAgreementCurves) {
  Calibrated& c = Calibrated::get();
  CalibrationOptions opt;
  opt.distill = true;
  opt.distill_epochs = 3;
  opt.distill_learning_rate = 1e-3f;
  auto result = fit_exit_heads(*c.s.model, c.data, opt);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  int distilled_better = 0;
  for (const ExitCalibration& e : result->exits) {
    SCOPED_TRACE("layer " + std::to_string(e.layer));
    ASSERT_GE(e.distilled_agreement, 0.0);
    EXPECT_LE(e.distill_kl_best, e.distill_kl_start);  // the best step is kept, the start included
    const double best = std::max({e.lens_agreement, e.adapter_agreement, e.distilled_agreement});
    const ExitHeadParams* h = result->heads.find(e.layer);
    ASSERT_NE(h, nullptr);
    EXPECT_FLOAT_EQ(h->agreement, static_cast<float>(best));
    EXPECT_EQ(h->kind, e.kept);
    EXPECT_DOUBLE_EQ(held_out_agreement(c, e.layer, h->adapter_weight, h->adapter_bias), best);
    distilled_better += e.kept == "distilled";
    // The curve is fitted on half the held-out tokens; on the other half (about 400 tokens, so
    // a standard error near 0.03) a 0.5 threshold lets through tokens that agree nearly that often.
    ASSERT_FALSE(h->curve_prob.empty());
    ASSERT_FALSE(e.curve_checks.empty());
    EXPECT_GT(e.curve_checks.front().agreed, 0.40);
  }
  EXPECT_GT(distilled_better, 0) << "distillation should improve on ridge somewhere on stories260K";
  // The agreement measure runs on a model with these heads.
  Model& m = *c.s.model;
  ASSERT_TRUE(m.set_exits({1, 2, 3, 4}, &result->heads).ok());
  ExitRule rule;
  rule.policy = ExitPolicy::kPerToken;
  rule.measure = ConfidenceMeasure::kAgreement;
  EXPECT_TRUE(m.check_exit_rule(rule).ok()) << m.check_exit_rule(rule).message();
  ASSERT_TRUE(m.set_exits({1, 2, 3, 4}, &c.result.heads).ok());  // ridge heads: they have curves too
  EXPECT_TRUE(m.check_exit_rule(rule).ok());
  ASSERT_TRUE(m.set_exits({1, 2, 3, 4}, nullptr).ok());  // identity heads have no curve
  EXPECT_FALSE(m.check_exit_rule(rule).ok());
}

// The residual-MLP head: trained after the distilled adapter, kept when forced, recorded in the
// sidecar, and run by the forward pass exactly as calibration measured it.
TEST(Calibrate, MlpHeadIsTheOneForwardRuns) {
  Calibrated& c = Calibrated::get();
  CalibrationOptions opt;
  opt.distill = true;
  opt.distill_epochs = 2;
  opt.mlp_hidden = 64;
  opt.head = "mlp";
  auto result = fit_exit_heads(*c.s.model, c.data, opt);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  for (const ExitCalibration& e : result->exits) {
    SCOPED_TRACE("layer " + std::to_string(e.layer));
    EXPECT_EQ(e.kept, "mlp");
    ASSERT_GE(e.mlp_agreement, 0.0);
    EXPECT_LE(e.mlp_kl_best, e.mlp_kl_start);
    // It starts from the distilled head (its down projection is zero then).
    EXPECT_NEAR(e.mlp_kl_start, e.distill_kl_best, 1e-3);
    const ExitHeadParams* h = result->heads.find(e.layer);
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->mlp.hidden, 64);
    EXPECT_FLOAT_EQ(h->agreement, static_cast<float>(e.mlp_agreement));
  }
  // Through the sidecar and into the forward pass: fixed-depth logits are the MLP head's.
  const std::string path = testing::temp_dir() + "/mlp.exits.gguf";
  ASSERT_TRUE(save_exit_heads(result->heads, path).ok());
  auto loaded = load_exit_heads(path, c.s.model->config());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  Model& m = *c.s.model;
  ASSERT_TRUE(m.set_exits({1, 2, 3, 4}, &*loaded).ok());
  for (int32_t layer : {1, 3}) {
    int64_t first = 0;
    const std::vector<int32_t> forward_top1 = fixed_depth_top1(c, layer, &first);
    const auto n = static_cast<int64_t>(forward_top1.size());
    const ExitHeadParams* h = loaded->find(layer);
    const float* rows = c.data.at(layer).data() + first * 64;
    std::vector<float> with_prob, without_prob;
    auto with_mlp = exit_head_top1(m, rows, n, h->adapter_weight, h->adapter_bias, &with_prob, &h->mlp);
    auto without = exit_head_top1(m, rows, n, h->adapter_weight, h->adapter_bias, &without_prob);
    ASSERT_TRUE(with_mlp.ok() && without.ok());
    int64_t same = 0;
    double prob_gap = 0;
    for (int64_t i = 0; i < n; ++i) {
      same += (*with_mlp)[i] == forward_top1[i];
      prob_gap += std::fabs(with_prob[i] - without_prob[i]);
    }
    EXPECT_GE(same, n - 1) << "layer " << layer << ": the calibration's MLP head must be the one forward runs";
    EXPECT_GT(prob_gap / n, 1e-3) << "layer " << layer << ": the MLP changes the head's output";
  }
  ASSERT_TRUE(m.set_exits({1, 2, 3, 4}, nullptr).ok());
  CalibrationOptions bad;
  bad.head = "mlp";  // without a hidden width
  EXPECT_FALSE(fit_exit_heads(*c.s.model, c.data, bad).ok());
}

// The last FFN as an exit MLP: on a row h entering the last block, over its RMS c, the MLP built
// with scale c gives the logits of h + FFN(h) (the last block without its attention), computed here
// from the dequantized weights; through the forward pass's exit head (Q8_0 matrices).
TEST(Calibrate, LastFfnMlpIsTheLastBlockWithoutItsAttention) {
  Calibrated& c = Calibrated::get();
  Model& m = *c.s.model;
  const ModelConfig& cfg = m.config();
  const int32_t d = cfg.n_embd, f = cfg.n_ff, V = cfg.n_vocab;
  const std::vector<std::vector<TokenId>> two = {c.sequences[0], c.sequences[1]};
  auto with_exit = collect_hidden_states(m, two, {4}, nullptr, true);  // 4: the last block's input is an exit
  auto without = collect_hidden_states(m, two, {2}, nullptr, true);
  ASSERT_TRUE(with_exit.ok() && without.ok());
  EXPECT_EQ(with_exit->last_block_input, with_exit->at(4));
  EXPECT_EQ(without->last_block_input, with_exit->at(4));
  EXPECT_EQ(without->layers, (std::vector<int32_t>{2, 5}));
  EXPECT_TRUE(collect_hidden_states(m, two, {2})->last_block_input.empty());

  auto dequant = [](const WeightMatrix& w, int32_t rows, int32_t cols) {
    std::vector<float> out(static_cast<size_t>(rows) * cols);
    for (int32_t r = 0; r < rows; ++r) EXPECT_TRUE(dequantize_weight_row(w, r, out.data() + size_t(r) * cols).ok());
    return out;
  };
  const LayerWeights& last = m.weights().layers.back();
  const auto wg = dequant(last.w_gate.view, f, d), wu = dequant(last.w_up.view, f, d), wd = dequant(last.w_down.view, d, f);
  const auto head = dequant(m.weights().output.view, V, d);
  std::vector<float> ffn_norm(d), out_norm(d);
  m.backend().download(ffn_norm.data(), last.ffn_norm.data(), d);
  m.backend().download(out_norm.data(), m.weights().output_norm.data(), d);
  auto rms_normed = [&](const std::vector<float>& x, const std::vector<float>& w) {
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss / d + cfg.rms_eps);
    std::vector<float> y(d);
    for (int32_t j = 0; j < d; ++j) y[j] = static_cast<float>(x[j] * inv) * w[j];
    return y;
  };
  for (int64_t row : {0, 5, 77, 200}) {
    SCOPED_TRACE("row " + std::to_string(row));
    std::vector<float> h(with_exit->last_block_input.begin() + row * d, with_exit->last_block_input.begin() + (row + 1) * d);
    double ss = 0;
    for (float v : h) ss += double(v) * v;
    const auto rms = static_cast<float>(std::sqrt(ss / d));
    // Reference: h + down(silu(gate(n)) * up(n)), n = rmsnorm(h) * ffn_norm, then the model's head.
    const std::vector<float> n = rms_normed(h, ffn_norm);
    std::vector<float> act(f), y = h;
    for (int32_t i = 0; i < f; ++i) {
      float g = 0, u = 0;
      for (int32_t j = 0; j < d; ++j) g += wg[size_t(i) * d + j] * n[j], u += wu[size_t(i) * d + j] * n[j];
      act[i] = g / (1 + std::exp(-g)) * u;
    }
    for (int32_t j = 0; j < d; ++j) {
      for (int32_t i = 0; i < f; ++i) y[j] += wd[size_t(j) * f + i] * act[i];
    }
    const std::vector<float> yn = rms_normed(y, out_norm);
    std::vector<float> logits(V);
    for (int32_t t = 0; t < V; ++t) {
      for (int32_t j = 0; j < d; ++j) logits[t] += head[size_t(t) * d + j] * yn[j];
    }
    const TokenId want = argmax(logits.data(), V);
    double z = 0;
    for (float l : logits) z += std::exp(l - logits[want]);

    auto mlp = last_ffn_mlp(m, rms);
    ASSERT_TRUE(mlp.ok()) << mlp.status().to_string();
    EXPECT_EQ(mlp->hidden, f);
    std::vector<float> a(d);
    for (int32_t j = 0; j < d; ++j) a[j] = h[j] / rms;
    std::vector<float> prob;
    auto top1 = exit_head_top1(m, a.data(), 1, {}, {}, &prob, &*mlp);
    ASSERT_TRUE(top1.ok());
    EXPECT_EQ((*top1)[0], want);
    EXPECT_NEAR(prob[0], 1.0 / z, 0.01);
  }
  EXPECT_FALSE(last_ffn_mlp(m, 0.0f).ok());
}

// From the last FFN, calibration keeps an MLP head of the FFN's width behind a ridge adapter onto
// the state entering the last block (its width taken from the model when mlp_hidden is 0); it is
// refused without those states or at another width.
TEST(Calibrate, MlpHeadStartedFromTheLastFfn) {
  Calibrated& c = Calibrated::get();
  Model& m = *c.s.model;
  const std::vector<std::vector<TokenId>> some(c.sequences.begin(), c.sequences.begin() + 16);
  auto data = collect_hidden_states(m, some, {2, 3}, nullptr, true);
  ASSERT_TRUE(data.ok());
  CalibrationOptions opt;
  opt.mlp_init = "last-ffn";
  opt.mlp_learning_rate = 1e-4f;
  opt.distill_epochs = 1;
  opt.head = "mlp";
  opt.distill = true;
  auto result = fit_exit_heads(m, *data, opt);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  for (const ExitCalibration& e : result->exits) {
    SCOPED_TRACE("layer " + std::to_string(e.layer));
    EXPECT_EQ(e.kept, "mlp");
    EXPECT_GE(e.mlp_agreement_start, 0.0);
    EXPECT_LE(e.mlp_kl_best, e.mlp_kl_start);
    const ExitHeadParams* h = result->heads.find(e.layer);
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->mlp.hidden, m.config().n_ff);
    EXPECT_FALSE(h->adapter_weight.empty());
  }
  CalibrationOptions wrong_width = opt;
  wrong_width.mlp_hidden = 8;
  EXPECT_FALSE(fit_exit_heads(m, *data, wrong_width).ok());
  auto plain = collect_hidden_states(m, some, {2, 3});
  EXPECT_FALSE(fit_exit_heads(m, *plain, opt).ok()) << "needs the states entering the last block";
  CalibrationOptions unknown = opt;
  unknown.mlp_init = "zeros";
  EXPECT_FALSE(fit_exit_heads(m, *data, unknown).ok());
}

// A forced head kind is kept at every exit whatever it scores, with its own agreement recorded,
// so head kinds can be compared on one calibration.
TEST(Calibrate, ForcedHeadKindIsKeptAtEveryExit) {
  Calibrated& c = Calibrated::get();
  for (const char* kind : {"lens", "ridge"}) {
    SCOPED_TRACE(kind);
    CalibrationOptions opt;
    opt.head = kind;
    auto result = fit_exit_heads(*c.s.model, c.data, opt);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    for (const ExitCalibration& e : result->exits) {
      const ExitHeadParams* h = result->heads.find(e.layer);
      ASSERT_NE(h, nullptr);
      const bool lens = std::string(kind) == "lens";
      EXPECT_EQ(e.kept, lens ? "identity" : kind);
      EXPECT_EQ(h->adapter_weight.empty(), lens);
      const double expected = lens ? e.lens_agreement : e.adapter_agreement;
      EXPECT_FLOAT_EQ(h->agreement, static_cast<float>(expected));
      EXPECT_FALSE(h->curve_prob.empty()) << "a forced lens still gets its agreement curve";
    }
  }
  CalibrationOptions bad;
  bad.head = "distilled";  // without distill
  EXPECT_FALSE(fit_exit_heads(*c.s.model, c.data, bad).ok());
  bad.head = "medusa";
  auto r = fit_exit_heads(*c.s.model, c.data, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("medusa"), std::string::npos);
}

}  // namespace
}  // namespace helios
