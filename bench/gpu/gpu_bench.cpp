// helios-bench-gpu: the CUDA backend's speed. Three measurements, each printed as a table and,
// with --json, written as JSON with the command, the device and the commit:
//   decode     tok/s of greedy decoding at batch sizes B (B sequences, one token each per forward
//              pass), op by op, replayed as step graphs of plain launches, and of chained ones (the
//              default) side by side, and at B = 1 the share of the HBM roofline (bandwidth / bytes
//              per token);
//   attention  the paged-attention decode kernel alone: time and GB/s of K/V read per call;
//   gemv       the decode matmul kernels alone (F16, BF16, each quantized type) on one layer's
//              shapes: time, GB/s and share of the HBM roofline per weight type and row count;
//   compare    one model on the GPU and on the CPU: decode tok/s of each and whether their greedy
//              tokens agree.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "helios/model.h"
#include "helios/tensor_type.h"
#include "kernels/kernels.h"

namespace {

using helios::TokenId;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kHelp = R"(helios-bench-gpu: speed of the CUDA backend.

usage:
  helios-bench-gpu decode --model PATH [--backend cuda|cpu] [--batch 1,4,16] [--prompt-tokens 128]
                          [--decode-tokens 64] [--bandwidth-gbs 4800] [--json PATH]
  helios-bench-gpu attention [--batch 1,8,32] [--context 512,4096,16384] [--heads 32] [--kv-heads 8]
                             [--head-dim 128] [--kv-type f32|f16] [--iters 50] [--json PATH]
  helios-bench-gpu compare --model PATH [--prompt-tokens 128] [--decode-tokens 64] [--threads N] [--json PATH]
  helios-bench-gpu gemv [--types f16,bf16,q8_0,q4_0,q4_k,q5_k,q6_k] [--shapes 4096x4096,11008x4096,4096x11008]
                        [--batch 1,2,4,8] [--iters 50] [--bandwidth-gbs 4800] [--json PATH]

decode: for each batch size B, B sequences get a prompt of --prompt-tokens ids (one prefill pass,
  timed), then --decode-tokens greedy steps of B tokens (each step one forward pass, timed; the host
  argmax between steps is not). tok/s = B x steps / decode time. Each B runs three times: op by op
  (graphs off); with decode steps replayed as CUDA graphs of plain launches; and of chained launches
  (each kernel may be scheduled while the one before it finishes, on devices of compute capability
  9.0 on), the default. graphs x is the default over op by op, chained x the default over plain
  launches; the JSON counts the steps replayed, captured and run op by op. At B = 1:
    weight bytes per token = ModelWeights::n_bytes - the f32 embedding table + one row of it;
    ideal tok/s = bandwidth / weight bytes (KV reads are left out of the ideal, so the share is
    a slight underestimate); roofline share = tok/s / ideal tok/s.
attention: launch_paged_attention on an f32 or f16 paged cache (blocks of 16, shuffled block ids), B
  decoding tokens each at the given context; time per call from CUDA events over --iters calls;
  GB/s = (K + V bytes read + q + out) / time. Where the shape allows, twice: the cache read 16
  bytes at a time (reads wide, the default) and an element at a time (reads general).
gemv: y[B, OUT] = x[B, IN] · W[OUT, IN]ᵀ through launch_matmul_f16/_bf16/_quant, W of random bytes
  in the type's layout (the kernels' speed does not depend on the values); quantized types run
  three ways: against f32 activations (path f32), rounding them to 8 bits in the call (q8: the
  backend's path up to cuda_gemv_max_rows rows), and dequantized to f16 for cublasGemmEx (deq: its
  path past them); for each type, OUTxIN
  shape (default: a Llama-2-7B layer's) and row count B; time per call from CUDA events over --iters
  calls after 3 warm-ups; GB/s = (weight bytes + x and y bytes) / time; roofline = GB/s / bandwidth.
  The weights of all shapes of a type are more than the L2 holds, and each call reads another
  copy in turn, so the weights come from HBM, not the cache.
compare: the model on the CUDA backend and on the CPU backend (--threads, default all cores), the
  same prompt, greedy: decode tok/s of each, and the number of leading greedy tokens that agree.
)";

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "helios-bench-gpu: %s\n", m.c_str());
  std::exit(2);
}

struct Args {
  std::string mode, model, backend = "cuda", json_path, kv_type = "f32";
  std::vector<int> batch, context = {512, 4096, 16384};
  std::vector<std::string> types = {"f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"};
  std::vector<std::pair<int, int>> shapes = {{4096, 4096}, {11008, 4096}, {4096, 11008}};  // OUT x IN
  int prompt_tokens = 128, decode_tokens = 64, heads = 32, kv_heads = 8, head_dim = 128, iters = 50, threads = 0;
  double bandwidth_gbs = 4800;
};

// The comma-separated items of s; an empty one is an error saying the list should hold `what`.
std::vector<std::string> parse_words(const std::string& s, const char* what = "names") {
  std::vector<std::string> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    v.push_back(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (v.back().empty()) die("bad list '" + s + "': expected " + what + " separated by commas");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

std::vector<int> parse_list(const std::string& s) {
  constexpr const char* kWhat = "positive integers";
  std::vector<int> v;
  for (const std::string& item : parse_words(s, kWhat)) {
    const int x = std::atoi(item.c_str());
    if (x <= 0) die("bad list '" + s + "': expected " + kWhat + " separated by commas");
    v.push_back(x);
  }
  return v;
}

// "4096x4096,11008x4096": OUT x IN pairs.
std::vector<std::pair<int, int>> parse_shapes(const std::string& s) {
  std::vector<std::pair<int, int>> v;
  for (const std::string& w : parse_words(s)) {
    const size_t x = w.find('x');
    const int out = x == std::string::npos ? 0 : std::atoi(w.substr(0, x).c_str());
    const int in = x == std::string::npos ? 0 : std::atoi(w.substr(x + 1).c_str());
    if (out <= 0 || in <= 0) die("bad shape '" + w + "' in --shapes: expected OUTxIN, e.g. 11008x4096");
    v.emplace_back(out, in);
  }
  return v;
}

Args parse(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fputs(kHelp, stdout);
    std::exit(0);
  }
  Args a;
  a.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help") { std::fputs(kHelp, stdout); std::exit(0); }
    if (i + 1 >= argc) die(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--model") a.model = v;
    else if (k == "--backend") a.backend = v;
    else if (k == "--json") a.json_path = v;
    else if (k == "--batch") a.batch = parse_list(v);
    else if (k == "--context") a.context = parse_list(v);
    else if (k == "--prompt-tokens") a.prompt_tokens = std::atoi(v.c_str());
    else if (k == "--decode-tokens") a.decode_tokens = std::atoi(v.c_str());
    else if (k == "--heads") a.heads = std::atoi(v.c_str());
    else if (k == "--kv-heads") a.kv_heads = std::atoi(v.c_str());
    else if (k == "--head-dim") a.head_dim = std::atoi(v.c_str());
    else if (k == "--iters") a.iters = std::atoi(v.c_str());
    else if (k == "--kv-type") a.kv_type = v;
    else if (k == "--threads") a.threads = std::atoi(v.c_str());
    else if (k == "--bandwidth-gbs") a.bandwidth_gbs = std::atof(v.c_str());
    else if (k == "--types") a.types = parse_words(v);
    else if (k == "--shapes") a.shapes = parse_shapes(v);
    else die("unknown option " + k + " (see --help)");
  }
  if (a.batch.empty()) {
    a.batch = a.mode == "attention" ? std::vector<int>{1, 8, 32}
              : a.mode == "gemv"    ? std::vector<int>{1, 2, 4, 8, 16, 32, 64}
                                    : std::vector<int>{1};
  }
  return a;
}

std::string run_and_read(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

json provenance(int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) {
    if (i) cmd += ' ';
    cmd += argv[i];
  }
  cudaDeviceProp prop{};
  const bool gpu = cudaGetDeviceProperties(&prop, 0) == cudaSuccess;
  return {{"command", cmd},
          {"commit", run_and_read("git -C " HELIOS_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null")},
          {"device", gpu ? prop.name : "none"},
          {"device_memory_bytes", gpu ? prop.totalGlobalMem : 0},
          {"sm_count", gpu ? prop.multiProcessorCount : 0}};
}

void write_json(const Args& a, const json& j) {
  if (a.json_path.empty()) return;
  std::ofstream(a.json_path) << j.dump(2) << "\n";
  std::fprintf(stderr, "wrote %s\n", a.json_path.c_str());
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---------------------------------------------------------------------------------------------
// decode and compare

struct DecodeRun {
  int batch = 0;
  double prefill_s = 0, decode_s = 0;
  int steps = 0;
  std::vector<TokenId> tokens;  // sequence 0's greedy tokens
};

std::vector<TokenId> prompt_ids(const helios::Model& m, int n) {
  // Ids stepping through the vocabulary (after BOS): the same work as text, for any model.
  std::vector<TokenId> ids = {m.tokenizer().bos()};
  for (int i = 1; i < n; ++i) ids.push_back(static_cast<TokenId>(3 + (i * 7919) % (m.config().n_vocab - 3)));
  return ids;
}

helios::StatusOr<DecodeRun> run_decode(helios::Model& m, int batch, int n_prompt, int n_decode) {
  const int32_t bs = 16;
  const int32_t per_seq = helios::blocks_for_tokens(n_prompt + n_decode + 1, bs);
  HELIOS_ASSIGN_OR_RETURN(auto kv, helios::KvCacheStorage::create(m.backend(), m.config(), per_seq * batch, bs));
  helios::BlockAllocator alloc(per_seq * batch);
  std::vector<helios::BlockTable> tables(batch);
  for (auto& t : tables) reserve_tokens(alloc, t, per_seq * bs, bs);
  const auto prompt = prompt_ids(m, n_prompt);
  DecodeRun r;
  r.batch = batch;
  helios::ForwardBatch fb;
  for (int b = 0; b < batch; ++b) {
    helios::SequenceBatchEntry e;  // the prompt from position 0, logits of its last token
    e.tokens = prompt;
    e.blocks = &tables[b];
    fb.seqs.push_back(std::move(e));
  }
  auto t0 = Clock::now();
  HELIOS_ASSIGN_OR_RETURN(auto out, m.forward(fb, kv));
  r.prefill_s = seconds_since(t0);
  const int32_t n_vocab = m.config().n_vocab;
  for (int step = 0; step < n_decode; ++step) {
    for (int b = 0; b < batch; ++b) {
      const float* row = out.row(b);
      const TokenId next = static_cast<TokenId>(std::max_element(row, row + n_vocab) - row);
      if (b == 0) r.tokens.push_back(next);
      fb.seqs[b].tokens = {next};
      fb.seqs[b].start_pos = n_prompt + step;
    }
    t0 = Clock::now();
    HELIOS_ASSIGN_OR_RETURN(out, m.forward(fb, kv));
    r.decode_s += seconds_since(t0);
    ++r.steps;
  }
  return r;
}

// Bytes one batch-1 decode step reads from weights: the whole backend copy except the f32
// embedding table, of which one row.
double weight_bytes_per_token(const helios::Model& m) {
  const auto& c = m.config();
  const double table = static_cast<double>(c.n_vocab) * c.n_embd * sizeof(float);
  return static_cast<double>(m.weights().n_bytes) - table + c.n_embd * sizeof(float);
}

helios::StatusOr<std::unique_ptr<helios::Model>> load(const std::string& path, helios::Backend& be) {
  const auto t0 = Clock::now();
  auto m = helios::Model::load(path, be);
  if (m.ok()) std::fprintf(stderr, "loaded %s on %s in %.1f s\n", path.c_str(), be.name().c_str(), seconds_since(t0));
  return m;
}

int cmd_decode(const Args& a, json& j) {
  if (a.model.empty()) die("decode needs --model PATH");
  auto be = helios::make_backend(a.backend, a.threads);
  if (!be.ok()) die(be.status().to_string());
  auto m = load(a.model, **be);
  if (!m.ok()) die(m.status().to_string());
  const double wbytes = weight_bytes_per_token(**m);
  j["model"] = {{"path", a.model}, {"n_layer", (*m)->config().n_layer}, {"n_embd", (*m)->config().n_embd},
                {"n_vocab", (*m)->config().n_vocab}, {"weight_bytes_per_token", wbytes},
                {"weights_backend_bytes", (*m)->weights().n_bytes}};
  j["backend"] = (*be)->name();
  j["free_device_bytes_after_load"] = (*be)->free_device_bytes();
  // Each batch size op by op, as step graphs of plain launches, and of chained ones (the default).
  struct Mode {
    bool graphs, chained;
  };
  constexpr Mode kModes[] = {{false, true}, {true, false}, {true, true}};
  std::printf("%-6s %14s %14s %14s %14s %8s %9s %10s %15s\n", "batch", "prefill tok/s", "op-by-op tok/s",
              "plain tok/s", "decode tok/s", "graphs x", "chained x", "ms/step", "roofline share");
  for (int batch : a.batch) {
    std::vector<DecodeRun> runs;
    helios::GraphCounters counters;
    for (const Mode& mode : kModes) {
      (*be)->set_graphs(mode.graphs);
      helios::kernels::set_chained_launches(mode.chained);
      auto warm = run_decode(**m, batch, std::min(a.prompt_tokens, 16), 2);  // allocations, cuBLAS plans
      if (!warm.ok()) die(warm.status().to_string());
      const helios::GraphCounters before = (*be)->graph_counters();
      auto run = run_decode(**m, batch, a.prompt_tokens, a.decode_tokens);
      if (!run.ok()) die("batch " + std::to_string(batch) + ": " + run.status().to_string());
      runs.push_back(std::move(*run));
      const helios::GraphCounters after = (*be)->graph_counters();
      counters = {after.run - before.run, after.captured - before.captured, after.replayed - before.replayed};
    }
    const DecodeRun &eager = runs[0], &plain = runs[1], &r = runs[2];
    const double tok_s = batch * r.steps / r.decode_s, eager_tok_s = batch * eager.steps / eager.decode_s,
                 plain_tok_s = batch * plain.steps / plain.decode_s;
    const bool same_tokens = r.tokens == eager.tokens && plain.tokens == eager.tokens;
    json row = {{"batch", batch}, {"prompt_tokens", a.prompt_tokens}, {"decode_steps", r.steps},
                {"prefill_tok_s", batch * a.prompt_tokens / r.prefill_s}, {"decode_tok_s", tok_s},
                {"ms_per_step", 1000 * r.decode_s / r.steps}, {"op_by_op_decode_tok_s", eager_tok_s},
                {"plain_launches_decode_tok_s", plain_tok_s}, {"graphs_speedup", tok_s / eager_tok_s},
                {"chained_speedup", tok_s / plain_tok_s}, {"same_tokens_in_every_mode", same_tokens},
                {"steps_replayed", counters.replayed}, {"steps_captured", counters.captured},
                {"steps_run_op_by_op", counters.run}};
    std::string share = "-";
    if (batch == 1) {
      const double ideal = a.bandwidth_gbs * 1e9 / wbytes;
      row["bandwidth_gbs"] = a.bandwidth_gbs;
      row["ideal_tok_s"] = ideal;
      row["roofline_share"] = tok_s / ideal;
      row["achieved_weight_gbs"] = tok_s * wbytes / 1e9;
      share = std::to_string(100 * tok_s / ideal).substr(0, 5) + " %";
    }
    std::printf("%-6d %14.1f %14.1f %14.1f %14.1f %8.2f %9.2f %10.3f %15s\n", batch,
                batch * a.prompt_tokens / r.prefill_s, eager_tok_s, plain_tok_s, tok_s, tok_s / eager_tok_s,
                tok_s / plain_tok_s, 1000 * r.decode_s / r.steps, share.c_str());
    if (!same_tokens) std::printf("  batch %d: the three ways gave different tokens\n", batch);
    j["runs"].push_back(row);
  }
  return 0;
}

int cmd_compare(const Args& a, json& j) {
  if (a.model.empty()) die("compare needs --model PATH");
  json rows = json::array();
  std::vector<TokenId> tokens[2];
  const char* names[2] = {"cuda", "cpu"};
  for (int i = 0; i < 2; ++i) {
    auto be = helios::make_backend(names[i], a.threads);
    if (!be.ok()) die(be.status().to_string());
    auto m = load(a.model, **be);
    if (!m.ok()) die(m.status().to_string());
    if (i == 0 && !run_decode(**m, 1, 16, 2).ok()) die("warmup failed");
    auto r = run_decode(**m, 1, a.prompt_tokens, a.decode_tokens);
    if (!r.ok()) die(std::string(names[i]) + ": " + r.status().to_string());
    tokens[i] = r->tokens;
    rows.push_back({{"backend", (*be)->name()}, {"prefill_tok_s", a.prompt_tokens / r->prefill_s},
                    {"decode_tok_s", r->steps / r->decode_s}});
    std::printf("%-8s prefill %10.1f tok/s   decode %8.1f tok/s\n", (*be)->name().c_str(),
                a.prompt_tokens / r->prefill_s, r->steps / r->decode_s);
  }
  size_t agree = 0;
  while (agree < tokens[0].size() && agree < tokens[1].size() && tokens[0][agree] == tokens[1][agree]) ++agree;
  std::printf("greedy tokens agreeing from the start: %zu of %zu\n", agree, tokens[0].size());
  j["model"] = a.model;
  j["runs"] = rows;
  j["greedy_tokens_agree"] = agree;
  j["greedy_tokens"] = tokens[0].size();
  j["speedup_decode"] = rows[0]["decode_tok_s"].get<double>() / rows[1]["decode_tok_s"].get<double>();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// attention

#define BENCH_CUDA(call)                                                                        \
  do {                                                                                          \
    const cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) die(std::string(#call) + ": " + cudaGetErrorString(e_));             \
  } while (0)

// Microseconds per call(): CUDA events around `iters` calls on the default stream, after 3 warm-ups.
template <typename Call>
double us_per_call(int iters, Call call) {
  for (int i = 0; i < 3; ++i) call();
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  BENCH_CUDA(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) call();
  BENCH_CUDA(cudaEventRecord(e1));
  BENCH_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 1000.0 * ms / iters;
}

int cmd_attention(const Args& a, json& j) {
  const int32_t bs = 16, hd = a.head_dim;
  if (a.kv_type != "f32" && a.kv_type != "f16") die("--kv-type must be f32 or f16, got '" + a.kv_type + "'");
  const bool f16 = a.kv_type == "f16";
  const size_t elem = f16 ? 2 : 4;  // bytes per cache element
  const auto kv = f16 ? helios::kernels::KvType::kF16 : helios::kernels::KvType::kF32;
  // The cache read 16 bytes at a time where the shape allows it (the default), and an element at a
  // time, side by side.
  std::vector<std::string> paths;
  if (helios::kernels::paged_attention_reads_wide(kv, a.heads, a.kv_heads, hd, 1)) paths.push_back("wide");
  paths.push_back("general");
  std::printf("%-6s %8s %6s %8s %10s %10s\n", "batch", "context", "heads", "reads", "us/call", "GB/s");
  for (int batch : a.batch) {
    for (int ctx : a.context) {
      const int32_t per_seq = (ctx + bs - 1) / bs, n_blocks = per_seq * batch;
      const int64_t kv_row = static_cast<int64_t>(a.kv_heads) * hd;
      const size_t cache_elems = static_cast<size_t>(n_blocks) * bs * kv_row;
      std::vector<int32_t> ids(n_blocks), tables(n_blocks), seq(batch), pos(batch, ctx - 1);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
      for (int b = 0; b < batch; ++b) {
        seq[b] = b;
        for (int32_t k = 0; k < per_seq; ++k) tables[b * per_seq + k] = ids[b * per_seq + k];
      }
      float *k, *v, *q, *out, *ws = nullptr;
      int32_t *d_tables, *d_seq, *d_pos;
      BENCH_CUDA(cudaMalloc(&k, cache_elems * elem));
      BENCH_CUDA(cudaMalloc(&v, cache_elems * elem));
      const size_t q_floats = static_cast<size_t>(batch) * a.heads * hd;
      BENCH_CUDA(cudaMalloc(&q, q_floats * 4));
      BENCH_CUDA(cudaMalloc(&out, q_floats * 4));
      BENCH_CUDA(cudaMemset(k, 0, cache_elems * elem));
      BENCH_CUDA(cudaMemset(v, 0, cache_elems * elem));
      BENCH_CUDA(cudaMemset(q, 0, q_floats * 4));
      BENCH_CUDA(cudaMalloc(&d_tables, tables.size() * 4));
      BENCH_CUDA(cudaMalloc(&d_seq, seq.size() * 4));
      BENCH_CUDA(cudaMalloc(&d_pos, pos.size() * 4));
      BENCH_CUDA(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
      BENCH_CUDA(cudaMemcpy(d_seq, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
      BENCH_CUDA(cudaMemcpy(d_pos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
      helios::kernels::AttentionTiles tiles;  // one decoding token per tile
      tiles.span = {ctx, static_cast<int64_t>(batch) * ctx};
      const int64_t ws_floats = helios::kernels::paged_attention_workspace_floats(batch, a.heads, a.kv_heads, hd, tiles.span);
      if (ws_floats > 0) BENCH_CUDA(cudaMalloc(&ws, ws_floats * 4));
      const helios::kernels::PagedKV cache{k, v, n_blocks, bs, a.kv_heads, hd, kv};
      const helios::kernels::AttentionPlan plan{batch, d_seq, d_pos, d_tables, per_seq};
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      for (const std::string& path : paths) {
        tiles.general_loads = path == "general";
        auto call = [&] {
          const int e = helios::kernels::launch_paged_attention(q, cache, plan, a.heads, scale, tiles, ws, out, nullptr);
          if (e != 0) die(std::string("launch_paged_attention: ") + cudaGetErrorString(static_cast<cudaError_t>(e)));
        };
        const double us = us_per_call(a.iters, call);
        const double bytes = 2.0 * batch * ctx * kv_row * static_cast<double>(elem) + 2.0 * q_floats * 4;
        std::printf("%-6d %8d %6d %8s %10.1f %10.1f\n", batch, ctx, a.heads, path.c_str(), us,
                    bytes / (us * 1e-6) / 1e9);
        j["runs"].push_back({{"batch", batch}, {"context", ctx}, {"heads", a.heads}, {"kv_heads", a.kv_heads},
                             {"head_dim", hd}, {"dtype", f16 ? "float16" : "float32"}, {"reads", path},
                             {"us_per_call", us}, {"bytes", bytes}, {"gb_s", bytes / (us * 1e-6) / 1e9}});
      }
      for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q), static_cast<void*>(out),
                      static_cast<void*>(ws), static_cast<void*>(d_tables), static_cast<void*>(d_seq),
                      static_cast<void*>(d_pos)}) {
        cudaFree(p);
      }
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// gemv

int cmd_gemv(const Args& a, json& j) {
  using helios::TensorType;
  // Quantized weights run three ways: against f32 activations (launch_matmul_quant); against
  // activations rounded to 8 bits in the same call (launch_matmul_quant_q8, the backend's path up
  // to cuda_gemv_max_rows); and as the backend's path past it, the blocks dequantized to f16 and
  // the activations rounded to f16 for cublasGemmEx ("deq"). GB/s counts the blocks' bytes for all.
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) die("cublasCreate failed");
  std::printf("%-6s %12s %5s %4s %10s %10s %9s\n", "type", "shape", "rows", "path", "us/call", "GB/s", "roofline");
  for (const std::string& name : a.types) {
    const auto type = helios::tensor_type_from_name(name);
    const bool f16 = type == TensorType::kF16, bf16 = type == TensorType::kBF16;
    const bool quant = type && !f16 && !bf16 && type != TensorType::kF32;
    if (!f16 && !bf16 && !quant) die("--types: '" + name + "' is not f16, bf16 or a quantized type");
    for (const auto& [n_out, n_in] : a.shapes) {
      const int64_t row_bytes = helios::tensor_row_bytes(*type, n_in);
      if (row_bytes <= 0) die("--shapes: " + std::to_string(n_in) + " columns are not whole blocks of " + name);
      const size_t w_bytes = static_cast<size_t>(row_bytes) * n_out;
      // Enough copies of the weights that each call's come from HBM: at least 256 MiB in all.
      const int copies = static_cast<int>(std::max<size_t>(2, ((size_t{256} << 20) + w_bytes - 1) / w_bytes));
      std::vector<uint8_t> host(w_bytes);
      std::mt19937 rng(n_out * 31 + n_in);
      for (auto& b : host) b = static_cast<uint8_t>(rng());
      if (f16 || bf16) {  // finite values: the top exponent bit (bit 6 of the high byte) cleared
        for (size_t i = 1; i < host.size(); i += 2) host[i] &= 0xBF;
      }
      std::vector<uint8_t*> w(copies);
      for (auto& p : w) {
        BENCH_CUDA(cudaMalloc(&p, w_bytes));
        BENCH_CUDA(cudaMemcpy(p, host.data(), w_bytes, cudaMemcpyHostToDevice));
      }
      const int max_rows = *std::max_element(a.batch.begin(), a.batch.end());
      float *x, *y;
      BENCH_CUDA(cudaMalloc(&x, static_cast<size_t>(max_rows) * n_in * 4));
      BENCH_CUDA(cudaMalloc(&y, static_cast<size_t>(max_rows) * n_out * 4));
      BENCH_CUDA(cudaMemset(x, 0, static_cast<size_t>(max_rows) * n_in * 4));
      const size_t q8_bytes = helios::kernels::matmul_quant_q8_workspace_bytes(max_rows, n_in);
      void* q8 = nullptr;
      uint16_t *xh = nullptr, *wh = nullptr;
      if (quant) {
        BENCH_CUDA(cudaMalloc(&q8, q8_bytes));
        BENCH_CUDA(cudaMalloc(&xh, static_cast<size_t>(max_rows) * n_in * 2));
        BENCH_CUDA(cudaMalloc(&wh, static_cast<size_t>(n_out) * n_in * 2));
      }
      const std::vector<std::string> paths = quant ? std::vector<std::string>{"f32", "q8", "deq"}
                                                   : std::vector<std::string>{f16 ? "f16" : "bf16"};
      for (int rows : a.batch) {
        for (const std::string& path : paths) {
          int call_no = 0;
          auto call = [&] {
            const uint8_t* wc = w[call_no++ % copies];
            const auto* w16 = reinterpret_cast<const uint16_t*>(wc);
            const auto t = static_cast<uint32_t>(*type);
            int e;
            if (f16) {
              e = helios::kernels::launch_matmul_f16(x, w16, rows, n_in, n_out, y, nullptr);
            } else if (bf16) {
              e = helios::kernels::launch_matmul_bf16(x, w16, rows, n_in, n_out, y, nullptr);
            } else if (path == "q8") {
              e = helios::kernels::launch_matmul_quant_q8(t, x, wc, rows, n_in, n_out, y, q8, q8_bytes, nullptr);
            } else if (path == "f32") {
              e = helios::kernels::launch_matmul_quant(t, x, wc, rows, n_in, n_out, y, nullptr);
            } else {  // the backend's cuBLAS path for many rows (one slice: these shapes are under 16384 rows)
              e = helios::kernels::launch_f32_to_f16(x, static_cast<int64_t>(rows) * n_in, xh, nullptr);
              if (e == 0) e = helios::kernels::launch_dequantize_f16(t, wc, n_out, n_in, wh, nullptr);
              const float one = 1.0f, zero = 0.0f;
              if (e == 0 && cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, rows, n_in, &one, wh, CUDA_R_16F, n_in,
                                         xh, CUDA_R_16F, n_in, &zero, y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
                die("gemv " + name + ": cublasGemmEx failed");
              }
            }
            if (e != 0) die("gemv " + name + ": " + cudaGetErrorString(static_cast<cudaError_t>(e)));
          };
          const double us = us_per_call(a.iters, call);
          const double bytes = static_cast<double>(w_bytes) + 4.0 * rows * (n_in + n_out);
          const double gbs = bytes / (us * 1e-6) / 1e9;
          const std::string shape = std::to_string(n_out) + "x" + std::to_string(n_in);
          std::printf("%-6s %12s %5d %4s %10.1f %10.1f %8.0f%%\n", name.c_str(), shape.c_str(), rows, path.c_str(), us,
                      gbs, 100.0 * gbs / a.bandwidth_gbs);
          j["runs"].push_back({{"type", name}, {"n_out", n_out}, {"n_in", n_in}, {"rows", rows}, {"path", path},
                               {"us_per_call", us}, {"bytes", bytes}, {"gb_s", gbs},
                               {"roofline_share", gbs / a.bandwidth_gbs}});
        }
      }
      for (uint8_t* p : w) cudaFree(p);
      for (void* p : {q8, static_cast<void*>(xh), static_cast<void*>(wh), static_cast<void*>(x), static_cast<void*>(y)}) {
        cudaFree(p);
      }
    }
  }
  cublasDestroy(blas);
  j["bandwidth_gbs"] = a.bandwidth_gbs;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  json j = provenance(argc, argv);
  j["mode"] = a.mode;
  int rc;
  if (a.mode == "decode") rc = cmd_decode(a, j);
  else if (a.mode == "attention") rc = cmd_attention(a, j);
  else if (a.mode == "compare") rc = cmd_compare(a, j);
  else if (a.mode == "gemv") rc = cmd_gemv(a, j);
  else die("unknown mode '" + a.mode + "' (decode, attention, compare, gemv; see --help)");
  write_json(a, j);
  return rc;
}
