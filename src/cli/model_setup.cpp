#include "cli/model_setup.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "helios/calibrate.h"
#include "helios/model_setup.h"

namespace helios::cli {

void add_model_options(Args& args, bool heads_option) {
  args.option("model", "PATH", "GGUF model file", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
      .option("threads", "N", "CPU threads; 0 = one per core", "0")
      .option("load-layers", "N", "load only the first N layers (fixed-depth's memory saving); 0 = all", "0")
      .option("rope-scaling", "TYPE:F[:CTX]",
              "replace the file's rope scaling: none, linear:F, or yarn:F[:CTX] (the context YaRN extends; "
              "default the model's), e.g. yarn:4:32768 for Qwen2.5's 128K context")
      .option("exits", "L1,L2,..", "exit layers (after that many blocks); default: the heads file's, else every 4th")
      .option("exit-every", "K", "exit after every K-th layer (with --exit-min)", "0")
      .option("exit-min", "L", "the first exit layer for --exit-every", "1");
  if (heads_option) {
    args.option("heads", "PATH", "exit heads from `helios calibrate`; 'none' = logit lens; default: MODEL.exits.gguf if present", "auto");
  }
}

void add_exit_rule_options(Args& args) {
  args.option("policy", "P", "early exit: full | per-token | batch-sync | fixed-depth | self-speculative", "full")
      .option("threshold", "T", "confidence to leave early; 0 = at the first exit, 1 = never early; 'calibrated' = "
                                "each exit's threshold from the heads file (top1); self-speculative: the draft "
                                "head's top1 to keep drafting (0 = always draft)", "0.9")
      .option("depth", "D", "fixed-depth: the exit layer (0 = loaded depth); self-speculative: the draft exit (0 = first exit; the loaded depth = draft with the heads' lookahead head)", "0")
      .option("measure", "M", "confidence: top1 | margin | entropy | probe | saturation | agreement (the heads file's curve: the share of leaving tokens that agree)", "top1")
      .option("draft-tokens", "N", "self-speculative: at most this many drafts per verification", "4")
      .option("draft-vocab", "N", "self-speculative: draft among the first N token ids only (a cheaper draft head; "
                                  "a multiple of 64); 0 = the whole vocabulary", "0");
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return out;
}

namespace {

// Each item of a comma list through `convert` (std::stoi / std::stod), which must use it whole.
template <typename T, typename Convert>
StatusOr<std::vector<T>> parse_list(const std::string& option, const std::string& text, Convert convert,
                                    const char* expected) {
  std::vector<T> out;
  for (const std::string& item : split_list(text)) {
    try {
      size_t used = 0;
      const T v = convert(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      return invalid_argument("--" + option + ": '" + item + "' is not " + expected);
    }
  }
  return out;
}

}  // namespace

StatusOr<std::vector<int32_t>> parse_int_list(const std::string& option, const std::string& text) {
  return parse_list<int32_t>(option, text, [](const std::string& s, size_t* used) { return std::stoi(s, used); },
                             "an integer (expected e.g. 4,8,12)");
}

StatusOr<std::vector<double>> parse_number_list(const std::string& option, const std::string& text) {
  return parse_list<double>(option, text, [](const std::string& s, size_t* used) { return std::stod(s, used); },
                            "a number (expected e.g. 0.5,0.9)");
}

StatusOr<std::optional<RopeScaling>> parse_rope_scaling(const std::string& text) {
  if (text.empty()) return std::optional<RopeScaling>{};
  const std::vector<std::string> parts = [&] {
    std::vector<std::string> out;
    for (size_t begin = 0;;) {
      const size_t colon = text.find(':', begin);
      out.push_back(text.substr(begin, colon == std::string::npos ? std::string::npos : colon - begin));
      if (colon == std::string::npos) return out;
      begin = colon + 1;
    }
  }();
  RopeScaling s;
  s.type = parts[0];
  const bool shape_ok = (s.type == "none" && parts.size() == 1) || (s.type == "linear" && parts.size() == 2) ||
                        (s.type == "yarn" && (parts.size() == 2 || parts.size() == 3));
  auto bad = [&] {
    return invalid_argument("--rope-scaling: '" + text + "' is not none, linear:F or yarn:F[:CTX] (e.g. yarn:4:32768)");
  };
  if (!shape_ok) return bad();
  try {
    size_t used = 0;
    if (parts.size() > 1) {
      s.factor = std::stod(parts[1], &used);
      if (used != parts[1].size()) return bad();
    }
    if (parts.size() > 2) {
      s.original_context = std::stoi(parts[2], &used);
      if (used != parts[2].size()) return bad();
    }
  } catch (const std::exception&) {
    return bad();
  }
  if (s.type != "none" && !(s.factor >= 1.0)) return invalid_argument("--rope-scaling: the factor must be >= 1");
  if (Status v = s.validate(); !v.ok()) return invalid_argument("--rope-scaling: " + v.message());
  return std::optional<RopeScaling>{s};
}

StatusOr<LoadedModel> load_model(const Args& args) {
  HELIOS_ASSIGN_OR_RETURN(int64_t threads, args.integer("threads"));
  HELIOS_ASSIGN_OR_RETURN(int64_t load_layers, args.integer("load-layers"));
  HELIOS_ASSIGN_OR_RETURN(int64_t every, args.integer("exit-every"));
  HELIOS_ASSIGN_OR_RETURN(int64_t min_layer, args.integer("exit-min"));
  HELIOS_ASSIGN_OR_RETURN(auto listed, parse_int_list("exits", args.str("exits")));
  if (load_layers < 0) return invalid_argument("--load-layers must be >= 0");
  // --tensor-parallel where the command has it (generate): ranks in this process, sharing the threads.
  int64_t ranks = 1;
  if (!args.str("tensor-parallel").empty()) {
    HELIOS_ASSIGN_OR_RETURN(ranks, args.integer("tensor-parallel"));
    if (ranks < 1 || ranks > 64) return invalid_argument("--tensor-parallel must be 1..64");
  }
  const int rank_threads_n = ranks > 1 ? rank_threads(static_cast<int>(threads), static_cast<int32_t>(ranks))
                                       : static_cast<int>(threads);

  ModelSetupOptions setup;
  setup.tensor_parallel = static_cast<int32_t>(ranks);
  setup.make_rank_backend = [rank_threads_n](int32_t) -> StatusOr<std::unique_ptr<Backend>> {
    return make_cpu_backend(rank_threads_n);
  };
  setup.path = args.str("model");
  setup.load_layers = static_cast<int32_t>(load_layers);
  HELIOS_ASSIGN_OR_RETURN(setup.rope_scaling, parse_rope_scaling(args.str("rope-scaling")));
  setup.exits.layers = listed;
  setup.exits.every = static_cast<int32_t>(every);
  setup.exits.min_layer = static_cast<int32_t>(min_layer);
  setup.default_exits = true;
  setup.names.load_layers = "--load-layers";
  // Exit heads: the named file, or the sidecar next to the model when there is one.
  // Without a --heads option (calibrate, which fits them) the exits use the logit lens.
  std::string heads = args.str("heads");
  if (heads == "auto") {
    const std::string sidecar = default_exit_heads_path(setup.path);
    heads = std::filesystem::exists(sidecar) ? sidecar : "";
  }
  if (heads != "none") setup.heads_path = heads;
  // A live percentage on a terminal; nothing per tensor in a log file.
  const bool tty = ::isatty(STDERR_FILENO);
  int last_percent = -1;
  setup.progress = [&](int done, int total) {
    const int percent = 100 * done / total;
    if (tty && percent != last_percent) {
      std::fprintf(stderr, "\rloading %s: %3d%%", setup.path.c_str(), percent);
      last_percent = percent;
    }
  };

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  LoadedModel out;
  out.backend = make_cpu_backend(rank_threads_n);
  auto loaded = setup_model(*out.backend, setup);
  if (tty && last_percent >= 0) std::fputc('\n', stderr);
  if (!loaded.ok()) return loaded.status();
  if (!loaded->warning.empty()) std::fprintf(stderr, "helios: warning: %s\n", loaded->warning.c_str());
  out.model = std::move(loaded->model);
  out.heads_path = setup.heads_path;
  out.load_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  const Model& m = *out.model;
  std::string points;
  for (int32_t l : m.exit_layers()) {
    if (!points.empty()) points += ',';
    points += std::to_string(l);
  }
  const std::string on_ranks = ranks > 1 ? " on rank 0 of " + std::to_string(ranks) + " tensor-parallel ranks" : "";
  std::fprintf(stderr, "loaded %s (%d of %d layers, %.1fM parameters%s) in %.2f s; exits after layers %s (%s)\n",
               setup.path.c_str(), m.n_layers_loaded(), m.config().n_layer, m.weights().n_params / 1e6, on_ranks.c_str(),
               out.load_seconds, points.empty() ? "none" : points.c_str(),
               out.heads_path.empty() ? "logit lens" : out.heads_path.c_str());
  return out;
}

StatusOr<ExitRule> exit_rule_from_args(const Args& args, const Model& model, const std::string& policy_name,
                                       const std::string& threshold_text) {
  ExitRule rule;
  HELIOS_ASSIGN_OR_RETURN(rule.policy, parse_exit_policy(policy_name));
  HELIOS_ASSIGN_OR_RETURN(rule.measure, parse_confidence_measure(args.str("measure")));
  HELIOS_ASSIGN_OR_RETURN(int64_t depth, args.integer("depth"));
  HELIOS_ASSIGN_OR_RETURN(int64_t draft, args.integer("draft-tokens"));
  HELIOS_ASSIGN_OR_RETURN(int64_t draft_vocab, args.integer("draft-vocab"));
  if (threshold_text == "calibrated") {
    rule.calibrated_thresholds = true;
  } else {
    HELIOS_ASSIGN_OR_RETURN(auto values, parse_number_list("threshold", threshold_text));
    if (values.size() != 1 || !(values[0] >= 0.0)) {
      return invalid_argument("--threshold: '" + threshold_text + "' is not a number >= 0 or 'calibrated'");
    }
    rule.threshold = static_cast<float>(values[0]);
  }
  rule.depth = static_cast<int32_t>(depth);
  rule.draft_tokens = static_cast<int32_t>(draft);
  rule.draft_vocab = static_cast<int32_t>(draft_vocab);
  HELIOS_RETURN_IF_ERROR(model.check_exit_rule(rule));
  return model.resolve_exit_rule(rule);
}

}  // namespace helios::cli
