// helios generate: load a model, run one prompt, stream the text to stdout, timings to stderr.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "helios/generate.h"

namespace helios::cli {

int cmd_generate(int argc, char** argv) {
  Args args("generate",
            "Generates text from a prompt. Only the generated text goes to stdout (not the\n"
            "prompt); model loading progress and timings go to stderr.");
  args.option("model", "PATH", "GGUF model file", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
      .option("prompt", "TEXT", "the prompt (required)")
      .option("chat", "", "wrap the prompt as a user turn in the model's chat format")
      .option("system", "TEXT", "system message for --chat")
      .option("max-tokens", "N", "generate at most N tokens", "128")
      .option("temperature", "T", "sampling temperature; 0 picks the most likely token", "0")
      .option("top-k", "K", "sample from the K most likely tokens; 0 = all", "0")
      .option("top-p", "P", "sample from the smallest set with probability mass >= P", "1")
      .option("min-p", "P", "drop tokens less likely than P x the most likely", "0")
      .option("repeat-penalty", "R", "divide the logits of recent tokens by R", "1")
      .option("seed", "S", "random seed for sampling", "0")
      .option("stop", "TEXT", "stop when the output contains TEXT (not printed)")
      .option("ignore-eos", "", "keep generating past end-of-sequence tokens")
      .option("threads", "N", "CPU threads; 0 = one per core", "0")
      .example("helios generate --prompt \"Once upon a time\" --max-tokens 64")
      .example("helios generate --chat --prompt \"Name three colours.\" --temperature 0.7 --seed 42");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("generate", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (!args.has("prompt")) return usage_error("generate", "--prompt TEXT is required (see --help)");

  GenerateOptions opt;
  auto parse_all = [&]() -> Status {
    HELIOS_ASSIGN_OR_RETURN(int64_t max_tokens, args.integer("max-tokens"));
    HELIOS_ASSIGN_OR_RETURN(double temperature, args.number("temperature"));
    HELIOS_ASSIGN_OR_RETURN(int64_t top_k, args.integer("top-k"));
    HELIOS_ASSIGN_OR_RETURN(double top_p, args.number("top-p"));
    HELIOS_ASSIGN_OR_RETURN(double min_p, args.number("min-p"));
    HELIOS_ASSIGN_OR_RETURN(double penalty, args.number("repeat-penalty"));
    HELIOS_ASSIGN_OR_RETURN(int64_t seed, args.integer("seed"));
    if (max_tokens <= 0) return invalid_argument("--max-tokens must be > 0");
    opt.max_tokens = static_cast<int32_t>(max_tokens);
    opt.sampling.temperature = static_cast<float>(temperature);
    opt.sampling.top_k = static_cast<int32_t>(top_k);
    opt.sampling.top_p = static_cast<float>(top_p);
    opt.sampling.min_p = static_cast<float>(min_p);
    opt.sampling.repetition_penalty = static_cast<float>(penalty);
    opt.sampling.seed = static_cast<uint64_t>(seed);
    if (args.has("stop")) opt.stop.push_back(args.str("stop"));
    opt.ignore_eos = args.has("ignore-eos");
    return opt.sampling.validate();
  };
  if (Status s = parse_all(); !s.ok()) return usage_error("generate", s.message());
  auto threads = args.integer("threads");
  if (!threads.ok()) return usage_error("generate", threads.status().message());

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto backend = make_cpu_backend(static_cast<int>(*threads));
  ModelLoadOptions load;
  // A live percentage on a terminal; nothing per tensor in a log file.
  const bool tty = ::isatty(STDERR_FILENO);
  int last_percent = -1;
  load.progress = [&](int done, int total) {
    const int percent = 100 * done / total;
    if (tty && percent != last_percent) {
      std::fprintf(stderr, "\rloading %s: %3d%%", args.str("model").c_str(), percent);
      last_percent = percent;
    }
  };
  auto model = Model::load(args.str("model"), *backend, load);
  if (!model.ok()) {
    if (tty) std::fputc('\n', stderr);
    return fail("generate", model.status());
  }
  const double load_s = std::chrono::duration<double>(clock::now() - t0).count();
  std::fprintf(stderr, "%sloaded %s (%d layers, %.1fM parameters) in %.2f s\n",
               tty ? "\r" : "", args.str("model").c_str(), (*model)->config().n_layer,
               (*model)->weights().n_params / 1e6, load_s);

  const Tokenizer& tok = (*model)->tokenizer();
  std::string text = args.str("prompt");
  if (args.has("chat")) {
    std::vector<ChatMessage> messages;
    if (args.has("system")) messages.push_back({"system", args.str("system")});
    messages.push_back({"user", text});
    text = tok.format_chat(messages);
  }
  const std::vector<TokenId> prompt = tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
  auto result = generate(**model, prompt, opt, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  if (!result.ok()) return fail("generate", result.status());
  std::fputc('\n', stdout);
  const auto& r = *result;
  const size_t n_decoded = r.tokens.size() > 0 ? r.tokens.size() - 1 : 0;  // the first comes from prefill
  std::fprintf(stderr,
               "load %.2f s | prompt %d tokens, %.1f tok/s | decode %zu tokens, %.1f tok/s | "
               "finish: %s\n",
               load_s, r.n_prompt_tokens, r.n_prompt_tokens / std::max(r.prefill_seconds, 1e-9),
               r.tokens.size(), n_decoded / std::max(r.decode_seconds, 1e-9),
               finish_reason_name(r.finish));
  return 0;
}

}  // namespace helios::cli
