// helios eval: compare exit rules with the full model on a text — perplexity, greedy agreement,
// work per token and decode speed — as a Markdown table on stdout (and JSON on request).
#include <cstdio>
#include <fstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_setup.h"
#include "helios/chat_template.h"
#include "helios/evaluate.h"

namespace helios::cli {
namespace {

constexpr int32_t kPromptTokens = 128;  // prompts are cut to their first tokens: the context is what varies

// Every (policy, threshold) pair; thresholds only for the policies that read them, and fixed-depth
// without --depth at every exit point.
StatusOr<std::vector<ExitRule>> rules_from_args(const Args& args, const Model& model) {
  const std::vector<std::string> thresholds = split_list(args.str("threshold"));
  if (thresholds.empty()) return invalid_argument("--threshold needs at least one value");
  for (const std::string& t : thresholds) {  // checked whether or not a listed policy reads them
    if (t != "calibrated") HELIOS_RETURN_IF_ERROR(parse_number_list("threshold", t).status());
  }
  const std::vector<std::string> policies = split_list(args.str("policy"));
  if (policies.empty()) return invalid_argument("--policy needs at least one policy");
  HELIOS_ASSIGN_OR_RETURN(int64_t depth, args.integer("depth"));
  std::vector<ExitRule> rules;
  for (const std::string& name : policies) {
    HELIOS_ASSIGN_OR_RETURN(ExitPolicy policy, parse_exit_policy(name));
    if (policy == ExitPolicy::kPerToken || policy == ExitPolicy::kBatchSync ||
        policy == ExitPolicy::kSelfSpeculative) {
      for (const std::string& t : thresholds) {
        HELIOS_ASSIGN_OR_RETURN(ExitRule r, exit_rule_from_args(args, model, name, t));
        rules.push_back(r);
      }
    } else if (policy == ExitPolicy::kFixedDepth && depth == 0) {
      for (int32_t layer : model.exit_layers()) {
        HELIOS_ASSIGN_OR_RETURN(ExitRule r, exit_rule_from_args(args, model, name, thresholds[0]));
        r.depth = layer;
        rules.push_back(r);
      }
    } else {
      HELIOS_ASSIGN_OR_RETURN(ExitRule r, exit_rule_from_args(args, model, name, thresholds[0]));
      rules.push_back(r);
    }
  }
  return rules;
}

// The first n documents as prompts (with --chat, each a user turn of the model's chat template),
// each cut to kPromptTokens.
StatusOr<std::vector<std::vector<TokenId>>> prompts_from(const Tokenizer& tok, const std::vector<std::string>& docs,
                                                         int64_t n, bool chat) {
  const ChatFormatter formatter(tok);
  bool warned = false;
  std::vector<std::vector<TokenId>> out;
  for (const std::string& doc : docs) {
    if (static_cast<int64_t>(out.size()) >= n) break;
    std::vector<TokenId> ids = tok.encode(doc, /*add_special=*/!chat, /*parse_special=*/false);
    if (ids.size() > static_cast<size_t>(kPromptTokens)) ids.resize(kPromptTokens);
    if (chat) {
      ChatRequest request;
      request.messages.push_back({"user", tok.decode(ids)});
      HELIOS_ASSIGN_OR_RETURN(ChatPrompt prompt, formatter.format(request));
      if (!prompt.fallback_reason.empty() && !warned) {
        std::fprintf(stderr, "helios: warning: chat prompts: %s\n", prompt.fallback_reason.c_str());
        warned = true;
      }
      ids = formatter.encode(prompt);
    }
    if (!ids.empty()) out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  Args args("eval",
            "Evaluates early-exit rules against the full model on a text, one table row per rule\n"
            "(full first, as the baseline):\n"
            "  perplexity    teacher-forced over the text (--max-tokens), each row taking its rule's exit;\n"
            "                Δppl is the increase over full\n"
            "  agreement     greedy generations (--prompts prompts from the text, --gen-tokens each)\n"
            "                compared position by position with full's; identical = whole generations equal\n"
            "  work          mean exit layer of the generated tokens; blocks computed, K/V filled and\n"
            "                LM-head rows per decoded token\n"
            "  speed         decode tokens/s and the speed-up over full, measured in this run\n"
            "Thresholds apply to per-token, batch-sync and self-speculative (drafting stops at a draft below\n"
            "the threshold); fixed-depth without --depth runs at every exit.\n"
            "self-speculative must agree 100%: it drafts with an exit and keeps only what full confirms.",
            "--text FILE");
  add_model_options(args);
  add_exit_rule_options(args);
  args.option("text", "FILE", "evaluation text: plain text or JSON/JSONL, as for calibrate (required)")
      .option("max-tokens", "N", "tokens of text for the perplexity", "4096")
      .option("seq-len", "S", "tokens per teacher-forced sequence", "256")
      .option("prompts", "N", "prompts (the text's first documents, cut to 128 tokens) to generate from", "8")
      .option("gen-tokens", "G", "greedy tokens generated per prompt", "32")
      .option("chat", "", "wrap each prompt as a user turn in the model's chat format")
      .option("json", "PATH", "also write the results as JSON");
  args.example("helios eval --text held_out.json --policy full,per-token,fixed-depth,self-speculative \\\n"
               "      --threshold 0.5,0.7,0.9")
      .example("helios eval --model models/stories260K.gguf --exits 1,2,3,4 --text stories.txt --policy per-token \\\n"
               "      --threshold 0,0.5,1 --measure probe --json /tmp/eval.json");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error("eval", s.message());
  if (args.help_requested()) {
    std::fputs(args.help().c_str(), stdout);
    return 0;
  }
  if (!args.has("text")) return usage_error("eval", "--text FILE is required (see --help)");
  int64_t max_tokens = 0, seq_len = 0, n_prompts = 0, gen_tokens = 0;
  auto parse_all = [&]() -> Status {
    HELIOS_ASSIGN_OR_RETURN(max_tokens, args.integer("max-tokens"));
    HELIOS_ASSIGN_OR_RETURN(seq_len, args.integer("seq-len"));
    HELIOS_ASSIGN_OR_RETURN(n_prompts, args.integer("prompts"));
    HELIOS_ASSIGN_OR_RETURN(gen_tokens, args.integer("gen-tokens"));
    if (max_tokens < 2) return invalid_argument("--max-tokens must be >= 2");
    if (seq_len < 2) return invalid_argument("--seq-len must be >= 2");
    if (n_prompts < 1) return invalid_argument("--prompts must be >= 1");
    if (gen_tokens < 1) return invalid_argument("--gen-tokens must be >= 1");
    return ok_status();
  };
  if (Status s = parse_all(); !s.ok()) return usage_error("eval", s.message());

  auto docs = load_text_documents(args.str("text"));
  if (!docs.ok()) return fail("eval", docs.status());
  auto loaded = load_model(args);
  if (!loaded.ok()) return fail("eval", loaded.status());
  Model& model = *loaded->model;
  auto rules = rules_from_args(args, model);
  if (!rules.ok()) return usage_error("eval", rules.status().message());
  const int32_t n_ctx = model.config().n_ctx_train;
  if (seq_len > n_ctx || kPromptTokens + gen_tokens + 64 > n_ctx) {
    return usage_error("eval", "--seq-len or --gen-tokens too long for the model's context of " + std::to_string(n_ctx) +
                                   " tokens (prompts take up to " + std::to_string(kPromptTokens) + ")");
  }

  const Tokenizer& tok = model.tokenizer();
  const auto sequences = make_token_sequences(tok, *docs, static_cast<int32_t>(seq_len), max_tokens);
  const auto chat_prompts = prompts_from(tok, *docs, n_prompts, args.has("chat"));
  if (!chat_prompts.ok()) return fail("eval", chat_prompts.status());
  const auto& prompts = *chat_prompts;
  size_t n_rules = 1;  // full, always
  for (const ExitRule& r : *rules) n_rules += r.policy != ExitPolicy::kFull;
  std::fprintf(stderr, "eval: %zu documents; perplexity over %zu sequences, %zu prompts x %lld tokens, %zu rules\n",
               docs->size(), sequences.size(), prompts.size(), static_cast<long long>(gen_tokens), n_rules);
  EvalOptions opt;
  opt.gen_tokens = static_cast<int32_t>(gen_tokens);
  opt.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  auto rows = evaluate_exit_rules(model, *rules, sequences, prompts, opt);
  if (!rows.ok()) return fail("eval", rows.status());

  std::printf("%s", eval_table_markdown(*rows, model.n_layers_loaded()).c_str());
  std::printf("\nmodel %s, heads: %s; exits after layers", args.str("model").c_str(),
              loaded->heads_path.empty() ? "logit lens" : loaded->heads_path.c_str());
  for (int32_t l : model.exit_layers()) std::printf(" %d", l);
  std::printf("; perplexity over %lld tokens; agreement over %zu prompts x %lld greedy tokens\n",
              static_cast<long long>((*rows)[0].n_scored), prompts.size(), static_cast<long long>(gen_tokens));
  if (args.has("json")) {
    std::ofstream out(args.str("json"));
    out << eval_rows_json(*rows, args.str("model"), model.n_layers_loaded(), loaded->heads_path);
    if (!out) return fail("eval", invalid_argument("cannot write " + args.str("json") + " (check the directory)"));
    std::fprintf(stderr, "eval: wrote %s\n", args.str("json").c_str());
  }
  return 0;
}

}  // namespace helios::cli
