// Exit-rule evaluation: teacher-forced perplexity, greedy agreement with the full model, the
// work per decoded token and the decode speed, all against a `full` baseline from the same run.
#include "helios/evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "helios/generate.h"
#include "helios/teacher_forced.h"
#include "kernels/kernels.h"

namespace helios {
namespace {

constexpr int32_t kBlockSize = 16;

bool uses_threshold(ExitPolicy p) {
  return p == ExitPolicy::kPerToken || p == ExitPolicy::kBatchSync || p == ExitPolicy::kSelfSpeculative;
}
bool uses_depth(ExitPolicy p) { return p == ExitPolicy::kFixedDepth || p == ExitPolicy::kSelfSpeculative; }
// Self-speculative drafts while the draft head's top-1 probability reaches the threshold.
ConfidenceMeasure measure_of(const ExitRule& r) {
  return r.policy == ExitPolicy::kSelfSpeculative ? ConfidenceMeasure::kTop1Prob : r.measure;
}

std::string rule_label(const ExitRule& r) {
  std::string s = exit_policy_name(r.policy);
  char buf[64];
  if (uses_threshold(r.policy)) {
    const char* measure = confidence_measure_name(measure_of(r));
    if (r.calibrated_thresholds) {
      std::snprintf(buf, sizeof buf, " %s>=calibrated", measure);
    } else {
      std::snprintf(buf, sizeof buf, " %s>=%.2f", measure, r.threshold);
    }
    s += buf;
  }
  if (uses_depth(r.policy)) s += " @" + std::to_string(r.depth);
  return s;
}

struct Generations {
  std::vector<std::vector<TokenId>> tokens;  // per prompt
  double mean_exit_layer = 0;
  int64_t n_decoded = 0, layer_rows = 0, fill_rows = 0, head_rows = 0, drafted = 0, accepted = 0;
  double decode_seconds = 0;
};

StatusOr<Generations> generate_all(Model& model, const ExitRule& rule, const std::vector<std::vector<TokenId>>& prompts,
                                   const EvalOptions& opt) {
  GenerateOptions g;  // greedy: sampling defaults to temperature 0
  g.max_tokens = opt.gen_tokens;
  g.ignore_eos = true;  // every generation has gen_tokens tokens to compare
  g.exit = rule;
  g.block_size = kBlockSize;
  Generations out;
  double sum_exit = 0;
  int64_t n_tokens = 0;
  for (const auto& prompt : prompts) {
    HELIOS_ASSIGN_OR_RETURN(GenerateResult r, generate(model, prompt, g));
    for (int32_t l : r.exit_layers) sum_exit += l;
    n_tokens += static_cast<int64_t>(r.exit_layers.size());
    out.n_decoded += r.tokens.empty() ? 0 : static_cast<int64_t>(r.tokens.size()) - 1;  // the first is prefill's
    out.layer_rows += r.decode_layer_rows;
    out.fill_rows += r.decode_fill_rows;
    out.head_rows += r.decode_head_rows;
    out.drafted += r.drafted;
    out.accepted += r.accepted;
    out.decode_seconds += r.decode_seconds;
    out.tokens.push_back(std::move(r.tokens));
  }
  out.mean_exit_layer = n_tokens ? sum_exit / static_cast<double>(n_tokens) : 0.0;
  return out;
}

}  // namespace

StatusOr<PerplexityResult> teacher_forced_perplexity(Model& model, const ExitRule& rule,
                                                     const std::vector<std::vector<TokenId>>& sequences) {
  HELIOS_RETURN_IF_ERROR(model.check_exit_rule(rule));
  size_t max_len = 0;
  for (const auto& s : sequences) max_len = std::max(max_len, s.size());
  if (max_len < 2) return invalid_argument("perplexity needs a sequence of 2+ tokens; the text gave none");
  HELIOS_ASSIGN_OR_RETURN(auto runner, TeacherForcedRunner::create(model, max_len));
  PerplexityResult out;
  double sum_nll = 0, sum_exit = 0;
  for (const auto& seq : sequences) {
    if (seq.size() < 2) continue;
    HELIOS_ASSIGN_OR_RETURN(ForwardResult fr, runner.run(seq, rule));
    for (size_t i = 0; i + 1 < seq.size(); ++i) {
      sum_nll += kernels::ref_neg_log_prob(fr.row(i), fr.n_vocab, seq[i + 1]);
      sum_exit += fr.row_exit_layer[i];
    }
    out.n_scored += static_cast<int64_t>(seq.size()) - 1;
    out.layer_rows += fr.layer_rows;
    out.fill_rows += fr.fill_rows;
    out.head_rows += fr.head_rows;
  }
  out.perplexity = std::exp(sum_nll / static_cast<double>(out.n_scored));
  out.mean_exit_layer = sum_exit / static_cast<double>(out.n_scored);
  return out;
}

StatusOr<std::vector<EvalRow>> evaluate_exit_rules(Model& model, const std::vector<ExitRule>& rules,
                                                   const std::vector<std::vector<TokenId>>& text_sequences,
                                                   const std::vector<std::vector<TokenId>>& prompts,
                                                   const EvalOptions& opt) {
  if (opt.gen_tokens < 1) return invalid_argument("gen_tokens must be >= 1, got " + std::to_string(opt.gen_tokens));
  if (prompts.empty()) return invalid_argument("no prompts to generate from (the text gave none)");
  std::vector<ExitRule> todo{ExitRule{}};  // full first: the baseline
  for (const ExitRule& r : rules) {
    HELIOS_RETURN_IF_ERROR(model.check_exit_rule(r));
    if (r.policy != ExitPolicy::kFull) todo.push_back(model.resolve_exit_rule(r));
  }

  // Warm-up (untimed): the first passes grow the workspace and fault in the weights, which would
  // otherwise slow the full baseline alone and flatter every speed-up.
  HELIOS_RETURN_IF_ERROR(generate_all(model, ExitRule{}, {prompts[0]}, opt).status());

  std::vector<EvalRow> rows;
  std::vector<std::vector<TokenId>> full_tokens;
  for (size_t i = 0; i < todo.size(); ++i) {
    const ExitRule& rule = todo[i];
    if (opt.log) opt.log("eval: " + rule_label(rule) + " (" + std::to_string(i + 1) + "/" + std::to_string(todo.size()) + ")");
    EvalRow row;
    row.rule = rule;
    HELIOS_ASSIGN_OR_RETURN(PerplexityResult ppl, teacher_forced_perplexity(model, rule, text_sequences));
    row.perplexity = ppl.perplexity;
    row.n_scored = ppl.n_scored;
    HELIOS_ASSIGN_OR_RETURN(Generations gen, generate_all(model, rule, prompts, opt));
    if (i == 0) full_tokens = gen.tokens;
    double sum_agree = 0;
    int64_t n_identical = 0;
    for (size_t p = 0; p < prompts.size(); ++p) {
      const auto& mine = gen.tokens[p];
      const auto& ref = full_tokens[p];
      int64_t same = 0;
      for (size_t t = 0; t < std::min(mine.size(), ref.size()); ++t) same += mine[t] == ref[t];
      sum_agree += static_cast<double>(same) / static_cast<double>(std::max<size_t>(ref.size(), 1));
      n_identical += mine == ref;
    }
    row.agreement = sum_agree / static_cast<double>(prompts.size());
    row.identical = static_cast<double>(n_identical) / static_cast<double>(prompts.size());
    row.mean_exit_layer = gen.mean_exit_layer;
    const double decoded = static_cast<double>(std::max<int64_t>(gen.n_decoded, 1));
    row.n_decoded = gen.n_decoded;
    row.layers_per_token = static_cast<double>(gen.layer_rows) / decoded;
    row.fill_per_token = static_cast<double>(gen.fill_rows) / decoded;
    row.head_rows_per_token = static_cast<double>(gen.head_rows) / decoded;
    row.tokens_per_s = static_cast<double>(gen.n_decoded) / std::max(gen.decode_seconds, 1e-9);
    row.drafted = gen.drafted;
    row.accepted = gen.accepted;
    rows.push_back(row);
  }
  for (EvalRow& row : rows) {
    row.perplexity_increase_pct = 100.0 * (row.perplexity / rows[0].perplexity - 1.0);
    row.speedup = row.tokens_per_s / std::max(rows[0].tokens_per_s, 1e-9);
  }
  return rows;
}

std::string eval_table_markdown(const std::vector<EvalRow>& rows, int32_t n_layers) {
  std::string out =
      "| policy | measure | threshold | depth | perplexity | Δppl | agreement | identical | mean exit layer | "
      "layers/token | K/V fill/token | LM-head rows/token | decode tok/s | speed-up |\n"
      "|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char line[512];
  for (const EvalRow& r : rows) {
    const bool thr = uses_threshold(r.rule.policy);
    char threshold[16] = "-", depth[16] = "-";
    if (thr) {
      if (r.rule.calibrated_thresholds) {
        std::snprintf(threshold, sizeof threshold, "calibrated");
      } else {
        std::snprintf(threshold, sizeof threshold, "%.2f", r.rule.threshold);
      }
    }
    if (uses_depth(r.rule.policy)) std::snprintf(depth, sizeof depth, "%d", r.rule.depth);
    std::snprintf(line, sizeof line,
                  "| %s | %s | %s | %s | %.3f | %+.2f%% | %.1f%% | %.0f%% | %.2f / %d | %.2f | %.2f | %.2f | %.1f | %.2fx |\n",
                  exit_policy_name(r.rule.policy), thr ? confidence_measure_name(measure_of(r.rule)) : "-", threshold, depth,
                  r.perplexity, r.perplexity_increase_pct, 100 * r.agreement, 100 * r.identical, r.mean_exit_layer,
                  n_layers, r.layers_per_token, r.fill_per_token, r.head_rows_per_token, r.tokens_per_s, r.speedup);
    out += line;
  }
  return out;
}

std::string eval_rows_json(const std::vector<EvalRow>& rows, const std::string& model_path, int32_t n_layers,
                           const std::string& heads_path) {
  nlohmann::json j;
  j["model"] = model_path;
  j["n_layers"] = n_layers;
  j["heads"] = heads_path.empty() ? "logit lens" : heads_path;
  j["rows"] = nlohmann::json::array();
  for (const EvalRow& r : rows) {
    nlohmann::json row = {
        {"policy", exit_policy_name(r.rule.policy)},
        {"measure", confidence_measure_name(measure_of(r.rule))},
        {"perplexity", r.perplexity},
        {"perplexity_increase_pct", r.perplexity_increase_pct},
        {"scored_tokens", r.n_scored},
        {"agreement", r.agreement},
        {"identical", r.identical},
        {"mean_exit_layer", r.mean_exit_layer},
        {"layers_per_token", r.layers_per_token},
        {"kv_fill_per_token", r.fill_per_token},
        {"lm_head_rows_per_token", r.head_rows_per_token},
        {"decode_tokens_per_s", r.tokens_per_s},
        {"speedup", r.speedup},
        {"decoded_tokens", r.n_decoded},
    };
    if (uses_threshold(r.rule.policy)) {
      if (r.rule.calibrated_thresholds) {
        row["threshold"] = "calibrated";
      } else {
        row["threshold"] = r.rule.threshold;
      }
    }
    if (uses_depth(r.rule.policy)) row["depth"] = r.rule.depth;
    if (r.rule.policy == ExitPolicy::kSelfSpeculative) {
      row["draft_tokens"] = r.rule.draft_tokens;
      row["drafted"] = r.drafted;
      row["accepted"] = r.accepted;
    }
    j["rows"].push_back(row);
  }
  return j.dump(2) + "\n";
}

}  // namespace helios
