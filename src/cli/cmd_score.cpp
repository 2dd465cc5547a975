// helios score: judges what servers generated with one fixed model. For every request of a
// helios-bench report (each run, i.e. each server compared), the judge runs teacher-forced over
// prompt + output and gives the perplexity of the output tokens under it and how often each
// output token is the judge's own greedy choice at that point.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_setup.h"
#include "helios/teacher_forced.h"
#include "kernels/kernels.h"

namespace helios::cli {

int cmd_score(int argc, char** argv) {
  Args args("score",
            "Scores a helios-bench report's outputs with a judge model: per run (each server of a\n"
            "compare-mode report), the judge's perplexity of the generated tokens given their prompts,\n"
            "and the share of generated tokens that are the judge's greedy choice at that point\n"
            "(teacher-forced agreement). The judge must share the servers' tokenizer; the report must\n"
            "hold token ids (helios-bench records them).",
            "--report FILE");
  add_model_options(args, /*heads_option=*/false);
  args.option("report", "FILE", "helios-bench JSON report (required)")
      .option("json", "PATH", "also write the scores as JSON");
  args.example("helios score --model models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf --report bench/results/x.json");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("score", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (!args.has("report")) return usage_error("score", "--report FILE is required (see --help)");
  nlohmann::json report;
  try {
    std::ifstream in(args.str("report"));
    if (!in) return fail("score", not_found("cannot read " + args.str("report")));
    report = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return fail("score", invalid_argument(args.str("report") + ": not JSON: " + e.what()));
  }
  if (!report.contains("runs") || !report.contains("workload") || !report["workload"].is_array()) {
    return fail("score", invalid_argument(args.str("report") + ": no runs / workload list (a helios-bench report?)"));
  }
  auto loaded = load_model(args);
  if (!loaded.ok()) return fail("score", loaded.status());
  Model& model = *loaded->model;
  const auto& prompts = report["workload"];  // the requests, in index order

  // One cache for the longest prompt + output of the report.
  size_t max_len = 2;
  for (const auto& run : report["runs"]) {
    for (const auto& r : run["requests"]) {
      const size_t index = r.value("index", 0);
      if (!r.contains("token_ids") || index >= prompts.size()) continue;
      max_len = std::max(max_len, prompts[index].value("prompt_len", size_t{0}) + r["token_ids"].size() + 8);
    }
  }
  max_len = std::min(max_len, static_cast<size_t>(model.config().n_ctx_train));
  auto runner = TeacherForcedRunner::create(model, max_len);
  if (!runner.ok()) return fail("score", runner.status());

  nlohmann::json out = nlohmann::json::object();
  std::printf("| run | requests | tokens | judge perplexity | judge agreement |\n|---|---:|---:|---:|---:|\n");
  for (const auto& run : report["runs"]) {
    const std::string label = run.value("label", "?");
    double sum_logprob = 0;
    int64_t n_tokens = 0, agreed = 0, n_requests = 0;
    for (const auto& r : run["requests"]) {
      if (!r.value("ok", false) || !r.contains("token_ids")) continue;
      const size_t index = r.value("index", 0);
      if (index >= prompts.size()) continue;
      std::vector<TokenId> tokens =
          model.tokenizer().encode(prompts[index].value("prompt", ""), /*add_special=*/true, /*parse_special=*/false);
      const size_t n_prompt = tokens.size();
      for (const auto& id : r["token_ids"]) tokens.push_back(id.get<TokenId>());
      if (tokens.size() <= n_prompt || n_prompt == 0) continue;
      if (tokens.size() > max_len) {
        std::fprintf(stderr, "score: %s request %zu: %zu tokens exceed the judge's %zu; skipped\n", label.c_str(),
                     index, tokens.size(), max_len);
        continue;
      }
      auto fr = runner->run(tokens);
      if (!fr.ok()) return fail("score", fr.status());
      // Row p predicts token p + 1: the output tokens are predicted by rows n_prompt-1 .. n-2.
      for (size_t p = n_prompt - 1; p + 1 < tokens.size(); ++p) {
        const float* row = fr->row(p);
        sum_logprob -= kernels::ref_neg_log_prob(row, fr->n_vocab, tokens[p + 1]);
        agreed += kernels::ref_argmax(row, fr->n_vocab) == tokens[p + 1];
        ++n_tokens;
      }
      ++n_requests;
    }
    const double ppl = n_tokens > 0 ? std::exp(-sum_logprob / n_tokens) : 0;
    const double agreement = n_tokens > 0 ? static_cast<double>(agreed) / n_tokens : 0;
    std::printf("| %s | %lld | %lld | %.3f | %.3f |\n", label.c_str(), static_cast<long long>(n_requests),
                static_cast<long long>(n_tokens), ppl, agreement);
    std::fflush(stdout);
    out[label] = {{"requests", n_requests}, {"tokens", n_tokens}, {"judge_perplexity", ppl},
                  {"judge_agreement", agreement}};
  }
  if (args.has("json")) {
    std::ofstream f(args.str("json"));
    f << nlohmann::json{{"judge", args.str("model")}, {"report", args.str("report")}, {"runs", out}}.dump(2) << "\n";
  }
  return 0;
}

}  // namespace helios::cli
