// helios-bench-engine: prefill and decode speed of one sequence (batch 1) on the CPU backend,
// with the memory bandwidth decode achieves. Results go to stdout as a table and, with --json,
// to a JSON file that names the commit, the command, the model, the threads and the CPU, so two
// runs can be compared. bench/llama_cpp_bench.py reads that JSON (its "prompt_ids") to run the
// identical prompt through llama.cpp.
//
// Each repeat: a fresh paged KV cache → one forward pass over the whole prompt (prefill, timed)
// → M single-token forward passes, greedy (decode, each step timed). The median repeat is
// reported.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "helios/gguf.h"
#include "helios/model.h"

namespace {

using helios::TokenId;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Options

constexpr const char* kHelp = R"(helios-bench-engine: prefill and decode speed at batch 1 on the CPU backend.

usage: helios-bench-engine --model PATH [options]

options:
  --model PATH          GGUF model file (required)
  --threads N           CPU threads (default: one per core)
  --prompt-tokens N     prompt length in tokens (default 128)
  --decode-tokens N     tokens to decode one at a time after the prompt (default 64)
  --repeats N           measured repeats; the median is reported (default 3)
  --warmup N            unmeasured repeats before them (default 1)
  --prompts PATH        ShareGPT JSON the prompt text comes from
                        (default: <source>/../shared/data/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json)
  --kv-type T           KV cache elements: f16 (the default, as llama.cpp's) or f32
  --json PATH           also write the results as JSON
  --help                this text

The prompt: for a model with a real tokenizer, the first human turns of the ShareGPT file,
tokenized one after another (BOS first) and cut at N tokens. For a synthetic model (general.name
"synthetic-*", whose vocabulary is filler pieces) the prompt is BOS followed by token ids that
step through the whole vocabulary. The output says which. Decode is greedy (argmax).

metrics:
  prefill tok/s   prompt tokens / time of the one forward pass over the whole prompt.
  prefill ms      that time.
  decode tok/s    decode tokens / total time of the M single-token forward passes (the argmax
                  between steps is not timed). Each step reads every weight once, so decode at
                  batch 1 is bound by memory bandwidth.
  ms/token        1000 / decode tok/s.
  GB/s            achieved memory bandwidth of decode = bytes read per decode token / time per
                  decode token (10^9 bytes per GB). Bytes read per token =
                    weight bytes: ModelWeights::n_bytes (what the backend holds), minus the
                      token-embedding table of which one row is read, plus that row; when the
                      LM head is tied to the table (one copy) the table is read in full instead;
                  + KV bytes: 2 (K and V) x n_layer x kv_dim x 4 bytes (f32) x mean context,
                      the mean over the decode steps of the positions each step attends to
                      (prompt + (M + 1) / 2).
                  Activations, logits and caches of small buffers are not counted, so this is a
                  lower bound on the traffic.
  Every figure is the median over the repeats; the JSON also lists each repeat.
)";

struct Options {
  std::string model_path;
  int n_threads = 0;
  int n_prompt_tokens = 128;
  int n_decode_tokens = 64;
  int n_repeats = 3;
  int n_warmup = 1;
  std::string prompts_path = std::string(HELIOS_SOURCE_DIR) +
                             "/../shared/data/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json";
  std::string json_path;
  helios::kernels::KvType kv_type = helios::kernels::KvType::kF16;
};

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "helios-bench-engine: %s\n", message.c_str());
  std::exit(1);
}

int parse_positive(const std::string& name, const char* text, int min_value) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < min_value || v > 1000000) {
    die("--" + name + " needs an integer >= " + std::to_string(min_value) + " (got '" + text + "')");
  }
  return static_cast<int>(v);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kHelp, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) die("unknown option or missing value: " + arg + " (see --help)");
    const char* value = argv[++i];
    if (arg == "--model") o.model_path = value;
    else if (arg == "--threads") o.n_threads = parse_positive("threads", value, 1);
    else if (arg == "--prompt-tokens") o.n_prompt_tokens = parse_positive("prompt-tokens", value, 1);
    else if (arg == "--decode-tokens") o.n_decode_tokens = parse_positive("decode-tokens", value, 1);
    else if (arg == "--repeats") o.n_repeats = parse_positive("repeats", value, 1);
    else if (arg == "--warmup") o.n_warmup = parse_positive("warmup", value, 0);
    else if (arg == "--prompts") o.prompts_path = value;
    else if (arg == "--json") o.json_path = value;
    else if (arg == "--kv-type" && std::string(value) == "f16") o.kv_type = helios::kernels::KvType::kF16;
    else if (arg == "--kv-type" && std::string(value) == "f32") o.kv_type = helios::kernels::KvType::kF32;
    else if (arg == "--kv-type") die("--kv-type must be f16 or f32 (got '" + std::string(value) + "')");
    else die("unknown option: " + arg + " (see --help)");
  }
  if (o.model_path.empty()) die("--model PATH is required (see --help)");
  std::error_code ec;
  const auto canonical = std::filesystem::weakly_canonical(o.prompts_path, ec);
  if (!ec) o.prompts_path = canonical.string();
  if (o.n_threads == 0) o.n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return o;
}

// ---------------------------------------------------------------------------------------------
// Where and what: commit, command, CPU, date

std::string run_and_read(const std::string& command) {
  std::string out;
  if (FILE* p = ::popen(command.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./=:,+@%") == std::string::npos) {
    return s;
  }
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string command_line(int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) {
    if (i) cmd += ' ';
    cmd += shell_quote(argv[i]);
  }
  return cmd;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

// "1.81 1.60 1.62": other work on the machine skews the timings; recorded so a reader can tell.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return in ? one + " " + five + " " + fifteen : "unknown";
}

std::string utc_now_iso8601() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

json provenance(int argc, char** argv) {
  const std::string git = "git -C " + shell_quote(HELIOS_SOURCE_DIR);
  std::string commit = run_and_read(git + " rev-parse --short HEAD 2>/dev/null");
  const bool dirty = !run_and_read(git + " status --porcelain --untracked-files=no 2>/dev/null").empty();
  return {{"commit", commit.empty() ? "unknown" : commit},
          {"worktree_dirty", dirty},
          {"command", command_line(argc, argv)},
          {"date", utc_now_iso8601()},
          {"device", {{"backend", "cpu"},
                      {"cpu_model", cpu_model_name()},
                      {"n_cpus", std::thread::hardware_concurrency()},
                      {"load_average_at_start", load_average()}}}};
}

// ---------------------------------------------------------------------------------------------
// The prompt

bool is_synthetic(const helios::Model& model) { return model.config().name.rfind("synthetic", 0) == 0; }

// BOS, then ids that step through the vocabulary by a prime stride (skipping unk/bos/eos, 0-2),
// so the embedding rows come from all over the table.
std::vector<TokenId> cycling_prompt(const helios::Model& model, int n_tokens) {
  const int32_t n_vocab = model.config().n_vocab;
  std::vector<TokenId> ids;
  if (model.tokenizer().bos() >= 0) ids.push_back(model.tokenizer().bos());
  for (int64_t i = 0; static_cast<int>(ids.size()) < n_tokens; ++i) {
    ids.push_back(static_cast<TokenId>(3 + (i * 7919) % (n_vocab - 3)));
  }
  return ids;
}

// The first human turns of a ShareGPT file, tokenized in order until there are n_tokens.
helios::StatusOr<std::vector<TokenId>> sharegpt_prompt(const helios::Model& model,
                                                       const std::string& path, int n_tokens) {
  std::ifstream in(path);
  if (!in) return helios::not_found("cannot open the prompts file " + path + " (use --prompts)");
  json data;
  try {
    data = json::parse(in);
  } catch (const std::exception& e) {
    return helios::invalid_argument(path + ": " + e.what());
  }
  std::vector<TokenId> ids;
  for (const auto& entry : data) {
    if (static_cast<int>(ids.size()) >= n_tokens) break;
    if (!entry.contains("conversations")) continue;
    for (const auto& turn : entry["conversations"]) {
      if (turn.value("from", "") != "human") continue;
      std::string text = ids.empty() ? "" : "\n\n";
      text += turn.value("value", std::string());
      const auto piece = model.tokenizer().encode(text, /*add_special=*/ids.empty(), false);
      ids.insert(ids.end(), piece.begin(), piece.end());
      break;
    }
  }
  if (static_cast<int>(ids.size()) < n_tokens) {
    return helios::invalid_argument(path + " holds only " + std::to_string(ids.size()) +
                                    " tokens of first human turns; use fewer --prompt-tokens");
  }
  ids.resize(n_tokens);
  return ids;
}

// ---------------------------------------------------------------------------------------------
// One repeat: prefill, then greedy decode

struct RepeatTiming {
  double prefill_s = 0;
  double decode_s = 0;            // sum of the decode steps
  std::vector<double> step_ms;    // [n_decode_tokens]
  std::vector<TokenId> decoded;   // [n_decode_tokens + 1]: the first from the prefill logits
};

TokenId argmax(const float* logits, int32_t n) {
  return static_cast<TokenId>(std::max_element(logits, logits + n) - logits);
}

helios::StatusOr<RepeatTiming> run_repeat(helios::Model& model, const std::vector<TokenId>& prompt,
                                          int n_decode_tokens, helios::kernels::KvType kv_type) {
  constexpr int32_t kBlockSize = 16;
  const int32_t n_total = static_cast<int32_t>(prompt.size()) + n_decode_tokens;
  const int32_t n_blocks = helios::blocks_for_tokens(n_total, kBlockSize);
  HELIOS_ASSIGN_OR_RETURN(auto kv, helios::KvCacheStorage::create(model.backend(), model.config(),
                                                                  n_blocks, kBlockSize, kv_type));
  helios::BlockAllocator allocator(n_blocks);
  helios::BlockTable table;
  if (!helios::reserve_tokens(allocator, table, n_total, kBlockSize)) {
    return helios::internal_error("KV blocks sized for the sequence ran out");
  }
  RepeatTiming r;
  helios::ForwardBatch batch;
  batch.seqs.push_back({prompt, 0, &table, helios::LogitsWanted::kLast});
  auto t0 = Clock::now();
  HELIOS_ASSIGN_OR_RETURN(helios::ForwardResult fr, model.forward(batch, kv));
  r.prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.decoded.push_back(argmax(fr.row(0), fr.n_vocab));

  for (int i = 0; i < n_decode_tokens; ++i) {
    const int32_t pos = static_cast<int32_t>(prompt.size()) + i;
    batch.seqs[0] = {{r.decoded.back()}, pos, &table, helios::LogitsWanted::kLast};
    t0 = Clock::now();
    HELIOS_ASSIGN_OR_RETURN(fr, model.forward(batch, kv));
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    r.decode_s += step_s;
    r.step_ms.push_back(step_s * 1e3);
    r.decoded.push_back(argmax(fr.row(0), fr.n_vocab));
  }
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---------------------------------------------------------------------------------------------
// The model's description and the bytes decode reads

struct DecodeBytes {
  int64_t weights = 0;  // per token
  int64_t kv = 0;       // per token, at the mean context
  double mean_context_tokens = 0;
};

DecodeBytes decode_bytes(const helios::Model& model, int n_prompt_tokens, int n_decode_tokens,
                         helios::kernels::KvType kv_type) {
  const helios::ModelConfig& c = model.config();
  const helios::ModelWeights& w = model.weights();
  DecodeBytes b;
  // A token reads one row of the embedding table, unless the table is also the LM head.
  const bool shared = w.output.view.data == w.tok_embd.view.data;
  const int64_t table = shared ? 0 : static_cast<int64_t>(w.tok_embd.storage.size() * sizeof(float));
  const int64_t row_bytes = shared ? 0 : helios::tensor_row_bytes(w.tok_embd.view.type, c.n_embd);
  b.weights = w.n_bytes - table + row_bytes;
  b.mean_context_tokens = n_prompt_tokens + (n_decode_tokens + 1) / 2.0;
  b.kv = static_cast<int64_t>(2.0 * c.n_layer * c.kv_dim() * helios::kernels::kv_type_bytes(kv_type) *
                              b.mean_context_tokens);
  return b;
}

json model_description(const helios::Model& model, const std::string& path) {
  const helios::ModelConfig& c = model.config();
  std::map<std::string, int> file_types, backend_types;
  if (auto file = helios::GgufFile::open(path); file.ok()) {
    for (const auto& t : (*file)->tensors()) ++file_types[helios::tensor_type_name(t.type)];
  }
  const helios::ModelWeights& w = model.weights();
  auto count = [&](const helios::Matrix& m) { ++backend_types[helios::tensor_type_name(m.view.type)]; };
  count(w.output);
  for (const auto& l : w.layers) {
    for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) count(*m);
  }
  struct stat st {};
  const int64_t file_bytes = ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
  return {{"path", path}, {"file_bytes", file_bytes}, {"name", c.name},
          {"architecture", c.architecture}, {"n_layer", c.n_layer}, {"n_embd", c.n_embd},
          {"n_head", c.n_head}, {"n_head_kv", c.n_head_kv}, {"n_ff", c.n_ff},
          {"n_vocab", c.n_vocab}, {"tied_output", c.tied_output}, {"n_params", w.n_params},
          {"weight_bytes_in_backend", w.n_bytes}, {"file_tensor_types", file_types},
          {"backend_matrix_types", backend_types}};
}

std::string types_text(const json& types) {
  std::string s;
  for (const auto& [name, n] : types.items()) {
    if (!s.empty()) s += ' ';
    s += name + "x" + n.dump();
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

int main(int argc, char** argv) {
  const Options opt = parse_options(argc, argv);
  json out = provenance(argc, argv);

  // Load.
  auto backend = helios::make_cpu_backend(opt.n_threads);
  helios::ModelLoadOptions load;
  // A live percentage on a terminal; one line in a log file.
  const bool tty = ::isatty(STDERR_FILENO);
  int last_percent = -1;
  load.progress = [&](int done, int total) {
    const int percent = 100 * done / total;
    if (tty && percent != last_percent) std::fprintf(stderr, "\rloading %s: %3d%%", opt.model_path.c_str(), percent);
    last_percent = percent;
  };
  std::fprintf(stderr, tty ? "loading %s" : "loading %s\n", opt.model_path.c_str());
  const auto t_load = Clock::now();
  auto loaded = helios::Model::load(opt.model_path, *backend, load);
  if (tty) std::fputc('\n', stderr);
  if (!loaded.ok()) die("loading " + opt.model_path + ": " + loaded.status().to_string());
  helios::Model& model = **loaded;
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  const json model_json = model_description(model, opt.model_path);
  std::fprintf(stderr, "loaded %s in %.1f s: %d layers x %d, %.1fM parameters, %.1f MB in backend memory\n",
               opt.model_path.c_str(), load_s, model.config().n_layer, model.config().n_embd,
               model.weights().n_params / 1e6, model.weights().n_bytes / 1e6);
  if (opt.n_prompt_tokens + opt.n_decode_tokens > model.config().n_ctx_train) {
    die("prompt + decode tokens exceed the model's context of " + std::to_string(model.config().n_ctx_train));
  }

  // Prompt.
  std::vector<TokenId> prompt;
  std::string prompt_source;
  if (is_synthetic(model)) {
    prompt = cycling_prompt(model, opt.n_prompt_tokens);
    prompt_source = "synthetic vocabulary: BOS + ids cycling through the vocabulary (stride 7919)";
  } else {
    auto ids = sharegpt_prompt(model, opt.prompts_path, opt.n_prompt_tokens);
    if (!ids.ok()) die(ids.status().to_string());
    prompt = std::move(*ids);
    prompt_source = "ShareGPT text: first human turns of " + opt.prompts_path;
  }
  std::fprintf(stderr, "prompt: %d tokens (%s)\n", opt.n_prompt_tokens, prompt_source.c_str());

  // Repeats.
  std::vector<RepeatTiming> runs;
  for (int i = 0; i < opt.n_warmup + opt.n_repeats; ++i) {
    const bool warmup = i < opt.n_warmup;
    std::fprintf(stderr, "%s %d/%d: ", warmup ? "warmup" : "repeat",
                 warmup ? i + 1 : i - opt.n_warmup + 1, warmup ? opt.n_warmup : opt.n_repeats);
    auto r = run_repeat(model, prompt, opt.n_decode_tokens, opt.kv_type);
    if (!r.ok()) die("forward pass failed: " + r.status().to_string());
    std::fprintf(stderr, "prefill %.1f tok/s, decode %.2f tok/s\n", opt.n_prompt_tokens / r->prefill_s,
                 opt.n_decode_tokens / r->decode_s);
    if (!warmup) runs.push_back(std::move(*r));
  }

  // Summary.
  std::vector<double> prefill_s, decode_s;
  json repeats = json::array();
  for (const auto& r : runs) {
    prefill_s.push_back(r.prefill_s);
    decode_s.push_back(r.decode_s);
    repeats.push_back({{"prefill_s", r.prefill_s}, {"decode_s", r.decode_s},
                       {"prefill_tok_s", opt.n_prompt_tokens / r.prefill_s},
                       {"decode_tok_s", opt.n_decode_tokens / r.decode_s},
                       {"decode_step_ms_median", median(r.step_ms)}, {"decode_step_ms", r.step_ms}});
  }
  const double prefill_med_s = median(prefill_s);
  const double decode_med_s = median(decode_s);
  const double s_per_token = decode_med_s / opt.n_decode_tokens;
  const DecodeBytes bytes = decode_bytes(model, opt.n_prompt_tokens, opt.n_decode_tokens, opt.kv_type);
  const double gb_s = (bytes.weights + bytes.kv) / s_per_token / 1e9;
  const json results = {
      {"prefill_tok_s", opt.n_prompt_tokens / prefill_med_s},
      {"prefill_ms", prefill_med_s * 1e3},
      {"decode_tok_s", opt.n_decode_tokens / decode_med_s},
      {"decode_ms_per_token", s_per_token * 1e3},
      {"decode_gb_s", gb_s},
      {"bytes_per_decode_token", {{"weights", bytes.weights}, {"kv", bytes.kv},
                                  {"total", bytes.weights + bytes.kv},
                                  {"mean_context_tokens", bytes.mean_context_tokens}}},
      {"load_s", load_s},
      {"repeats", repeats}};

  out["device"]["load_average_at_end"] = load_average();
  out["engine"] = "helios";
  out["model"] = model_json;
  out["config"] = {{"threads", opt.n_threads}, {"batch", 1},
                   {"prompt_tokens", opt.n_prompt_tokens}, {"decode_tokens", opt.n_decode_tokens},
                   {"repeats", opt.n_repeats}, {"warmup", opt.n_warmup}, {"kv_type", opt.kv_type == helios::kernels::KvType::kF16 ? "F16" : "F32"},
                   {"kv_block_size", 16}, {"sampling", "greedy"}, {"prompt_source", prompt_source}};
  out["results"] = results;
  out["prompt_ids"] = prompt;
  out["decoded_ids"] = runs.front().decoded;

  std::printf("helios | %s | %s | %d threads | %s\n", model.config().name.c_str(),
              types_text(model_json["file_tensor_types"]).c_str(), opt.n_threads,
              out["device"]["cpu_model"].get<std::string>().c_str());
  std::printf("%-9s %12s %12s %12s %12s %10s %14s\n", "engine", "prefill t/s", "prefill ms",
              "decode t/s", "ms/token", "GB/s", "MB read/token");
  std::printf("%-9s %12.1f %12.1f %12.2f %12.2f %10.2f %14.1f\n", opt.kv_type == helios::kernels::KvType::kF16 ? "helios F16" : "helios F32",
              results["prefill_tok_s"].get<double>(), prefill_med_s * 1e3,
              results["decode_tok_s"].get<double>(), s_per_token * 1e3, gb_s,
              (bytes.weights + bytes.kv) / 1e6);
  std::printf("(prompt %d tokens, decode %d tokens, median of %d repeats)\n", opt.n_prompt_tokens,
              opt.n_decode_tokens, opt.n_repeats);

  if (!opt.json_path.empty()) {
    std::ofstream f(opt.json_path);
    f << out.dump(2) << "\n";
    if (!f) die("cannot write " + opt.json_path);
    std::fprintf(stderr, "wrote %s\n", opt.json_path.c_str());
  }
  return 0;
}
