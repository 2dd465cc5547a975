// Distilled exit adapters (include/helios/distill.h): forward and backward through the frozen
// final norm and LM head, in f32 on the host with BLAS, mini-batch Adam.
#include "helios/distill.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "helios/tensor_type.h"
#include "kernels/kernels.h"
#include "kernels/ref/exp_avx2.h"

namespace helios {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void affine_rows(const float* x, int64_t rows, int32_t d, const std::vector<float>& w, const std::vector<float>& b,
                 std::vector<float>* out) {
  out->resize(static_cast<size_t>(rows) * d);
  if (w.empty()) {
    std::copy_n(x, out->size(), out->begin());
    return;
  }
  for (int64_t r = 0; r < rows; ++r) std::copy(b.begin(), b.end(), out->begin() + r * d);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int32_t>(rows), d, d, 1.0f, x, d, w.data(), d, 1.0f,
              out->data(), d);
}

namespace {

float silu(float g) { return g / (1.0f + std::exp(-g)); }

// One mini-batch through the head: a = x W^T + b, then (with an MLP) a += ((silu(n G^T) * (n U^T)) D^T
// with n = a / rms(a), then u = a / rms(a), z = (u * g) E^T.
struct HeadPass {
  std::vector<float> a, u, inv_rms, z, scaled;
  std::vector<float> mlp_in, gate, up, act;  // the MLP's normed input, gate, up, silu(gate) * up

  void run(const HostHead& h, const float* x, int32_t rows, const std::vector<float>& w, const std::vector<float>& b,
           const ResidualMlp* mlp = nullptr) {
    const int32_t d = h.n_embd, v = h.n_vocab;
    affine_rows(x, rows, d, w, b, &a);
    if (mlp && !mlp->empty()) add_mlp(h, rows, *mlp);
    u.resize(a.size());
    inv_rms.resize(rows);
    scaled.resize(a.size());
    for (int32_t r = 0; r < rows; ++r) {
      const size_t at = static_cast<size_t>(r) * d;
      inv_rms[r] = normalize(a.data() + at, d, h.rms_eps, u.data() + at);
      for (int32_t j = 0; j < d; ++j) scaled[at + j] = u[at + j] * h.norm[j];
    }
    z.resize(static_cast<size_t>(rows) * v);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, v, d, 1.0f, scaled.data(), d, h.lm_head.data(), d,
                0.0f, z.data(), v);
  }

  // out = in / rms(in); returns 1 / rms(in).
  static float normalize(const float* in, int32_t d, float eps, float* out) {
    double sum_sq = 0;
    for (int32_t j = 0; j < d; ++j) sum_sq += static_cast<double>(in[j]) * in[j];
    const auto inv = static_cast<float>(1.0 / std::sqrt(sum_sq / d + eps));
    for (int32_t j = 0; j < d; ++j) out[j] = in[j] * inv;
    return inv;
  }

  void add_mlp(const HostHead& h, int32_t rows, const ResidualMlp& mlp) {
    const int32_t d = h.n_embd, hid = mlp.hidden;
    mlp_in.resize(a.size());
    for (int32_t r = 0; r < rows; ++r) {
      normalize(a.data() + static_cast<size_t>(r) * d, d, h.rms_eps, mlp_in.data() + static_cast<size_t>(r) * d);
    }
    const size_t n_hidden = static_cast<size_t>(rows) * hid;
    gate.resize(n_hidden);
    up.resize(n_hidden);
    act.resize(n_hidden);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, hid, d, 1.0f, mlp_in.data(), d, mlp.gate.data(), d,
                0.0f, gate.data(), hid);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, hid, d, 1.0f, mlp_in.data(), d, mlp.up.data(), d,
                0.0f, up.data(), hid);
    for (size_t i = 0; i < n_hidden; ++i) act[i] = silu(gate[i]) * up[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, d, hid, 1.0f, act.data(), hid, mlp.down.data(), hid,
                1.0f, a.data(), d);
  }
};

// out[i] = c softmax(z)[i] = c e^(−log_sum) e^(z[i] − max): the exit's softmax, scaled. With the
// normaliser, the vocabulary-wide exponentials are most of a step's non-BLAS time, so they run 8 at
// a time.
void scaled_softmax(const float* z, int32_t n, const kernels::LogSoftmax& ls, float c, float* out) {
  if (ls.max == -INFINITY) {  // no number: uniform
    std::fill(out, out + n, c / static_cast<float>(n));
    return;
  }
  const float shift = ls.max;
  c *= static_cast<float>(std::exp(-ls.log_sum));
  int32_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 vshift = _mm256_set1_ps(shift), vc = _mm256_set1_ps(c);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = kernels::exp_avx2(_mm256_sub_ps(kernels::softmax_logits_avx2(_mm256_loadu_ps(z + i)), vshift));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(vc, e));
  }
#endif
  for (; i < n; ++i) out[i] = c * std::exp(kernels::softmax_logit(z[i]) - shift);
}

// Sparse KL of row r and, when `grad` is given, dL/dz written over the row (scaled by `scale`).
double row_loss(const TeacherTargets& t, int64_t target_row, float* z, int32_t n_vocab, float* grad, float scale) {
  const kernels::LogSoftmax ls = kernels::cpu_log_softmax(z, n_vocab);
  const int32_t* ids = t.ids.data() + target_row * t.k;
  const float* p = t.probs.data() + target_row * t.k;
  double loss = 0, mass = 0;
  for (int32_t k = 0; k < t.k; ++k) {
    if (p[k] <= 0) continue;
    loss += p[k] * (std::log(static_cast<double>(p[k])) - ls.at(z[ids[k]]));
    mass += p[k];
  }
  if (grad) {
    scaled_softmax(z, n_vocab, ls, static_cast<float>(mass) * scale, grad);
    for (int32_t k = 0; k < t.k; ++k) grad[ids[k]] -= p[k] * scale;
  }
  return loss;
}

struct Adam {
  std::vector<float> m, v;
  int64_t t = 0;
  void step(std::vector<float>& x, const std::vector<float>& g, float lr) {
    constexpr float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    if (m.empty()) m.assign(x.size(), 0.0f), v.assign(x.size(), 0.0f);
    ++t;
    const float c1 = 1.0f - std::pow(b1, static_cast<float>(t)), c2 = 1.0f - std::pow(b2, static_cast<float>(t));
    for (size_t i = 0; i < x.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      x[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  }
};

}  // namespace

StatusOr<HostHead> host_head(const Model& model) {
  const ModelConfig& c = model.config();
  const WeightMatrix& out = model.weights().output.view;
  if (model.backend().name() != "cpu") {
    return failed_precondition("distilled exit heads are trained on the host: calibrate on the cpu backend (got " +
                               model.backend().name() + ")");
  }
  HostHead h;
  h.n_vocab = c.n_vocab;
  h.n_embd = c.n_embd;
  h.rms_eps = c.rms_eps;
  h.norm.resize(c.n_embd);
  model.backend().download(h.norm.data(), model.weights().output_norm.data(), c.n_embd);
  h.lm_head.resize(static_cast<size_t>(c.n_vocab) * c.n_embd);
  for (int32_t r = 0; r < c.n_vocab; ++r) {
    HELIOS_RETURN_IF_ERROR(dequantize_weight_row(out, r, h.lm_head.data() + static_cast<size_t>(r) * c.n_embd));
  }
  return h;
}

StatusOr<ResidualMlp> last_ffn_mlp(const Model& model, float c) {
  const ModelConfig& cfg = model.config();
  if (model.backend().name() != "cpu") {
    return failed_precondition("the last FFN is read on the host: calibrate on the cpu backend (got " +
                               model.backend().name() + ")");
  }
  if (model.n_layers_loaded() != cfg.n_layer) return failed_precondition("last_ffn_mlp needs the last block loaded");
  if (!(c > 0)) return invalid_argument("last_ffn_mlp: the scale must be > 0");
  const LayerWeights& last = model.weights().layers.back();
  const int32_t d = cfg.n_embd, f = cfg.n_ff;
  ResidualMlp mlp;
  mlp.hidden = f;
  mlp.gate.resize(static_cast<size_t>(f) * d);
  mlp.up.resize(mlp.gate.size());
  mlp.down.resize(mlp.gate.size());
  std::vector<float> norm(d);
  model.backend().download(norm.data(), last.ffn_norm.data(), d);
  for (int32_t r = 0; r < f; ++r) {
    float* g = mlp.gate.data() + static_cast<size_t>(r) * d;
    float* u = mlp.up.data() + static_cast<size_t>(r) * d;
    HELIOS_RETURN_IF_ERROR(dequantize_weight_row(last.w_gate.view, r, g));
    HELIOS_RETURN_IF_ERROR(dequantize_weight_row(last.w_up.view, r, u));
    for (int32_t j = 0; j < d; ++j) g[j] *= norm[j], u[j] *= norm[j];
  }
  for (int32_t r = 0; r < d; ++r) {
    float* row = mlp.down.data() + static_cast<size_t>(r) * f;
    HELIOS_RETURN_IF_ERROR(dequantize_weight_row(last.w_down.view, r, row));
    for (int32_t j = 0; j < f; ++j) row[j] /= c;
  }
  return mlp;
}

TeacherTargets teacher_targets(const HostHead& head, const float* h_last, int64_t n_rows, int32_t k) {
  TeacherTargets t;
  t.k = std::min(k, head.n_vocab);
  t.ids.resize(static_cast<size_t>(n_rows) * t.k);
  t.probs.resize(t.ids.size());
  constexpr int32_t kChunk = 64;
  HeadPass pass;
  std::vector<int32_t> order(head.n_vocab);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kChunk) {
    const auto rows = static_cast<int32_t>(std::min<int64_t>(kChunk, n_rows - r0));
    pass.run(head, h_last + r0 * head.n_embd, rows, {}, {});
    for (int32_t r = 0; r < rows; ++r) {
      const float* z = pass.z.data() + static_cast<size_t>(r) * head.n_vocab;
      const kernels::LogSoftmax ls = kernels::cpu_log_softmax(z, head.n_vocab);
      std::iota(order.begin(), order.end(), 0);
      auto logit = [&](int32_t i) { return kernels::softmax_logit(z[i]); };
      std::partial_sort(order.begin(), order.begin() + t.k, order.end(), [&](int32_t a, int32_t b) {
        return logit(a) > logit(b) || (logit(a) == logit(b) && a < b);
      });
      for (int32_t j = 0; j < t.k; ++j) {
        t.ids[(r0 + r) * t.k + j] = order[j];
        t.probs[(r0 + r) * t.k + j] = static_cast<float>(std::exp(ls.at(z[order[j]])));
      }
    }
  }
  return t;
}

HeadFit evaluate_head(const HostHead& head, const float* x, const TeacherTargets& t, const std::vector<float>& w,
                      const std::vector<float>& b, const ResidualMlp* mlp) {
  constexpr int32_t kChunk = 64;
  const int64_t n = t.n_rows();
  HeadPass pass;
  HeadFit fit;
  for (int64_t r0 = 0; r0 < n; r0 += kChunk) {
    const auto rows = static_cast<int32_t>(std::min<int64_t>(kChunk, n - r0));
    pass.run(head, x + r0 * head.n_embd, rows, w, b, mlp);
    for (int32_t r = 0; r < rows; ++r) {
      float* z = pass.z.data() + static_cast<size_t>(r) * head.n_vocab;
      fit.agreement += kernels::ref_argmax(z, head.n_vocab) == t.ids[(r0 + r) * t.k];
      fit.kl += row_loss(t, r0 + r, z, head.n_vocab, nullptr, 0);
    }
  }
  if (n > 0) fit.kl /= static_cast<double>(n), fit.agreement /= static_cast<double>(n);
  return fit;
}

// The mean sparse KL of the pass's rows and its gradient with respect to the final norm's input
// a, written to `da` [rows, n_embd]: dL/dz over z, dn = dz E, then back through the norm.
double loss_and_grad_at_norm(const HostHead& head, HeadPass& pass, const TeacherTargets& t, const int64_t* target_rows,
                             int32_t rows, std::vector<float>* da) {
  const int32_t d = head.n_embd, v = head.n_vocab;
  thread_local std::vector<float> dn;
  double loss = 0;
  for (int32_t r = 0; r < rows; ++r) {
    float* z = pass.z.data() + static_cast<size_t>(r) * v;
    loss += row_loss(t, target_rows[r], z, v, z, 1.0f / rows);
  }
  dn.resize(static_cast<size_t>(rows) * d);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, v, 1.0f, pass.z.data(), v, head.lm_head.data(), d,
              0.0f, dn.data(), d);
  da->resize(dn.size());
  for (int32_t r = 0; r < rows; ++r) {
    const float* u = pass.u.data() + static_cast<size_t>(r) * d;
    const float* g = dn.data() + static_cast<size_t>(r) * d;
    double dot = 0;
    for (int32_t j = 0; j < d; ++j) dot += static_cast<double>(g[j] * head.norm[j]) * u[j];
    const auto mean_dot = static_cast<float>(dot / d);
    for (int32_t j = 0; j < d; ++j) {
      (*da)[static_cast<size_t>(r) * d + j] = (g[j] * head.norm[j] - u[j] * mean_dot) * pass.inv_rms[r];
    }
  }
  return loss / rows;
}

double adapter_loss_grad(const HostHead& head, const float* x, const TeacherTargets& t, const int64_t* target_rows,
                         int32_t rows, const std::vector<float>& w, const std::vector<float>& b, std::vector<float>* gw,
                         std::vector<float>* gb) {
  const int32_t d = head.n_embd;
  thread_local HeadPass pass;
  thread_local std::vector<float> da;
  pass.run(head, x, rows, w, b);
  const double loss = loss_and_grad_at_norm(head, pass, t, target_rows, rows, &da);
  // dW = da^T x; db = the sum of da's rows.
  gb->assign(d, 0.0f);
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t j = 0; j < d; ++j) (*gb)[j] += da[static_cast<size_t>(r) * d + j];
  }
  gw->resize(static_cast<size_t>(d) * d);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, rows, 1.0f, da.data(), d, x, d, 0.0f, gw->data(), d);
  return loss;
}

double mlp_loss_grad(const HostHead& head, const float* a, const TeacherTargets& t, const int64_t* target_rows,
                     int32_t rows, const ResidualMlp& mlp, ResidualMlp* grad) {
  const int32_t d = head.n_embd, hid = mlp.hidden;
  thread_local HeadPass pass;
  thread_local std::vector<float> da, ds;
  pass.run(head, a, rows, {}, {}, &mlp);
  const double loss = loss_and_grad_at_norm(head, pass, t, target_rows, rows, &da);
  // m = a + act D^T: dD = da^T act, d(act) = da D; act = silu(g) u: dg = d(act) u silu'(g),
  // du = d(act) silu(g); g = n G^T, u = n U^T: dG = dg^T n, dU = du^T n.
  grad->hidden = hid;
  grad->gate.resize(mlp.gate.size());
  grad->up.resize(mlp.up.size());
  grad->down.resize(mlp.down.size());
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, hid, rows, 1.0f, da.data(), d, pass.act.data(), hid, 0.0f,
              grad->down.data(), hid);
  ds.resize(static_cast<size_t>(rows) * hid);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hid, d, 1.0f, da.data(), d, mlp.down.data(), hid, 0.0f,
              ds.data(), hid);
  std::vector<float>& dg = pass.gate;  // overwritten in place: the pass is spent
  std::vector<float>& du = pass.up;
  for (size_t i = 0; i < ds.size(); ++i) {
    const float g = dg[i], u = du[i], sig = 1.0f / (1.0f + std::exp(-g));
    du[i] = ds[i] * g * sig;
    dg[i] = ds[i] * u * sig * (1.0f + g * (1.0f - sig));
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hid, d, rows, 1.0f, dg.data(), hid, pass.mlp_in.data(), d, 0.0f,
              grad->gate.data(), d);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hid, d, rows, 1.0f, du.data(), hid, pass.mlp_in.data(), d, 0.0f,
              grad->up.data(), d);
  return loss;
}

namespace {

// Epochs of shuffled mini-batches, the parameters with the best held-out KL kept. `step(rows, n)`
// trains on n rows (indices into the fit set) and returns their mean loss; `held()` measures the
// current parameters on the held-out rows; `keep(best)` saves them as the best so far, or (best
// false) restores the saved ones at the end.
template <class Step, class Held, class Keep>
DistillReport run_epochs(const char* what, const DistillOptions& opt, int64_t n, const TeacherTargets& t_fit,
                         Step step, Held held, Keep keep) {
  const auto t0 = Clock::now();
  DistillReport rep;
  for (float p : t_fit.probs) rep.teacher_mass += p;
  rep.teacher_mass /= static_cast<double>(n);
  HeadFit best = held();
  rep.held_kl_start = best.kl;
  rep.held_agreement_start = best.agreement;
  keep(true);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(opt.seed);
  for (int32_t epoch = 0; epoch < opt.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    double fit_loss = 0;
    for (int64_t s = 0; s < n; s += opt.batch_rows) {
      const auto rows = static_cast<int32_t>(std::min<int64_t>(opt.batch_rows, n - s));
      fit_loss += rows * step(order.data() + s, rows);
      ++rep.steps;
    }
    const HeadFit now = held();
    if (now.kl < best.kl) {
      best = now;
      keep(true);
      rep.best_step = rep.steps;
    }
    if (opt.log) {
      char line[200];
      std::snprintf(line, sizeof line, "%s: epoch %d/%d: fit KL %.4f, held-out KL %.4f, agreement %.3f (%.1f s)",
                    what, epoch + 1, opt.epochs, fit_loss / static_cast<double>(n), now.kl, now.agreement,
                    std::chrono::duration<double>(Clock::now() - t0).count());
      opt.log(line);
    }
  }
  keep(false);
  rep.held_kl_best = best.kl;
  rep.held_agreement_best = best.agreement;
  rep.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return rep;
}

// Copies rows x[order[i]] of width d into out.
void gather(const float* x, const int64_t* order, int32_t rows, int32_t d, std::vector<float>* out) {
  out->resize(static_cast<size_t>(rows) * d);
  for (int32_t r = 0; r < rows; ++r) std::copy_n(x + order[r] * d, d, out->begin() + static_cast<size_t>(r) * d);
}

}  // namespace

StatusOr<DistillReport> distill_adapter(const HostHead& head, const float* x_fit, const TeacherTargets& t_fit,
                                        const float* x_held, const TeacherTargets& t_held,
                                        const DistillOptions& opt, std::vector<float>* w, std::vector<float>* b) {
  const int32_t d = head.n_embd;
  if (w->size() != static_cast<size_t>(d) * d || b->size() != static_cast<size_t>(d)) {
    return invalid_argument("distill_adapter starts from an [n_embd, n_embd] adapter with an [n_embd] bias");
  }
  if (opt.epochs < 1 || opt.batch_rows < 1) return invalid_argument("distill_adapter needs epochs and batch_rows >= 1");
  const int64_t n = t_fit.n_rows();
  if (n < 1) return invalid_argument("distill_adapter: no fit rows");

  std::mt19937_64 rng(opt.seed);
  // W = W0 + diag(delta) + A B with A [d, r], B [r, d]: the start W0 (the ridge fit) stays
  // exactly reachable (A starts at 0), and 2dr + d parameters instead of d^2 keep a few
  // thousand calibration tokens from being memorised. Rank 0 trains W itself.
  const int32_t rank = std::min(opt.rank, d);
  const std::vector<float> w0 = *w;
  std::vector<float> delta(rank ? d : 0, 0.0f), lo_a(static_cast<size_t>(d) * rank, 0.0f), lo_b(static_cast<size_t>(rank) * d);
  {
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(d)));
    for (float& x : lo_b) x = normal(rng);
  }
  Adam adam_w, adam_b, adam_delta, adam_a, adam_lo_b;
  std::vector<float> xb, gw, gb, g_delta(delta.size()), g_a(lo_a.size()), g_b(lo_b.size());
  auto step = [&](const int64_t* rows_at, int32_t rows) {
    gather(x_fit, rows_at, rows, d, &xb);
    const double loss = adapter_loss_grad(head, xb.data(), t_fit, rows_at, rows, *w, *b, &gw, &gb);
    adam_b.step(*b, gb, opt.learning_rate);
    if (rank == 0) {
      adam_w.step(*w, gw, opt.learning_rate);
      return loss;
    }
    for (int32_t i = 0; i < d; ++i) g_delta[i] = gw[static_cast<size_t>(i) * d + i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d, rank, d, 1.0f, gw.data(), d, lo_b.data(), d, 0.0f,
                g_a.data(), rank);  // dA = dW B^T
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rank, d, d, 1.0f, lo_a.data(), rank, gw.data(), d, 0.0f,
                g_b.data(), d);  // dB = A^T dW
    adam_delta.step(delta, g_delta, opt.learning_rate);
    adam_a.step(lo_a, g_a, opt.learning_rate);
    adam_lo_b.step(lo_b, g_b, opt.learning_rate);
    *w = w0;
    for (int32_t i = 0; i < d; ++i) (*w)[static_cast<size_t>(i) * d + i] += delta[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, rank, 1.0f, lo_a.data(), rank, lo_b.data(), d, 1.0f,
                w->data(), d);
    return loss;
  };
  std::vector<float> best_w, best_b;
  auto keep = [&](bool best) {
    if (best) best_w = *w, best_b = *b;
    else *w = std::move(best_w), *b = std::move(best_b);
  };
  return run_epochs("distill", opt, n, t_fit, step, [&] { return evaluate_head(head, x_held, t_held, *w, *b); }, keep);
}

StatusOr<DistillReport> distill_mlp(const HostHead& head, const float* a_fit, const TeacherTargets& t_fit,
                                    const float* a_held, const TeacherTargets& t_held, const DistillOptions& opt,
                                    int32_t hidden, ResidualMlp* mlp, const ResidualMlp* start) {
  const int32_t d = head.n_embd;
  if (hidden < 1) return invalid_argument("distill_mlp needs a hidden width >= 1, got " + std::to_string(hidden));
  if (opt.epochs < 1 || opt.batch_rows < 1) return invalid_argument("distill_mlp needs epochs and batch_rows >= 1");
  const int64_t n = t_fit.n_rows();
  if (n < 1) return invalid_argument("distill_mlp: no fit rows");
  const size_t size = static_cast<size_t>(hidden) * d;
  if (start) {
    if (start->hidden != hidden || start->gate.size() != size || start->up.size() != size || start->down.size() != size) {
      return invalid_argument("distill_mlp: the start MLP is not " + std::to_string(hidden) + " x " + std::to_string(d));
    }
    *mlp = *start;
  } else {
    // Gate and up random, down 0: the MLP adds nothing at the start, so training starts from the
    // adapter's own head and every step is measured against it.
    std::mt19937_64 rng(opt.seed);
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(d)));
    mlp->hidden = hidden;
    mlp->gate.resize(size);
    mlp->up.resize(size);
    for (float& x : mlp->gate) x = normal(rng);
    for (float& x : mlp->up) x = normal(rng);
    mlp->down.assign(size, 0.0f);
  }

  Adam adam_gate, adam_up, adam_down;
  ResidualMlp grad;
  std::vector<float> ab;
  auto step = [&](const int64_t* rows_at, int32_t rows) {
    gather(a_fit, rows_at, rows, d, &ab);
    const double loss = mlp_loss_grad(head, ab.data(), t_fit, rows_at, rows, *mlp, &grad);
    adam_gate.step(mlp->gate, grad.gate, opt.learning_rate);
    adam_up.step(mlp->up, grad.up, opt.learning_rate);
    adam_down.step(mlp->down, grad.down, opt.learning_rate);
    return loss;
  };
  ResidualMlp best_mlp;
  auto keep = [&](bool best) {
    if (best) best_mlp = *mlp;
    else *mlp = std::move(best_mlp);
  };
  return run_epochs("mlp", opt, n, t_fit, step, [&] { return evaluate_head(head, a_held, t_held, {}, {}, mlp); }, keep);
}

}  // namespace helios
