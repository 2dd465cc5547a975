// Evaluation of exit rules (`helios eval`): what early exit costs in quality and buys in work
// and speed, each rule measured against the full model in the same run.
//   quality: teacher-forced perplexity over a text, and greedy generations compared token by
//            token with the full model's;
//   work:    mean exit layer, blocks computed / K/V filled / LM-head rows per decoded token;
//   speed:   decode tokens/s and the speed-up over full.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "helios/calibrate.h"
#include "helios/model.h"

namespace helios {

// Teacher-forced perplexity of `rule` over the sequences: every row takes its rule's exit, and
// row i is scored on token i + 1. Also the rows' mean exit layer and the pass's work.
struct PerplexityResult {
  double perplexity = 0;
  int64_t n_scored = 0;          // predicted tokens
  double mean_exit_layer = 0;    // over the scored rows
  int64_t layer_rows = 0, fill_rows = 0, head_rows = 0;
};
StatusOr<PerplexityResult> teacher_forced_perplexity(Model& model, const ExitRule& rule,
                                                     const std::vector<std::vector<TokenId>>& sequences);

struct EvalOptions {
  int32_t gen_tokens = 32;  // greedy tokens generated per prompt (EOS ignored, so all compare)
  ProgressLog log;
};

// One rule's row of the report.
struct EvalRow {
  ExitRule rule;                  // resolved (depths filled in)
  double perplexity = 0;
  double perplexity_increase_pct = 0;  // vs the full row
  int64_t n_scored = 0;
  double agreement = 0;           // mean over prompts of the positions matching full's tokens
  double identical = 0;           // fraction of prompts whose tokens all match full's
  double mean_exit_layer = 0;     // over generated tokens
  double layers_per_token = 0;    // decode: blocks computed in full per decoded token
  double fill_per_token = 0;      // decode: K/V-filled (exited) block rows per decoded token
  double head_rows_per_token = 0; // decode: LM-head rows per decoded token
  double tokens_per_s = 0;        // decode speed over all prompts
  double speedup = 0;             // tokens_per_s / full's
  int64_t n_decoded = 0;
  int64_t drafted = 0, accepted = 0;  // self-speculative
};

// Evaluates `full` first (the baseline every other row is compared with), then each rule in
// order (a `full` rule in `rules` is skipped). Each rule is checked against the model.
StatusOr<std::vector<EvalRow>> evaluate_exit_rules(Model& model, const std::vector<ExitRule>& rules,
                                                   const std::vector<std::vector<TokenId>>& text_sequences,
                                                   const std::vector<std::vector<TokenId>>& prompts,
                                                   const EvalOptions& options);

// A Markdown table (one row per rule) and the same as JSON (with the model and run settings).
std::string eval_table_markdown(const std::vector<EvalRow>& rows, int32_t n_layers);
std::string eval_rows_json(const std::vector<EvalRow>& rows, const std::string& model_path, int32_t n_layers,
                           const std::string& heads_path);

}  // namespace helios
