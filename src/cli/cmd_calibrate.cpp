// helios calibrate: fit exit heads (affine adapters and agreement probes) on calibration text and
// write them as the model's sidecar; a per-exit summary table goes to stdout, progress to stderr.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_setup.h"
#include "helios/calibrate.h"

namespace helios::cli {
namespace {

std::string head_label(const ExitCalibration& e) {
  return e.lookahead ? "lookahead head" : "exit " + std::to_string(e.layer);
}

}  // namespace

int cmd_calibrate(int argc, char** argv) {
  Args args("calibrate",
            "Fits the exit heads of a model on calibration text and writes them to a sidecar GGUF\n"
            "that `helios generate`, `helios eval` and heliosd pick up (--heads, default: next to the\n"
            "model). The model runs teacher-forced over the text; per exit it fits an affine adapter\n"
            "onto the last layer's hidden state, kept only if its top-1 agrees with the full model's\n"
            "more often than the plain logit lens does on held-out text (every 5th sequence), and a\n"
            "logistic probe that predicts that agreement from h_k alone (the `probe` measure).\n"
            "With --distill each adapter is then trained further, from the ridge fit, by distillation:\n"
            "minimising the KL divergence from the last layer's next-token distribution to the exit's\n"
            "through the frozen final norm and LM head (the best of identity, ridge and distilled on\n"
            "held-out agreement is kept). With --mlp-hidden H a residual MLP (SwiGLU, H hidden units) is\n"
            "trained the same way after the distilled adapter, with the adapter frozen: the `mlp` head,\n"
            "with more capacity than an affine map. Every exit also gets an agreement curve: the `agreement`\n"
            "measure maps its top-1 probability to the share of calibration tokens at least that\n"
            "confident whose top-1 was the last layer's, so --threshold 0.9 means 90% of leaving\n"
            "tokens agree.\n"
            "With --lookahead it also fits a lookahead head, the same way (ridge, --distill, --mlp-hidden),\n"
            "on the last layer's state at each position against the model's next-token distribution one\n"
            "position later: its top-1 guesses the token after the next one, a draft that self-speculative\n"
            "decoding at the model's depth (--depth = the last layer) verifies in the next pass for free.\n"
            "Text: plain text (one document per paragraph) or JSON/JSONL (ShareGPT conversations,\n"
            "GSM8K question/answer, prompt/text fields).",
            "--text FILE");
  add_model_options(args, /*heads_option=*/false);
  args.option("text", "FILE", "calibration text; repeat for several files, whose documents are taken in turn (required)")
      .option("out", "PATH", "where to write the heads (default: MODEL without .gguf + .exits.gguf)")
      .option("max-tokens", "N", "calibration tokens in all", "8192")
      .option("seq-len", "S", "tokens per teacher-forced sequence", "256")
      .option("ridge", "R", "adapter ridge penalties, in units of the inputs' variance: auto (1e-6,1e-5,...,0.1) or "
              "a comma list; each exit keeps the one that agrees most on held-out tokens", "auto")
      .option("probe-l2", "L", "probe L2 penalty", "0.1")
      .option("target-agreement", "A", "per-exit thresholds: the share of leaving tokens whose top-1 must be the "
                                       "full model's (policy per-token with --threshold calibrated uses them)", "0.9")
      .option("distill", "", "train each adapter by distillation as well (minutes on 2 cores; progress per epoch)")
      .option("distill-epochs", "N", "distillation passes over the fit tokens (the best held-out one is kept)", "3")
      .option("distill-lr", "LR", "distillation's Adam learning rate", "1e-3")
      .option("teacher-top-k", "K", "the last layer's most likely tokens the sparse KL keeps", "64")
      .option("head", "KIND", "the head every exit keeps: best (of lens, ridge, distilled and mlp, on held-out "
              "agreement), or lens | ridge | distilled | mlp whatever it scores, to compare kinds on one calibration",
              "best")
      .option("mlp-hidden", "H", "also train a residual MLP of H hidden units after each distilled adapter (head kind "
              "mlp: more capacity than an affine map, about the LM head's cost again per epoch); 0 = none", "0")
      .option("mlp-lr", "LR", "the residual MLP's Adam learning rate", "3e-4")
      .option("mlp-init", "HOW", "how the MLP starts: random (down = 0: the distilled head), or last-ffn: the model's "
              "own last FFN (its width; --mlp-hidden not needed) behind a ridge adapter onto the state entering the "
              "last block, i.e. the exit skips to the last block's FFN; try --mlp-lr 1e-5", "random")
      .option("lookahead", "", "also fit a lookahead head (the token after next, from the last layer); --exits may "
              "then be left out")
      .option("distill-rank", "R", "distillation trains ridge + diagonal + a rank-R product; 0 = the whole matrix", "32");
  args.example("helios calibrate --model models/SmolLM2-135M-Instruct.Q4_1.gguf --exits 4,8,12,16,20,24,28 \\\n"
               "      --text ../shared/data/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json")
      .example("helios calibrate --model models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf --exits 7,14,21 --distill \\\n"
               "      --text tests/data/sharegpt/ShareGPT_V3_filtered_first80_prompts.json --max-tokens 4096")
      .example("helios calibrate --model models/stories260K.gguf --exits 1,2,3,4 --text stories.txt --out /tmp/s.exits.gguf");
  // --text may repeat: collect every occurrence before the parser keeps the last.
  std::vector<std::string> texts;
  for (int i = 0; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--text") texts.push_back(argv[i + 1]);
  }
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--text=", 0) == 0) texts.push_back(a.substr(7));
  }
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("calibrate", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (texts.empty()) return usage_error("calibrate", "--text FILE is required (see --help)");

  CalibrationOptions opt;
  int64_t max_tokens = 0, seq_len = 0;
  auto parse_all = [&]() -> Status {
    HELIOS_ASSIGN_OR_RETURN(max_tokens, args.integer("max-tokens"));
    HELIOS_ASSIGN_OR_RETURN(seq_len, args.integer("seq-len"));
    HELIOS_ASSIGN_OR_RETURN(double l2, args.number("probe-l2"));
    HELIOS_ASSIGN_OR_RETURN(double target, args.number("target-agreement"));
    if (!(target > 0 && target <= 1)) return invalid_argument("--target-agreement must be in (0, 1]");
    opt.target_agreement = target;
    if (max_tokens < 16) return invalid_argument("--max-tokens must be >= 16");
    if (seq_len < 2) return invalid_argument("--seq-len must be >= 2");
    if (args.str("ridge") != "auto") {
      opt.ridges.clear();
      std::stringstream list(args.str("ridge"));
      for (std::string item; std::getline(list, item, ',');) {
        char* end = nullptr;
        const double ridge = std::strtod(item.c_str(), &end);
        if (item.empty() || *end != '\0' || !(ridge >= 0) || !std::isfinite(ridge)) {
          return invalid_argument("--ridge must be auto or a comma list of numbers >= 0, got '" + args.str("ridge") + "'");
        }
        opt.ridges.push_back(static_cast<float>(ridge));
      }
    }
    if (!(l2 >= 0)) return invalid_argument("--probe-l2 must be >= 0");
    opt.probe_l2 = static_cast<float>(l2);
    opt.head = args.str("head");
    if (opt.head != "best" && opt.head != "lens" && opt.head != "ridge" && opt.head != "distilled" && opt.head != "mlp") {
      return invalid_argument("--head must be best, lens, ridge, distilled or mlp, got '" + opt.head + "'");
    }
    HELIOS_ASSIGN_OR_RETURN(int64_t mlp_hidden, args.integer("mlp-hidden"));
    if (mlp_hidden < 0 || mlp_hidden > 65536) return invalid_argument("--mlp-hidden must be 0..65536");
    opt.mlp_init = args.str("mlp-init");
    if (opt.mlp_init != "random" && opt.mlp_init != "last-ffn") {
      return invalid_argument("--mlp-init must be random or last-ffn, got '" + opt.mlp_init + "'");
    }
    const bool from_last_ffn = opt.mlp_init == "last-ffn";
    if (from_last_ffn && mlp_hidden != 0) return invalid_argument("--mlp-init last-ffn has the FFN's width: leave out --mlp-hidden");
    if (opt.head == "mlp" && mlp_hidden == 0 && !from_last_ffn) {
      return invalid_argument("--head mlp needs --mlp-hidden H (e.g. 1024) or --mlp-init last-ffn");
    }
    opt.mlp_hidden = static_cast<int32_t>(mlp_hidden);
    HELIOS_ASSIGN_OR_RETURN(double mlp_lr, args.number("mlp-lr"));
    if (!(mlp_lr > 0 && mlp_lr < 1)) return invalid_argument("--mlp-lr must be in (0, 1)");
    opt.mlp_learning_rate = static_cast<float>(mlp_lr);
    // The MLP is trained on the distilled adapter's output.
    opt.distill = args.has("distill") || opt.head == "distilled" || mlp_hidden > 0 || from_last_ffn;
    HELIOS_ASSIGN_OR_RETURN(int64_t epochs, args.integer("distill-epochs"));
    HELIOS_ASSIGN_OR_RETURN(double lr, args.number("distill-lr"));
    HELIOS_ASSIGN_OR_RETURN(int64_t top_k, args.integer("teacher-top-k"));
    HELIOS_ASSIGN_OR_RETURN(int64_t rank, args.integer("distill-rank"));
    if (rank < 0 || rank > 4096) return invalid_argument("--distill-rank must be 0..4096");
    opt.distill_rank = static_cast<int32_t>(rank);
    if (epochs < 1 || epochs > 1000) return invalid_argument("--distill-epochs must be 1..1000");
    if (!(lr > 0 && lr < 1)) return invalid_argument("--distill-lr must be in (0, 1)");
    if (top_k < 1 || top_k > 4096) return invalid_argument("--teacher-top-k must be 1..4096");
    opt.distill_epochs = static_cast<int32_t>(epochs);
    opt.distill_learning_rate = static_cast<float>(lr);
    opt.teacher_top_k = static_cast<int32_t>(top_k);
    return ok_status();
  };
  if (Status s = parse_all(); !s.ok()) return usage_error("calibrate", s.message());
  opt.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };

  std::vector<std::vector<std::string>> per_file;
  for (const std::string& path : texts) {
    auto docs = load_text_documents(path);
    if (!docs.ok()) return fail("calibrate", docs.status());
    std::fprintf(stderr, "calibrate: %s: %zu documents\n", path.c_str(), docs->size());
    per_file.push_back(std::move(*docs));
  }
  const std::vector<std::string> documents = interleave_documents(std::move(per_file));
  auto loaded = load_model(args);
  if (!loaded.ok()) return fail("calibrate", loaded.status());
  Model& model = *loaded->model;
  const bool lookahead = args.has("lookahead");
  // --lookahead alone fits the lookahead head only, not the default exits.
  const bool exits_given = args.has("exits") || args.str("exit-every") != "0";
  const std::vector<int32_t> exits = lookahead && !exits_given ? std::vector<int32_t>{} : model.exit_layers();
  if (exits.empty() && !lookahead) {
    return usage_error("calibrate", "no exit layers: give --exits or --exit-every (or --lookahead alone)");
  }
  if (seq_len > model.config().n_ctx_train) {
    return usage_error("calibrate", "--seq-len " + std::to_string(seq_len) + " exceeds the model's context of " +
                                        std::to_string(model.config().n_ctx_train) + " tokens");
  }
  const std::string out_path = args.has("out") ? args.str("out") : default_exit_heads_path(args.str("model"));

  const auto t0 = std::chrono::steady_clock::now();
  const auto sequences = make_token_sequences(model.tokenizer(), documents, static_cast<int32_t>(seq_len), max_tokens);
  int64_t n_tokens = 0;
  for (const auto& s : sequences) n_tokens += static_cast<int64_t>(s.size());
  std::fprintf(stderr, "calibrate: %lld tokens in %zu sequences of at most %lld\n", static_cast<long long>(n_tokens),
               sequences.size(), static_cast<long long>(seq_len));
  if (n_tokens < max_tokens) {
    std::fprintf(stderr, "calibrate: note: the text gave %lld of the %lld tokens asked for\n",
                 static_cast<long long>(n_tokens), static_cast<long long>(max_tokens));
  }
  auto data = collect_hidden_states(model, sequences, exits, opt.log, !exits.empty() && opt.mlp_init == "last-ffn");
  if (!data.ok()) return fail("calibrate", data.status());
  StatusOr<CalibrationResult> result = CalibrationResult{};
  result->heads.model_name = model.config().name;
  result->heads.n_layer = model.config().n_layer;
  result->heads.n_embd = model.config().n_embd;
  if (!exits.empty()) result = fit_exit_heads(model, *data, opt);
  if (!result.ok()) return fail("calibrate", result.status());
  if (lookahead) {
    auto ahead = fit_lookahead_head(model, *data, opt);
    if (!ahead.ok()) return fail("calibrate", ahead.status());
    result->heads.has_lookahead = true;
    result->heads.lookahead = std::move(ahead->heads.heads.front());
    result->exits.push_back(ahead->exits.front());
  }
  if (Status s = save_exit_heads(result->heads, out_path); !s.ok()) return fail("calibrate", s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("%s", calibration_table(*result).c_str());
  int n_identity = 0;
  for (const auto& e : result->exits) n_identity += !e.adapter_kept;
  if (opt.distill) {
    for (const auto& e : result->exits) {
      std::printf("%s: distilled in %.1f s, held-out sparse KL %.4f -> %.4f nats\n", head_label(e).c_str(), e.distill_seconds,
                  e.distill_kl_start, e.distill_kl_best);
    }
  }
  if (opt.mlp_hidden > 0 || opt.mlp_init == "last-ffn") {
    const int32_t width = opt.mlp_hidden > 0 ? opt.mlp_hidden : model.config().n_ff;
    for (const auto& e : result->exits) {
      std::printf("%s: residual MLP (%d hidden) trained in %.1f s, held-out sparse KL %.4f -> %.4f nats\n",
                  head_label(e).c_str(), width, e.mlp_seconds, e.mlp_kl_start, e.mlp_kl_best);
    }
  }
  std::printf("\n%lld calibration tokens (%lld fit, %lld held out); agreement = exit top-1 == final top-1.\n",
              static_cast<long long>(data->n_tokens()), static_cast<long long>(result->exits[0].n_fit),
              static_cast<long long>(result->exits[0].n_held_out));
  if (n_identity > 0 && opt.head == "best") {
    std::printf("%d exit(s) keep the identity head (logit lens): their adapter did not beat it on held-out tokens.\n",
                n_identity);
  }
  std::printf("wrote %s (%.1f s)\n", out_path.c_str(), seconds);
  return 0;
}

}  // namespace helios::cli
