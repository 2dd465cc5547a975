// How much could an exit head gain from the model's own last FFN? Held-out top-1 agreement with
// the full model at an exit d, teacher-forced, for heads fitted by ridge only (no training):
//   ridge        lm_head(norm(W h_d + b)), W fitted to h_L / rms(h_L)          (helios calibrate's ridge)
//   ridge+ffn    the same map fitted to h_{L-1} / rms, scaled back to h_{L-1}'s size, then
//                x + FFN_L(ffn_norm_L(x)) before the final norm: the last block without attention
//   oracle-ffn   the true h_{L-1} through that FFN: what skipping the last attention alone costs
//   lens-(L-1)   lm_head(norm(h_{L-1})): what the whole last block adds
// A head is worth training only where its untrained form already beats ridge.
// Usage: head_capacity_probe MODEL EXIT TEXT... [--tokens N]   (run_head_capacity_probe.sh builds it)
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "helios/backend.h"
#include "helios/calibrate.h"
#include "helios/early_exit.h"
#include "helios/model.h"

using namespace helios;

namespace {

void die(const Status& s) {
  std::fprintf(stderr, "head_capacity_probe: %s\n", s.to_string().c_str());
  std::exit(1);
}
template <typename T>
T take(StatusOr<T> v) {
  if (!v.ok()) die(v.status());
  return std::move(*v);
}

std::vector<float> dequantized(const WeightMatrix& w, int32_t rows, int32_t cols) {
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  for (int32_t r = 0; r < rows; ++r) {
    if (Status s = dequantize_weight_row(w, r, out.data() + static_cast<size_t>(r) * cols); !s.ok()) die(s);
  }
  return out;
}

// rows += FFN(ffn_norm(rows)), SwiGLU, in f32.
struct HostFfn {
  int32_t d = 0, ff = 0;
  float eps = 0;
  std::vector<float> norm, gate, up, down;
  void apply(std::vector<float>& x, int64_t n) const {
    std::vector<float> u(x.size()), g(static_cast<size_t>(n) * ff), h(g.size()), o(x.size());
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x.data() + r * d;
      double ss = 0;
      for (int32_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
      const auto inv = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
      for (int32_t j = 0; j < d; ++j) u[r * d + j] = xr[j] * inv * norm[j];
    }
    const auto rows = static_cast<int32_t>(n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, ff, d, 1.0f, u.data(), d, gate.data(), d, 0.0f, g.data(), ff);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, ff, d, 1.0f, u.data(), d, up.data(), d, 0.0f, h.data(), ff);
    for (size_t i = 0; i < g.size(); ++i) h[i] *= g[i] / (1.0f + std::exp(-g[i]));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, d, ff, 1.0f, h.data(), ff, down.data(), ff, 0.0f, o.data(), d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
};

std::vector<float> rows_of(const std::vector<float>& states, const std::vector<int64_t>& rows, int32_t d) {
  std::vector<float> out(rows.size() * d);
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(states.data() + rows[i] * d, d, out.data() + i * d);
  return out;
}

double rms_of(const float* x, int32_t d) {
  double ss = 0;
  for (int32_t j = 0; j < d; ++j) ss += static_cast<double>(x[j]) * x[j];
  return std::sqrt(ss / d);
}

// x W^T + b, row by row.
std::vector<float> affine(const std::vector<float>& x, int64_t n, int32_t d, const AffineAdapter& a) {
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < n; ++r) std::copy(a.b.begin(), a.b.end(), y.begin() + r * d);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int32_t>(n), d, d, 1.0f, x.data(), d, a.w.data(), d,
              1.0f, y.data(), d);
  return y;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL EXIT TEXT... [--tokens N]\n", argv[0]);
    return 2;
  }
  const std::string model_path = argv[1];
  const int32_t exit_layer = std::atoi(argv[2]);
  int64_t max_tokens = 8192;
  std::vector<std::string> texts;
  for (int i = 3; i < argc; ++i) {
    if (std::string(argv[i]) == "--tokens" && i + 1 < argc) {
      max_tokens = std::atoll(argv[++i]);
    } else {
      texts.push_back(argv[i]);
    }
  }
  auto backend = make_cpu_backend(0);
  std::unique_ptr<Model> model = take(Model::load(model_path, *backend));
  const ModelConfig& c = model->config();
  const int32_t d = c.n_embd, L = c.n_layer;
  std::vector<std::vector<std::string>> docs;
  for (const std::string& t : texts) docs.push_back(take(load_text_documents(t)));
  const auto sequences = make_token_sequences(model->tokenizer(), interleave_documents(std::move(docs)), 256, max_tokens);
  const HiddenStates hs = take(collect_hidden_states(*model, sequences, {exit_layer, L - 1},
                                                     [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }));
  std::vector<int64_t> fit, held;  // every 5th sequence held out, as helios calibrate does
  for (int64_t i = 0; i < hs.n_tokens(); ++i) (hs.sequence[i] % 5 == 4 ? held : fit).push_back(i);

  const std::vector<float> x_fit = rows_of(hs.at(exit_layer), fit, d), x_held = rows_of(hs.at(exit_layer), held, d);
  auto unit_rows = [&](std::vector<float> y) {
    for (size_t r = 0; r * d < y.size(); ++r) {
      const auto inv = static_cast<float>(1.0 / std::sqrt(std::pow(rms_of(y.data() + r * d, d), 2) + c.rms_eps));
      for (int32_t j = 0; j < d; ++j) y[r * d + j] *= inv;
    }
    return y;
  };
  const std::vector<float> y_last = unit_rows(rows_of(hs.at(L), fit, d));
  const std::vector<float> prev_fit = rows_of(hs.at(L - 1), fit, d);
  const std::vector<float> y_prev = unit_rows(prev_fit);
  double prev_rms = 0;  // the size of h_{L-1}, for the residual the FFN adds to
  for (size_t r = 0; r < fit.size(); ++r) prev_rms += rms_of(prev_fit.data() + r * d, d);
  prev_rms /= static_cast<double>(fit.size());

  const LayerWeights& lw = model->weights().layers[L - 1];
  HostFfn ffn;
  ffn.d = d;
  ffn.ff = c.n_ff;
  ffn.eps = c.rms_eps;
  ffn.norm.resize(d);
  model->backend().download(ffn.norm.data(), lw.ffn_norm.data(), d);
  ffn.gate = dequantized(lw.w_gate.view, c.n_ff, d);
  ffn.up = dequantized(lw.w_up.view, c.n_ff, d);
  ffn.down = dequantized(lw.w_down.view, d, c.n_ff);

  const auto n_held = static_cast<int64_t>(held.size());
  auto agreement = [&](const std::vector<float>& pre_head) {
    const std::vector<int32_t> top1 = take(exit_head_top1(*model, pre_head.data(), n_held, {}, {}));
    int64_t same = 0;
    for (int64_t i = 0; i < n_held; ++i) same += top1[i] == hs.final_top1[held[i]];
    return static_cast<double>(same) / static_cast<double>(n_held);
  };
  std::printf("model %s, exit %d of %d, %zu fit and %zu held-out tokens; held-out top-1 agreement with the full model:\n",
              model_path.c_str(), exit_layer, L, fit.size(), held.size());
  std::vector<float> oracle = rows_of(hs.at(L - 1), held, d);
  std::printf("  lens-(L-1)   %.1f%%\n", 100 * agreement(oracle));
  ffn.apply(oracle, n_held);
  std::printf("  oracle-ffn   %.1f%%\n", 100 * agreement(oracle));
  for (float ridge : {1e-6f, 1e-4f}) {
    std::vector<AffineAdapter> to_last, to_prev;
    if (Status s = fit_affine_adapters(x_fit.data(), y_last.data(), static_cast<int64_t>(fit.size()), d, {ridge}, &to_last); !s.ok()) die(s);
    if (Status s = fit_affine_adapters(x_fit.data(), y_prev.data(), static_cast<int64_t>(fit.size()), d, {ridge}, &to_prev); !s.ok()) die(s);
    std::printf("  ridge        %.1f%%   (penalty %g)\n", 100 * agreement(affine(x_held, n_held, d, to_last[0])), ridge);
    std::vector<float> x = affine(x_held, n_held, d, to_prev[0]);
    for (float& v : x) v *= static_cast<float>(prev_rms);
    ffn.apply(x, n_held);
    std::printf("  ridge+ffn    %.1f%%   (penalty %g)\n", 100 * agreement(x), ridge);
  }
  return 0;
}
