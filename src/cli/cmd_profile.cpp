// helios profile: the exit profile of a model and its heads on held-out text, teacher-forced and
// free-running (greedy generation in observe mode), as Markdown on stdout and optionally JSON;
// bench/early_exit/plot_profile.py draws the JSON.
#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_setup.h"
#include "helios/calibrate.h"
#include "helios/exit_profile.h"
#include "helios/generate.h"
#include "helios/teacher_forced.h"

namespace helios::cli {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Teacher-forced: every position of each sequence, one full-depth observe pass per sequence.
StatusOr<ExitObservations> teacher_forced(Model& model, const std::vector<std::vector<TokenId>>& sequences) {
  size_t max_len = 1;
  for (const auto& s : sequences) max_len = std::max(max_len, s.size());
  HELIOS_ASSIGN_OR_RETURN(auto runner, TeacherForcedRunner::create(model, max_len));
  ForwardBatch observe;
  observe.observe_exits = true;
  ExitObservations obs;
  for (const auto& seq : sequences) {
    HELIOS_ASSIGN_OR_RETURN(ForwardResult fr, runner.run(seq, {}, observe));
    obs.add_pass(fr);
  }
  return obs;
}

}  // namespace

int cmd_profile(int argc, char** argv) {
  Args args("profile",
            "Measures where a model's exits agree with its last layer, on text it was not calibrated on:\n"
            "per exit, top-1 agreement, the share of tokens that would leave at each threshold and\n"
            "how many of those agree, and the Helios paper's curve (the share of tokens whose exit\n"
            "prediction is unchanged at the last layer, by the exit's confidence). Teacher-forced over\n"
            "the text, and free-running: greedy generation from the text's first tokens in observe\n"
            "mode, which runs every exit head beside the full-depth pass without changing the output\n"
            "(its cost is measured against the same generation without it).",
            "--text FILE");
  add_model_options(args);
  args.option("text", "FILE", "held-out text: plain or JSON/JSONL as for calibrate (required)")
      .option("skip", "N", "skip the text's first N documents (those a calibration used, say)", "0")
      .option("max-tokens", "N", "teacher-forced tokens in all", "2048")
      .option("seq-len", "S", "tokens per teacher-forced sequence", "256")
      .option("prompts", "N", "free-running generations (0: none)", "8")
      .option("prompt-tokens", "N", "tokens of each document a generation starts from", "32")
      .option("gen-tokens", "N", "tokens each generation runs", "64")
      .option("json", "PATH", "also write the profile as JSON (bench/early_exit/plot_profile.py plots it)");
  args.example("helios profile --model models/SmolLM2-135M-Instruct.Q4_1.gguf --exits 8,15,23 \\\n"
               "      --text tests/data/sharegpt/ShareGPT_V3_filtered_first80_prompts.json --json /tmp/profile.json");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("profile", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (!args.has("text")) return usage_error("profile", "--text FILE is required (see --help)");
  int64_t max_tokens = 0, seq_len = 0, n_prompts = 0, prompt_tokens = 0, gen_tokens = 0, skip = 0;
  auto parse_all = [&]() -> Status {
    HELIOS_ASSIGN_OR_RETURN(skip, args.integer("skip"));
    if (skip < 0) return invalid_argument("--skip must be >= 0");
    HELIOS_ASSIGN_OR_RETURN(max_tokens, args.integer("max-tokens"));
    HELIOS_ASSIGN_OR_RETURN(seq_len, args.integer("seq-len"));
    HELIOS_ASSIGN_OR_RETURN(n_prompts, args.integer("prompts"));
    HELIOS_ASSIGN_OR_RETURN(prompt_tokens, args.integer("prompt-tokens"));
    HELIOS_ASSIGN_OR_RETURN(gen_tokens, args.integer("gen-tokens"));
    if (max_tokens < 2) return invalid_argument("--max-tokens must be >= 2");
    if (seq_len < 2) return invalid_argument("--seq-len must be >= 2");
    if (n_prompts < 0) return invalid_argument("--prompts must be >= 0");
    if (prompt_tokens < 1 || gen_tokens < 1) return invalid_argument("--prompt-tokens and --gen-tokens must be >= 1");
    return ok_status();
  };
  if (Status s = parse_all(); !s.ok()) return usage_error("profile", s.message());
  auto documents = load_text_documents(args.str("text"));
  if (!documents.ok()) return fail("profile", documents.status());
  if (skip >= static_cast<int64_t>(documents->size())) {
    return usage_error("profile", "--skip " + std::to_string(skip) + " leaves none of the text's " +
                                      std::to_string(documents->size()) + " documents");
  }
  documents->erase(documents->begin(), documents->begin() + skip);
  auto loaded = load_model(args);
  if (!loaded.ok()) return fail("profile", loaded.status());
  Model& model = *loaded->model;
  if (model.exit_layers().empty()) return usage_error("profile", "no exit layers: give --exits or --exit-every");
  ExitHeadSet heads;
  const ExitHeadSet* heads_ptr = nullptr;
  if (!loaded->heads_path.empty()) {
    auto h = load_exit_heads(loaded->heads_path, model.config());
    if (!h.ok()) return fail("profile", h.status());
    heads = std::move(*h);
    heads_ptr = &heads;
  }

  std::vector<ExitProfile> profiles;
  const auto t0 = Clock::now();
  const auto sequences = make_token_sequences(model.tokenizer(), *documents, static_cast<int32_t>(seq_len), max_tokens);
  auto tf = teacher_forced(model, sequences);
  if (!tf.ok()) return fail("profile", tf.status());
  std::fprintf(stderr, "profile: teacher-forced over %lld tokens (%.1f s)\n", static_cast<long long>(tf->n_tokens()),
               since(t0));
  profiles.push_back(build_exit_profile(*tf, "teacher-forced", heads_ptr));

  double observe_ms = 0, plain_ms = 0;
  if (n_prompts > 0) {
    ExitObservations fr_obs;
    double observe_s = 0, plain_s = 0;
    int64_t decoded = 0;
    for (int64_t i = 0; i < n_prompts && i < static_cast<int64_t>(documents->size()); ++i) {
      std::vector<TokenId> prompt = model.tokenizer().encode((*documents)[i], /*add_special=*/true, /*parse_special=*/false);
      if (prompt.size() > static_cast<size_t>(prompt_tokens)) prompt.resize(prompt_tokens);
      GenerateOptions opt;  // greedy, full depth
      opt.max_tokens = static_cast<int32_t>(gen_tokens);
      opt.ignore_eos = true;
      // Both ways, in alternating order so that neither gets the warm caches every time.
      StatusOr<GenerateResult> observed = internal_error("not run"), plain = internal_error("not run");
      for (int pass = 0; pass < 2; ++pass) {
        opt.observe_exits = (pass == 0) == (i % 2 == 0);
        (opt.observe_exits ? observed : plain) = generate(model, prompt, opt);
      }
      if (!observed.ok()) return fail("profile", observed.status());
      if (!plain.ok()) return fail("profile", plain.status());
      if (plain->tokens != observed->tokens) {
        return fail("profile", internal_error("observe mode changed the generated tokens of prompt " + std::to_string(i)));
      }
      observe_s += observed->decode_seconds;
      plain_s += plain->decode_seconds;
      decoded += static_cast<int64_t>(observed->tokens.size()) - 1;
      fr_obs.layers = observed->observed_layers;
      for (size_t t = 0; t < observed->observed.size(); ++t) {
        fr_obs.exits.push_back(observed->observed[t]);
        fr_obs.final_top1.push_back(observed->tokens[t]);  // greedy: the token is the last layer's top-1
      }
    }
    observe_ms = 1e3 * observe_s / static_cast<double>(std::max<int64_t>(decoded, 1));
    plain_ms = 1e3 * plain_s / static_cast<double>(std::max<int64_t>(decoded, 1));
    std::fprintf(stderr, "profile: free-running, %lld tokens; observe mode %.2f ms/token vs %.2f without (%.2fx)\n",
                 static_cast<long long>(fr_obs.n_tokens()), observe_ms, plain_ms, plain_ms > 0 ? observe_ms / plain_ms : 0.0);
    profiles.push_back(build_exit_profile(fr_obs, "free-running", heads_ptr));
  }

  std::printf("# Exit profile: %s\n\n- heads: %s\n- text: %s\n\n", args.str("model").c_str(),
              loaded->heads_path.empty() ? "logit lens" : loaded->heads_path.c_str(), args.str("text").c_str());
  std::fputs(exit_profile_markdown(profiles).c_str(), stdout);
  if (n_prompts > 0) {
    std::printf("Observe mode (every exit head beside the full-depth pass, output unchanged): %.2f ms/token "
                "against %.2f without, %.2fx.\n", observe_ms, plain_ms, plain_ms > 0 ? observe_ms / plain_ms : 0.0);
  }
  if (args.has("json")) {
    std::ofstream out(args.str("json"));
    nlohmann::json j = {{"model", args.str("model")},
                        {"heads", loaded->heads_path},
                        {"text", args.str("text")},
                        {"skip_documents", skip},
                        {"observe_ms_per_token", observe_ms},
                        {"plain_ms_per_token", plain_ms},
                        {"profiles", nlohmann::json::parse(exit_profile_json(profiles))}};
    out << j.dump(2) << "\n";
    if (!out) return fail("profile", invalid_argument("cannot write " + args.str("json")));
    std::fprintf(stderr, "profile: wrote %s\n", args.str("json").c_str());
  }
  return 0;
}

}  // namespace helios::cli
