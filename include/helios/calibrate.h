// Calibration of exit heads (`helios calibrate`): run the model teacher-forced over some text,
// keep the hidden states at each exit and at the last layer, and fit per exit
//   - an affine adapter h_k → h_L (kept only when it beats the logit lens on held-out tokens),
//   - a logistic probe on h_k / rms(h_k) predicting "this exit's top-1 is the final top-1".
//   - optionally, the adapter trained further by distillation (distill.h) from the ridge fit,
// with the kept head the best of identity, ridge and distilled on held-out agreement; its
// agreement curve (the `agreement` measure) fitted on half the held-out tokens, checked on the rest.
// The result is an ExitHeadSet for save_exit_heads. Text loading and tokenizing into sequences
// are shared with `helios eval` (evaluate.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "helios/early_exit.h"
#include "helios/model.h"

namespace helios {

// Progress lines for a terminal (no newline at the end); may be null.
using ProgressLog = std::function<void(const std::string&)>;

// --- Text
// The documents of a text file. .json / .jsonl: conversations ("conversations"/"messages" turns
// joined), question + answer (GSM8K), "prompt"/"text"/"instruction"/"content" fields, and
// otherwise every string value of 32+ characters; other files: plain text, one document per
// paragraph (split on blank lines). NOT_FOUND / INVALID_ARGUMENT naming the file.
StatusOr<std::vector<std::string>> load_text_documents(const std::string& path);

// Several files' documents, one from each in turn ([a0, b0, a1, b1, a2, ...]): max_tokens usually
// ends long before the first file does, and every file given should be in the calibration set.
std::vector<std::string> interleave_documents(std::vector<std::vector<std::string>> per_file);

// Tokenizes documents into sequences of at most seq_len tokens (each document's first one with
// the tokenizer's BOS), max_tokens in all. The first chunk of every document comes before the
// second chunk of any, so a few long documents do not crowd out the rest. Sequences shorter than
// 2 tokens are dropped (nothing to predict).
std::vector<std::vector<TokenId>> make_token_sequences(const Tokenizer& tok, const std::vector<std::string>& documents,
                                                       int32_t seq_len, int64_t max_tokens);

// <model without .gguf>.exits.gguf: where `helios calibrate` writes and the CLI's heads "auto" looks.
std::string default_exit_heads_path(const std::string& model_path);

// --- Hidden states
// The teacher-forced pass over the sequences (full policy, every row), one forward per sequence.
struct HiddenStates {
  int32_t n_embd = 0;
  std::vector<int32_t> layers;               // captured layers, ascending; the last is n_layer
  std::vector<std::vector<float>> states;    // per layer: [n_tokens, n_embd], the state after it
  std::vector<int32_t> final_top1;           // [n_tokens] argmax of the model's own logits
  std::vector<int32_t> sequence;             // [n_tokens] index of the token's sequence
  std::vector<TokenId> tokens;               // [n_tokens] the input token at each position
  // [n_tokens, n_embd]: the state entering the last block, when asked for (an MLP head started from
  // the last block's FFN fits its adapter to it); empty otherwise.
  std::vector<float> last_block_input;

  int64_t n_tokens() const { return static_cast<int64_t>(final_top1.size()); }
  const std::vector<float>& at(int32_t layer) const;  // states of a captured layer
};
// No exit layers: the last layer's states alone. INVALID_ARGUMENT for a layer outside
// 1..n_layer - 1, or a model loaded short of its depth.
StatusOr<HiddenStates> collect_hidden_states(Model& model, const std::vector<std::vector<TokenId>>& sequences,
                                             const std::vector<int32_t>& exit_layers, const ProgressLog& log = nullptr,
                                             bool keep_last_block_input = false);

// Top-1 token of the exit head lm_head(final_norm(a)), a = W h + b (+ the residual MLP when `mlp`
// is given), for rows h [n, n_embd]; an empty w is the identity (logit lens). Runs on the model's
// backend with its own (possibly quantized) LM head, through Model::apply_exit_head as the forward
// pass runs its exit heads. `top1_prob`, when given, gets each row's top-1 probability.
StatusOr<std::vector<int32_t>> exit_head_top1(Model& model, const float* hidden, int64_t n_rows,
                                              const std::vector<float>& w, const std::vector<float>& b,
                                              std::vector<float>* top1_prob = nullptr,
                                              const ResidualMlp* mlp = nullptr);

// The lowest top-1 probability τ such that, of the tokens with p >= τ, at least `target` agree with
// the final layer (and at least `min_tokens` of them are above it); 1 (never leave) when none.
float fit_exit_threshold(const std::vector<float>& top1_prob, const std::vector<uint8_t>& agrees, double target,
                         int64_t min_tokens, double* coverage);

// --- Fitting
struct CalibrationOptions {
  // fit_affine_adapter's ridge penalties (in units of the inputs' variance): each exit keeps the
  // one whose adapter agrees most with the last layer on the held-out tokens.
  std::vector<float> ridges = {1e-6f, 1e-5f, 1e-4f, 1e-3f, 1e-2f, 1e-1f};
  float probe_l2 = 0.1f;         // fit_logistic_probe's l2 (smaller overfits 576-wide features)
  int32_t probe_iterations = 25;
  int32_t held_out_every = 5;    // every 5th sequence (or token, with < 5 sequences) is held out
  double target_agreement = 0.9; // per-exit thresholds: the share of leaving tokens that must agree
  bool distill = false;          // also train each adapter by distillation (slower: see distill.h)
  // Which head each exit keeps: "best" (identity, ridge, distilled or mlp, the best on held-out
  // agreement), or one of "lens" (identity), "ridge", "distilled" (needs distill), "mlp" (needs
  // mlp_hidden) whatever it scores, to compare head kinds on the same calibration.
  std::string head = "best";
  int32_t distill_epochs = 3;
  float distill_learning_rate = 1e-3f;
  int32_t distill_rank = 32;     // DistillOptions::rank
  // > 0: also train a residual MLP of this many hidden units after the (distilled) adapter, the
  // head kind "mlp" (distill_mlp); 0: none.
  int32_t mlp_hidden = 0;
  float mlp_learning_rate = 3e-4f;  // Adam, for the MLP (1e-3 made its fit loss climb back by the third epoch)
  // How the MLP starts: "random" (gate, up random, down 0: the distilled adapter's head), or
  // "last-ffn": the model's own last FFN (its width: mlp_hidden 0 or n_ff), behind a ridge adapter fitted to the
  // state entering the last block — the exit skips to the last block and runs its FFN, not its
  // attention, so it needs no KV cache of its own. Needs HiddenStates::last_block_input.
  std::string mlp_init = "random";
  int32_t teacher_top_k = 64;    // the teacher's tokens the sparse KL keeps
  int32_t curve_points = 64;     // points of each exit's agreement curve
  ProgressLog log;
};

// How well a calibrated confidence means what it says on held-out tokens: of the tokens whose
// agreement confidence reaches `threshold`, the share that agreed and the share of all tokens.
struct CurveCheck {
  float threshold = 0;
  double agreed = 0, leaving = 0;
};

// One exit's calibration, measured on the held-out tokens.
struct ExitCalibration {
  int32_t layer = 0;
  double lens_agreement = 0;     // logit lens top-1 == final top-1
  double adapter_agreement = 0;  // fitted adapter top-1 == final top-1
  float ridge = 0;               // the penalty it was fitted with
  bool adapter_kept = false;     // an adapter (ridge or distilled) beat the logit lens
  double distilled_agreement = -1;  // the distilled adapter's (-1: not trained)
  std::string kept = "identity"; // identity, ridge, distilled or mlp: the best on held-out agreement
  double distill_seconds = 0, distill_kl_start = 0, distill_kl_best = 0;  // held-out sparse KL, nats
  double mlp_agreement = -1;     // the residual-MLP head's (-1: not trained)
  double mlp_agreement_start = -1;  // its start's (the adapter's head, or the last FFN behind its adapter)
  double mlp_seconds = 0, mlp_kl_start = 0, mlp_kl_best = 0;
  // The agreement curve (fitted on the even held-out tokens) at 0.5 .. 0.95 on the odd ones.
  std::vector<CurveCheck> curve_checks;
  double probe_accuracy = 0;     // probe (score >= 0.5) predicts the kept head's agreement
  double base_rate = 0;          // fraction where the kept head agrees
  double threshold = 1;          // fitted top-1 threshold for target_agreement (1: never leave here)
  double coverage = 0;           // held-out tokens whose top-1 probability reaches it
  int64_t n_fit = 0, n_held_out = 0;
  bool lookahead = false;        // the lookahead head (fit_lookahead_head), not an exit
};

struct CalibrationResult {
  ExitHeadSet heads;
  std::vector<ExitCalibration> exits;  // by layer, as heads.heads
};

// Fits every exit in `data` (all captured layers but the last). The model supplies the LM head.
StatusOr<CalibrationResult> fit_exit_heads(Model& model, const HiddenStates& data, const CalibrationOptions& options);

// The lookahead head's pairs: the last layer's state at each position followed by another in its
// sequence, and as its target that next position's state and top-1 (layers {n_layer, n_layer});
// `tokens` holds each pair's next input (the token at t + 1).
HiddenStates lookahead_states(const HiddenStates& data);
// A lookahead head (ExitHeadSet::lookahead) from the last layer's state h at t and the embedding e
// of the token at t + 1, against the model's distribution at t + 1: its top-1 guesses the token
// after that one. First a ridge map a = W h + U e + b onto the state at t + 1 (over its RMS), then,
// on a, what an exit gets (a second ridge, distillation, an MLP, as `options` ask), folded into W,
// U and b. The result's one head is at layer n_layer; its row's logit-lens column is the model's
// own head at t read as a guess for t + 2, and its ridge column the better of the two ridge maps.
StatusOr<CalibrationResult> fit_lookahead_head(Model& model, const HiddenStates& data, CalibrationOptions options);

// Markdown table: layer | logit-lens agreement | adapter agreement | head kept | probe accuracy |
// base rate | threshold | coverage.
std::string calibration_table(const CalibrationResult& result);

}  // namespace helios
