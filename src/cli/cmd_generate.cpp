// helios generate: load a model, run one prompt, stream the text to stdout, timings to stderr.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_setup.h"
#include "helios/chat_template.h"
#include "helios/generate.h"
#include "helios/model_setup.h"

namespace helios::cli {

int cmd_generate(int argc, char** argv) {
  Args args("generate",
            "Generates text from a prompt. Only the generated text goes to stdout (not the\n"
            "prompt); model loading progress, timings and early-exit statistics go to stderr.");
  add_model_options(args);
  args.option("tensor-parallel", "N", "split the model over N ranks (tensor parallelism) in this process, sharing "
                                      "--threads; the same tokens as one rank, to check the split", "1")
      .option("prompt", "TEXT", "the prompt (required)")
      .option("chat", "", "wrap the prompt as a user turn with the model's chat template")
      .option("system", "TEXT", "system message for --chat")
      .option("max-tokens", "N", "generate at most N tokens", "128")
      .option("temperature", "T", "sampling temperature; 0 picks the most likely token (the default without "
              "--chat; the defaults of these four " + std::string(kChatSamplingNote) + ")", "0")
      .option("top-k", "K", "sample from the K most likely tokens; 0 = all", "0")
      .option("top-p", "P", "sample from the smallest set with probability mass >= P", "1")
      .option("min-p", "P", "drop tokens less likely than P x the most likely", "0")
      .option("repeat-penalty", "R", "divide the logits of recent tokens by R", "1")
      .option("presence-penalty", "P", "subtract P from the logit of every token generated so far ([-2, 2])", "0")
      .option("frequency-penalty", "F", "subtract F times its count from each generated token's logit ([-2, 2])", "0")
      .option("seed", "S", "random seed for sampling", "0")
      .option("stop", "TEXT", "stop when the output contains TEXT (not printed)")
      .option("ignore-eos", "", "keep generating past end-of-sequence tokens")
      .option("show-exits", "", "print each token's exit layer and confidence to stderr")
      .option("kv-type", "T", "KV cache elements: f16 (llama.cpp's default, half the memory), fp8 (E4M3, a quarter) "
              "or f32 (the reference arithmetic); auto = f16 where the backend has it", "auto");
  add_exit_rule_options(args);
  args.example("helios generate --prompt \"Once upon a time\" --max-tokens 64")
      .example("helios generate --chat --prompt \"Name three colours.\" --seed 42")
      .example("helios generate --chat --prompt \"What is the capital of France?\" --temperature 0")
      .example("helios generate --prompt \"The sky is\" --policy per-token --threshold 0.8 --exits 8,16,24")
      .example("helios generate --prompt \"The sky is\" --policy self-speculative --depth 12 --draft-tokens 4");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("generate", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (!args.has("prompt")) return usage_error("generate", "--prompt TEXT is required (see --help)");
  if (args.has("chat")) use_chat_sampling_defaults(args);

  GenerateOptions opt;
  auto parse_all = [&]() -> Status {
    HELIOS_ASSIGN_OR_RETURN(int64_t max_tokens, args.integer("max-tokens"));
    HELIOS_ASSIGN_OR_RETURN(double temperature, args.number("temperature"));
    HELIOS_ASSIGN_OR_RETURN(int64_t top_k, args.integer("top-k"));
    HELIOS_ASSIGN_OR_RETURN(double top_p, args.number("top-p"));
    HELIOS_ASSIGN_OR_RETURN(double min_p, args.number("min-p"));
    HELIOS_ASSIGN_OR_RETURN(double penalty, args.number("repeat-penalty"));
    HELIOS_ASSIGN_OR_RETURN(double presence, args.number("presence-penalty"));
    HELIOS_ASSIGN_OR_RETURN(double frequency, args.number("frequency-penalty"));
    HELIOS_ASSIGN_OR_RETURN(int64_t seed, args.integer("seed"));
    if (max_tokens <= 0) return invalid_argument("--max-tokens must be > 0");
    opt.max_tokens = static_cast<int32_t>(max_tokens);
    opt.sampling.temperature = static_cast<float>(temperature);
    opt.sampling.top_k = static_cast<int32_t>(top_k);
    opt.sampling.top_p = static_cast<float>(top_p);
    opt.sampling.min_p = static_cast<float>(min_p);
    opt.sampling.repetition_penalty = static_cast<float>(penalty);
    opt.sampling.presence_penalty = static_cast<float>(presence);
    opt.sampling.frequency_penalty = static_cast<float>(frequency);
    opt.sampling.seed = static_cast<uint64_t>(seed);
    if (args.has("stop")) opt.stop.push_back(args.str("stop"));
    opt.ignore_eos = args.has("ignore-eos");
    const std::string kv_type = args.str("kv-type");
    if (kv_type != "auto" && kv_type != "f16" && kv_type != "f32" && kv_type != "fp8") {
      return invalid_argument("--kv-type must be auto, f16, fp8 or f32, got '" + kv_type + "'");
    }
    return opt.sampling.validate();
  };
  if (Status s = parse_all(); !s.ok()) return usage_error("generate", s.message());
  auto loaded = load_model(args);
  if (!loaded.ok()) return fail("generate", loaded.status());
  Model& model = *loaded->model;
  auto rule = exit_rule_from_args(args, model, args.str("policy"), args.str("threshold"));
  if (!rule.ok()) return usage_error("generate", rule.status().message());
  opt.exit = *rule;
  EngineConfig kv_choice;  // the engine's own rule for auto, f16 and f32
  if (args.str("kv-type") != "auto") {
    const std::string t = args.str("kv-type");
    kv_choice.kv_cache_type = t == "f16" ? kernels::KvType::kF16 : t == "fp8" ? kernels::KvType::kFp8E4M3 : kernels::KvType::kF32;
  }
  auto kv_type = resolve_kv_type(kv_choice, *loaded->backend);
  if (!kv_type.ok()) return usage_error("generate", kv_type.status().message());
  opt.kv_type = *kv_type;
  const double load_s = loaded->load_seconds;

  const Tokenizer& tok = model.tokenizer();
  std::vector<TokenId> prompt;
  if (args.has("chat")) {
    // The model's chat template; only its own text may become control tokens.
    ChatRequest request;
    if (args.has("system")) request.messages.push_back({"system", args.str("system")});
    request.messages.push_back({"user", args.str("prompt")});
    const ChatFormatter formatter(tok);
    auto chat = formatter.format(request);
    if (!chat.ok()) return fail("generate", chat.status());
    if (!chat->fallback_reason.empty()) std::fprintf(stderr, "helios: warning: chat prompt: %s\n", chat->fallback_reason.c_str());
    prompt = formatter.encode(*chat);
  } else {
    prompt = tok.encode(args.str("prompt"), /*add_special=*/true, /*parse_special=*/true);
  }
  auto result = generate(model, prompt, opt, [](const std::string& piece) {
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
  if (opt.exit.policy != ExitPolicy::kFull || args.has("show-exits")) {
    double sum_exit = 0;
    for (int32_t l : r.exit_layers) sum_exit += l;
    const double per_token = n_decoded ? static_cast<double>(r.decode_layer_rows) / n_decoded : 0;
    std::fprintf(stderr, "early exit: policy %s | mean exit layer %.2f of %d | decode: %.2f layers computed per token, "
                 "%.2f K/V-filled, %.2f LM-head rows",
                 exit_policy_name(opt.exit.policy), r.exit_layers.empty() ? 0.0 : sum_exit / r.exit_layers.size(),
                 model.n_layers_loaded(), per_token, n_decoded ? double(r.decode_fill_rows) / n_decoded : 0.0,
                 n_decoded ? double(r.decode_head_rows) / n_decoded : 0.0);
    if (opt.exit.policy == ExitPolicy::kSelfSpeculative) {
      std::fprintf(stderr, " | drafts accepted %lld/%lld", static_cast<long long>(r.accepted),
                   static_cast<long long>(r.drafted));
    }
    std::fputc('\n', stderr);
  }
  if (args.has("show-exits")) {
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      std::fprintf(stderr, "token %zu id %d exit %d confidence %.3f %s\n", i, r.tokens[i], r.exit_layers[i],
                   r.confidences[i], tok.decode({r.tokens[i]}).c_str());
    }
  }
  return 0;
}

}  // namespace helios::cli
