// helios-exit-block-probe: what an exit would gain from the last block's attention, measured
// teacher-forced on held-out text before building it into the serving path. On the same tokens
// (every 5th sequence held out, as `helios calibrate` splits), the top-1 agreement with the last
// layer of five untrained heads at one exit L:
//   lens          the final norm and LM head on h_L
//   ridge         a ridge adapter h_L → the last state (over its RMS), then the head
//   last-ffn      a ridge adapter h_L → the state entering the last block, then that block's FFN
//                 (`helios calibrate --mlp-init last-ffn` before training)
//   block-own-kv  the same adapter, then the whole last block, whose attention reads K/V made from
//                 the adapted states of the sequence (an exit block with a KV cache of its own)
//   block-true-kv the same, its attention reading the true K/V of the earlier positions (those
//                 that ran the whole model), its own K/V at its own position
// The adapted state is scaled by the median RMS of the state entering the last block, so the
// block's residual adds at the scale it was trained at.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "helios/calibrate.h"
#include "helios/distill.h"
#include "helios/early_exit.h"
#include "helios/model.h"

namespace helios {
namespace {

struct Options {
  std::string model = "models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf";
  std::vector<std::string> texts;
  int32_t exit_layer = 0;
  int64_t max_tokens = 16384;
  int32_t seq_len = 256;
  int threads = 0;
  std::vector<float> ridges = {1e-6f, 1e-5f, 1e-4f};
};

void usage() {
  std::fprintf(stderr,
               "usage: helios-exit-block-probe --exit L --text FILE [--text FILE ...] [--model PATH]\n"
               "                               [--max-tokens N] [--seq-len S] [--threads N] [--ridge a,b,..]\n"
               "Teacher-forced top-1 agreement with the last layer at exit L of the lens, a ridge adapter, the\n"
               "last block's FFN behind a ridge adapter, and the whole last block (its attention on K/V of its\n"
               "own, or on the true K/V of the earlier positions), untrained, on every 5th sequence.\n");
}

std::vector<float> rows_of(const std::vector<float>& all, const std::vector<int64_t>& rows, int32_t d) {
  std::vector<float> out(rows.size() * static_cast<size_t>(d));
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(all.data() + rows[i] * d, d, out.data() + i * d);
  return out;
}

// Each row over its RMS; returns the rows' RMS.
std::vector<float> normalize_rows(std::vector<float>& x, int32_t d, float eps) {
  std::vector<float> rms(x.size() / d);
  for (size_t r = 0; r < rms.size(); ++r) {
    double ss = 0;
    for (int32_t i = 0; i < d; ++i) ss += double(x[r * d + i]) * x[r * d + i];
    rms[r] = static_cast<float>(std::sqrt(ss / d + eps));
    for (int32_t i = 0; i < d; ++i) x[r * d + i] /= rms[r];
  }
  return rms;
}

int32_t argmax(const float* row, int32_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

double share_equal(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return a.empty() ? 0.0 : double(same) / double(a.size());
}

int run(const Options& o) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto backend = make_cpu_backend(o.threads);
  auto loaded = Model::load(o.model, *backend);
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str()), 1;
  Model& model = **loaded;
  const ModelConfig& c = model.config();
  const int32_t d = c.n_embd, last = c.n_layer - 1;
  if (o.exit_layer < 1 || o.exit_layer >= c.n_layer) return std::fprintf(stderr, "--exit must be 1..%d\n", last), 2;
  std::vector<std::vector<std::string>> per_file;
  for (const std::string& path : o.texts) {
    auto docs = load_text_documents(path);
    if (!docs.ok()) return std::fprintf(stderr, "%s\n", docs.status().to_string().c_str()), 1;
    per_file.push_back(std::move(*docs));
  }
  const auto sequences =
      make_token_sequences(model.tokenizer(), interleave_documents(std::move(per_file)), o.seq_len, o.max_tokens);
  if (Status s = model.set_exits({o.exit_layer}, nullptr); !s.ok()) return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
  auto data = collect_hidden_states(model, sequences, {o.exit_layer},
                                    [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }, true);
  if (!data.ok()) return std::fprintf(stderr, "%s\n", data.status().to_string().c_str()), 1;
  const double collect_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // Every 5th sequence held out, as `helios calibrate` does.
  std::vector<int64_t> fit, held;
  for (int64_t i = 0; i < data->n_tokens(); ++i) (data->sequence[i] % 5 == 4 ? held : fit).push_back(i);
  std::vector<int32_t> final_held;
  for (int64_t i : held) final_held.push_back(data->final_top1[i]);
  const std::vector<float> x_fit = rows_of(data->at(o.exit_layer), fit, d);
  const std::vector<float> x_held = rows_of(data->at(o.exit_layer), held, d);
  std::vector<float> y_final = rows_of(data->states.back(), fit, d);
  normalize_rows(y_final, d, c.rms_eps);
  std::vector<float> y_into = rows_of(data->last_block_input, fit, d);
  std::vector<float> rms = normalize_rows(y_into, d, c.rms_eps);
  std::nth_element(rms.begin(), rms.begin() + rms.size() / 2, rms.end());
  const float median_rms = rms[rms.size() / 2];

  auto lens = exit_head_top1(model, x_held.data(), static_cast<int64_t>(held.size()), {}, {});
  std::vector<AffineAdapter> onto_final, onto_last;
  if (!lens.ok() || !fit_affine_adapters(x_fit.data(), y_final.data(), static_cast<int64_t>(fit.size()), d, o.ridges, &onto_final).ok() ||
      !fit_affine_adapters(x_fit.data(), y_into.data(), static_cast<int64_t>(fit.size()), d, o.ridges, &onto_last).ok()) {
    return std::fprintf(stderr, "fitting failed\n"), 1;
  }
  auto ffn = last_ffn_mlp(model, median_rms);
  if (!ffn.ok()) return std::fprintf(stderr, "%s\n", ffn.status().to_string().c_str()), 1;
  double ridge_best = 0, ffn_best = 0;
  size_t ffn_at = 0;
  for (size_t k = 0; k < o.ridges.size(); ++k) {
    auto r = exit_head_top1(model, x_held.data(), static_cast<int64_t>(held.size()), onto_final[k].w, onto_final[k].b);
    auto f = exit_head_top1(model, x_held.data(), static_cast<int64_t>(held.size()), onto_last[k].w, onto_last[k].b,
                            nullptr, &*ffn);
    if (!r.ok() || !f.ok()) return std::fprintf(stderr, "exit head failed\n"), 1;
    ridge_best = std::max(ridge_best, share_equal(*r, final_held));
    const double fa = share_equal(*f, final_held);
    std::fprintf(stderr, "ridge %g: ridge head %.3f, last-ffn head %.3f\n", o.ridges[k], share_equal(*r, final_held), fa);
    if (fa > ffn_best) ffn_best = fa, ffn_at = k;
  }

  // The last block on the adapted states (times the median RMS), sequence by sequence.
  std::vector<float> adapted;
  affine_rows(x_held.data(), static_cast<int64_t>(held.size()), d, onto_last[ffn_at].w, onto_last[ffn_at].b, &adapted);
  for (float& v : adapted) v *= median_rms;
  const std::vector<float> true_in = rows_of(data->last_block_input, held, d);
  const int32_t block = 16, n_blocks = (o.seq_len + block - 1) / block;
  auto kv = model.create_kv(n_blocks, block);
  if (!kv.ok()) return std::fprintf(stderr, "%s\n", kv.status().to_string().c_str()), 1;
  BlockTable table;
  for (int32_t b = 0; b < n_blocks; ++b) table.block_ids.push_back(b);
  // One partial pass through the last block: `n` states from `in` at positions start.., logits or none.
  auto last_block = [&](const float* in, int32_t start, int32_t n, LogitsWanted logits) -> StatusOr<ForwardResult> {
    ForwardBatch batch;
    SequenceBatchEntry e;
    e.tokens.assign(n, 0);  // unused: the pass starts from hidden_in
    e.start_pos = start;
    e.blocks = &table;
    e.logits = logits;
    batch.seqs.push_back(e);
    batch.first_layer = last;
    batch.hidden_in = in;
    return model.forward(batch, *kv);
  };
  std::vector<int32_t> own_kv, true_kv;
  const auto t1 = Clock::now();
  for (size_t begin = 0; begin < held.size();) {
    size_t end = begin;
    while (end < held.size() && data->sequence[held[end]] == data->sequence[held[begin]]) ++end;
    const auto n = static_cast<int32_t>(end - begin);
    const float* a = adapted.data() + begin * d;
    const float* t = true_in.data() + begin * d;
    auto own = last_block(a, 0, n, LogitsWanted::kAll);
    if (!own.ok()) return std::fprintf(stderr, "%s\n", own.status().to_string().c_str()), 1;
    for (int32_t i = 0; i < n; ++i) own_kv.push_back(argmax(own->row(i), c.n_vocab));
    // The true K/V of the sequence, then each position from its adapted state, then its true K/V again.
    if (auto fill = last_block(t, 0, n, LogitsWanted::kNone); !fill.ok()) return 1;
    for (int32_t i = 0; i < n; ++i) {
      auto one = last_block(a + static_cast<size_t>(i) * d, i, 1, LogitsWanted::kLast);
      if (!one.ok()) return std::fprintf(stderr, "%s\n", one.status().to_string().c_str()), 1;
      true_kv.push_back(argmax(one->row(0), c.n_vocab));
      if (auto back = last_block(t + static_cast<size_t>(i) * d, i, 1, LogitsWanted::kNone); !back.ok()) return 1;
    }
    begin = end;
  }
  const double block_s = std::chrono::duration<double>(Clock::now() - t1).count();

  std::printf("# The last block as an exit head: %s, exit %d of %d\n\n", c.name.c_str(), o.exit_layer, c.n_layer);
  std::printf("%lld calibration tokens (%zu fit, %zu held out: every 5th sequence of at most %d); untrained heads "
              "(ridge adapters, penalty chosen on the held-out tokens); median RMS into the last block %.2f.\n\n",
              static_cast<long long>(data->n_tokens()), fit.size(), held.size(), o.seq_len, median_rms);
  std::printf("| head at exit %d | held-out agreement with the last layer |\n|---|---:|\n", o.exit_layer);
  std::printf("| logit lens | %.1f%% |\n", 100 * share_equal(*lens, final_held));
  std::printf("| ridge adapter | %.1f%% |\n", 100 * ridge_best);
  std::printf("| adapter into the last block + its FFN (last-ffn) | %.1f%% |\n", 100 * ffn_best);
  std::printf("| adapter + the whole last block, K/V of its own | %.1f%% |\n", 100 * share_equal(own_kv, final_held));
  std::printf("| adapter + the whole last block, true K/V of earlier positions | %.1f%% |\n\n",
              100 * share_equal(true_kv, final_held));
  std::printf("The two last-block heads pick different tokens at %.1f%% of the held-out positions.\n",
              100 * (1 - share_equal(own_kv, true_kv)));
  std::printf("Cost on this machine: collecting the states %.0f s; the last-block heads %.0f s.\n", collect_s, block_s);
  return 0;
}

}  // namespace
}  // namespace helios

int main(int argc, char** argv) {
  helios::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "-h" || a == "--help") return helios::usage(), 0;
    if (!v) return helios::usage(), 2;
    if (a == "--model") o.model = v;
    else if (a == "--text") o.texts.push_back(v);
    else if (a == "--exit") o.exit_layer = std::atoi(v);
    else if (a == "--max-tokens") o.max_tokens = std::atoll(v);
    else if (a == "--seq-len") o.seq_len = std::atoi(v);
    else if (a == "--threads") o.threads = std::atoi(v);
    else if (a == "--ridge") {
      o.ridges.clear();
      std::string list = v;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        o.ridges.push_back(std::stof(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else return helios::usage(), 2;
    ++i;
  }
  if (o.exit_layer <= 0 || o.texts.empty()) return helios::usage(), 2;
  return helios::run(o);
}
