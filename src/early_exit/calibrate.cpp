// Exit-head calibration: collect hidden states teacher-forced, then per exit fit the affine
// adapter (kept only when it beats the logit lens on held-out tokens) and the agreement probe.
#include "helios/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <cblas.h>

#include "helios/distill.h"
#include "helios/sampler.h"
#include "helios/teacher_forced.h"

namespace helios {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr int64_t kHeadChunkRows = 256;  // rows per exit-head pass: bounds the [rows, n_vocab] logits

void say(const ProgressLog& log, const std::string& line) {
  if (log) log(line);
}

std::string fmt(const char* format, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, a, b, c, d);
  return buf;
}

// Each of the n rows of [n, d] divided by its RMS, sqrt(mean(x^2) + eps); `rms`, when given, gets
// each row's sqrt(mean(x^2)) before it.
void divide_rows_by_rms(float* rows, int64_t n, int32_t d, double eps, std::vector<float>* rms = nullptr) {
  if (rms) rms->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float* row = rows + i * d;
    double sum_sq = 0;
    for (int32_t j = 0; j < d; ++j) sum_sq += static_cast<double>(row[j]) * row[j];
    if (rms) (*rms)[i] = static_cast<float>(std::sqrt(sum_sq / d));
    const auto inv_rms = static_cast<float>(1.0 / std::sqrt(sum_sq / d + eps));
    for (int32_t j = 0; j < d; ++j) row[j] *= inv_rms;
  }
}

// rows[i] of a [*, d] matrix, gathered into [rows.size(), d].
std::vector<float> gather_rows(const std::vector<float>& m, const std::vector<int64_t>& rows, int32_t d) {
  std::vector<float> out(rows.size() * static_cast<size_t>(d));
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(m.data() + static_cast<size_t>(rows[i]) * d, d, out.data() + i * d);
  }
  return out;
}

double agreement(const std::vector<int32_t>& top1, const std::vector<int32_t>& final_top1,
                 const std::vector<int64_t>& rows) {
  int64_t same = 0;
  for (size_t i = 0; i < rows.size(); ++i) same += top1[i] == final_top1[rows[i]];
  return rows.empty() ? 0.0 : static_cast<double>(same) / static_cast<double>(rows.size());
}

}  // namespace

const std::vector<float>& HiddenStates::at(int32_t layer) const {
  const auto it = std::find(layers.begin(), layers.end(), layer);
  return states.at(static_cast<size_t>(it - layers.begin()));
}

StatusOr<HiddenStates> collect_hidden_states(Model& model, const std::vector<std::vector<TokenId>>& sequences,
                                             const std::vector<int32_t>& exit_layers, const ProgressLog& log,
                                             bool keep_last_block_input) {
  const ModelConfig& c = model.config();
  if (model.n_layers_loaded() != c.n_layer) {
    return invalid_argument("calibration needs every layer loaded (" + std::to_string(model.n_layers_loaded()) +
                            " of " + std::to_string(c.n_layer) + " are): the adapters map onto the last layer; "
                            "load the whole model (no --load-layers)");
  }
  HiddenStates out;
  out.n_embd = c.n_embd;
  out.layers = exit_layers;
  std::sort(out.layers.begin(), out.layers.end());
  out.layers.erase(std::unique(out.layers.begin(), out.layers.end()), out.layers.end());
  for (int32_t l : out.layers) {
    if (l < 1 || l >= c.n_layer) {
      return invalid_argument("exit layer " + std::to_string(l) + " is outside 1.." + std::to_string(c.n_layer - 1) +
                              " (layer " + std::to_string(c.n_layer) + " is the model's own head)");
    }
  }
  out.layers.push_back(c.n_layer);  // no exits: the last layer alone (for a lookahead head)
  if (sequences.empty()) return invalid_argument("no calibration tokens: the text gave no sequence of 2+ tokens");

  size_t max_len = 0, total = 0;
  for (const auto& s : sequences) {
    max_len = std::max(max_len, s.size());
    total += s.size();
  }
  if (static_cast<int64_t>(max_len) > c.n_ctx_train) {
    return invalid_argument("calibration sequences of " + std::to_string(max_len) + " tokens exceed the model's context (" +
                            std::to_string(c.n_ctx_train) + "); use a smaller --seq-len");
  }
  HELIOS_ASSIGN_OR_RETURN(auto runner, TeacherForcedRunner::create(model, max_len));
  ForwardBatch capture;
  capture.capture_layers = out.layers;
  // The state entering the last block is the state after block n_layer - 1, an exit or not.
  const auto last_input_at = static_cast<size_t>(
      std::find(out.layers.begin(), out.layers.end(), c.n_layer - 1) - out.layers.begin());
  if (keep_last_block_input && last_input_at == out.layers.size()) capture.capture_layers.push_back(c.n_layer - 1);

  out.states.assign(out.layers.size(), {});
  for (auto& s : out.states) s.reserve(total * c.n_embd);
  out.final_top1.reserve(total);
  const auto t0 = Clock::now();
  size_t done = 0, next_report = total / 10;
  for (size_t s = 0; s < sequences.size(); ++s) {
    HELIOS_ASSIGN_OR_RETURN(ForwardResult fr, runner.run(sequences[s], {}, capture));
    for (size_t r = 0; r < fr.row_seq.size(); ++r) {
      out.final_top1.push_back(argmax(fr.row(r), fr.n_vocab));
      out.sequence.push_back(static_cast<int32_t>(s));
    }
    out.tokens.insert(out.tokens.end(), sequences[s].begin(), sequences[s].end());
    for (size_t i = 0; i < out.layers.size(); ++i) {
      out.states[i].insert(out.states[i].end(), fr.captured[i].begin(), fr.captured[i].end());
    }
    if (keep_last_block_input) {
      const auto& in = fr.captured[last_input_at];
      out.last_block_input.insert(out.last_block_input.end(), in.begin(), in.end());
    }
    done += sequences[s].size();
    if (done >= next_report || s + 1 == sequences.size()) {
      const double t = seconds_since(t0);
      say(log, fmt("calibrate: %.0f/%.0f tokens through the model (%.1f s, %.0f tok/s)", static_cast<double>(done),
                   static_cast<double>(total), t, done / std::max(t, 1e-9)));
      next_report = done + total / 10;
    }
  }
  return out;
}

StatusOr<std::vector<int32_t>> exit_head_top1(Model& model, const float* hidden, int64_t n_rows,
                                              const std::vector<float>& w, const std::vector<float>& b,
                                              std::vector<float>* top1_prob, const ResidualMlp* mlp) {
  Backend& be = model.backend();
  const ModelConfig& c = model.config();
  const int32_t d = c.n_embd;
  const bool adapter = !w.empty();
  if (adapter && (w.size() != static_cast<size_t>(d) * d || b.size() != static_cast<size_t>(d))) {
    return invalid_argument("exit_head_top1: the adapter must be [n_embd, n_embd] with an [n_embd] bias (n_embd " +
                            std::to_string(d) + ")");
  }
  const int64_t chunk = std::min<int64_t>(kHeadChunkRows, std::max<int64_t>(n_rows, 1));
  Buffer in(&be, chunk * d);                          // [chunk, n_embd] h, then the normed head input
  Buffer mid(&be, chunk * d);                         // [chunk, n_embd] W h + b
  Buffer logits(&be, static_cast<size_t>(chunk) * c.n_vocab);  // [chunk, n_vocab]
  Matrix weight;  // as Model::set_exits uploads it
  Buffer bias;
  if (adapter) {
    HELIOS_ASSIGN_OR_RETURN(weight, upload_matrix(be, "exit adapter", w.data(), d, d));
    bias = Buffer(&be, b.size());
  }
  if (in.empty() || mid.empty() || logits.empty() || (adapter && bias.empty())) {
    return resource_exhausted("no backend memory for an exit-head pass of " + std::to_string(chunk) + " rows");
  }
  if (adapter) be.upload(bias.data(), b.data(), b.size());
  std::shared_ptr<ExitMlp> device_mlp;  // as Model::set_exits uploads it
  if (mlp && !mlp->empty()) {
    HELIOS_ASSIGN_OR_RETURN(device_mlp, ExitMlp::upload(be, *mlp, d, "exit MLP"));
  }
  std::vector<int32_t> top1(n_rows);
  std::vector<float> prob(chunk), margin(chunk), entropy(chunk);
  for (int64_t start = 0; start < n_rows; start += chunk) {
    const auto rows = static_cast<int32_t>(std::min(chunk, n_rows - start));
    be.upload(in.data(), hidden + start * d, static_cast<size_t>(rows) * d);
    model.apply_exit_head(in.data(), rows, adapter ? &weight.view : nullptr, bias.data(), device_mlp.get(), mid.data(),
                          logits.data());
    be.exit_stats(logits.data(), rows, c.n_vocab, top1.data() + start, prob.data(), margin.data(), entropy.data());
    if (top1_prob) top1_prob->insert(top1_prob->end(), prob.begin(), prob.begin() + rows);
  }
  return top1;
}

float fit_exit_threshold(const std::vector<float>& top1_prob, const std::vector<uint8_t>& agrees, double target,
                         int64_t min_tokens, double* coverage) {
  std::vector<size_t> order(top1_prob.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return top1_prob[a] > top1_prob[b]; });
  // Walk down the confidences: the last prefix that still meets the target sets the threshold.
  float best = 1.0f;
  int64_t agreeing = 0, best_count = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    agreeing += agrees[order[k]];
    const auto n = static_cast<int64_t>(k + 1);
    const bool tie_next = k + 1 < order.size() && top1_prob[order[k + 1]] == top1_prob[order[k]];
    if (!tie_next && n >= min_tokens && static_cast<double>(agreeing) >= target * static_cast<double>(n)) {
      best = top1_prob[order[k]];
      best_count = n;
    }
  }
  if (coverage) *coverage = order.empty() ? 0.0 : static_cast<double>(best_count) / static_cast<double>(order.size());
  return best;
}

StatusOr<CalibrationResult> fit_exit_heads(Model& model, const HiddenStates& data, const CalibrationOptions& opt) {
  const ModelConfig& c = model.config();
  const int32_t d = data.n_embd;
  if (d != c.n_embd) return invalid_argument("hidden states of width " + std::to_string(d) + " for a model of " + std::to_string(c.n_embd));
  if (data.layers.size() < 2 || data.layers.back() != c.n_layer) {
    return invalid_argument("fit_exit_heads needs states at the exits and at the last layer (collect_hidden_states)");
  }
  if (opt.ridges.empty()) return invalid_argument("ridges: give at least one ridge penalty");
  if (opt.held_out_every < 2) return invalid_argument("held_out_every must be >= 2, got " + std::to_string(opt.held_out_every));
  if (opt.head != "best" && opt.head != "lens" && opt.head != "ridge" && opt.head != "distilled" && opt.head != "mlp") {
    return invalid_argument("head must be best, lens, ridge, distilled or mlp, got '" + opt.head + "'");
  }
  if (opt.head == "distilled" && !opt.distill) return invalid_argument("head 'distilled' needs distill on");
  if (opt.mlp_hidden < 0) return invalid_argument("mlp_hidden must be >= 0, got " + std::to_string(opt.mlp_hidden));
  const bool from_last_ffn = opt.mlp_init == "last-ffn";
  if (!from_last_ffn && opt.mlp_init != "random") {
    return invalid_argument("mlp_init must be random or last-ffn, got '" + opt.mlp_init + "'");
  }
  if (from_last_ffn && opt.mlp_hidden != 0 && opt.mlp_hidden != c.n_ff) {
    return invalid_argument("an MLP started from the last FFN is the FFN's width: mlp_hidden must be 0 or " +
                            std::to_string(c.n_ff) + ", got " + std::to_string(opt.mlp_hidden));
  }
  const int32_t mlp_hidden = from_last_ffn ? c.n_ff : opt.mlp_hidden;  // 0: no MLP head
  if (opt.head == "mlp" && mlp_hidden < 1) return invalid_argument("head 'mlp' needs mlp_hidden >= 1 or mlp_init last-ffn");
  if (from_last_ffn && data.last_block_input.size() != data.states.back().size()) {
    return invalid_argument("mlp_init last-ffn needs the states entering the last block "
                            "(collect_hidden_states with keep_last_block_input)");
  }

  // Held-out tokens: whole sequences when there are enough of them (neighbouring tokens are
  // alike, so a token interleave would flatter the fit), else every k-th token.
  const int64_t n = data.n_tokens();
  const int32_t n_sequences = data.sequence.empty() ? 0 : data.sequence.back() + 1;
  const int32_t k = opt.held_out_every;
  std::vector<int64_t> fit_rows, held_rows;
  for (int64_t i = 0; i < n; ++i) {
    const bool held = n_sequences >= k ? data.sequence[i] % k == k - 1 : i % k == k - 1;
    (held ? held_rows : fit_rows).push_back(i);
  }
  if (static_cast<int64_t>(fit_rows.size()) < 2 * d / 8 || held_rows.size() < 16) {
    say(opt.log, fmt("calibrate: warning: only %.0f fit and %.0f held-out tokens for width %.0f; the fits will be "
                     "noisy (use more --max-tokens)", static_cast<double>(fit_rows.size()),
                     static_cast<double>(held_rows.size()), d));
  }
  if (fit_rows.size() < 2 || held_rows.empty()) {
    return invalid_argument("too few calibration tokens (" + std::to_string(n) + ") to split into fit and held-out sets");
  }
  std::vector<int32_t> final_fit(fit_rows.size()), final_held(held_rows.size());
  for (size_t i = 0; i < fit_rows.size(); ++i) final_fit[i] = data.final_top1[fit_rows[i]];
  for (size_t i = 0; i < held_rows.size(); ++i) final_held[i] = data.final_top1[held_rows[i]];
  const std::vector<float> y_fit = gather_rows(data.states.back(), fit_rows, d);
  // The ridge target: each last-layer state over its RMS, what the final norm makes of it up to
  // the norm's weight. Raw states would let the few tokens with massive activations (thousands
  // in a handful of dimensions, as at a sequence's first position) outweigh all the others.
  std::vector<float> y_ridge = y_fit;
  divide_rows_by_rms(y_ridge.data(), static_cast<int64_t>(fit_rows.size()), d, c.rms_eps);

  // Distillation's frozen head and the teacher's targets, once for every exit.
  HostHead host;
  TeacherTargets teacher_fit, teacher_held;
  if (opt.distill || mlp_hidden > 0) {
    const auto t0 = Clock::now();
    HELIOS_ASSIGN_OR_RETURN(host, host_head(model));
    const std::vector<float> y_held = gather_rows(data.states.back(), held_rows, d);
    teacher_fit = teacher_targets(host, y_fit.data(), static_cast<int64_t>(fit_rows.size()), opt.teacher_top_k);
    teacher_held = teacher_targets(host, y_held.data(), static_cast<int64_t>(held_rows.size()), opt.teacher_top_k);
    say(opt.log, fmt("calibrate: teacher targets (top %.0f of the last layer) for %.0f tokens in %.1f s",
                     opt.teacher_top_k, static_cast<double>(n), seconds_since(t0)));
  }

  // An MLP started from the last FFN: its adapter maps onto the state entering the last block (over
  // its RMS, as y_ridge), and its down projection is divided by that state's median RMS.
  std::vector<float> y_last_input;
  ResidualMlp last_ffn;
  if (from_last_ffn) {
    y_last_input = gather_rows(data.last_block_input, fit_rows, d);
    std::vector<float> rms;
    divide_rows_by_rms(y_last_input.data(), static_cast<int64_t>(fit_rows.size()), d, c.rms_eps, &rms);
    std::nth_element(rms.begin(), rms.begin() + rms.size() / 2, rms.end());
    const float median_rms = rms[rms.size() / 2];
    HELIOS_ASSIGN_OR_RETURN(last_ffn, last_ffn_mlp(model, median_rms));
    say(opt.log, fmt("calibrate: MLP heads start from the last block's FFN (%.0f hidden; median RMS into it %.2f)",
                     c.n_ff, median_rms));
  }

  CalibrationResult result;
  result.heads.model_name = c.name;
  result.heads.n_layer = c.n_layer;
  result.heads.n_embd = c.n_embd;
  for (size_t li = 0; li + 1 < data.layers.size(); ++li) {
    const auto t0 = Clock::now();
    const int32_t layer = data.layers[li];
    std::vector<float> x_fit = gather_rows(data.states[li], fit_rows, d);
    const std::vector<float> x_held = gather_rows(data.states[li], held_rows, d);
    ExitCalibration cal;
    cal.layer = layer;
    cal.n_fit = static_cast<int64_t>(fit_rows.size());
    cal.n_held_out = static_cast<int64_t>(held_rows.size());

    // Ridge adapter, then (optionally) distilled from it, against the logit lens on the held-out
    // tokens, each measured through the model's own LM head.
    // With several penalties, the one whose adapter agrees most on the held-out tokens.
    std::vector<float> w, b;
    std::vector<AffineAdapter> fits;
    HELIOS_RETURN_IF_ERROR(fit_affine_adapters(x_fit.data(), y_ridge.data(), cal.n_fit, d, opt.ridges, &fits));
    std::vector<float> lens_prob, ridge_prob, kept_prob;
    HELIOS_ASSIGN_OR_RETURN(auto lens_held, exit_head_top1(model, x_held.data(), cal.n_held_out, {}, {}, &lens_prob));
    std::vector<int64_t> held_index(held_rows.size());
    for (size_t i = 0; i < held_index.size(); ++i) held_index[i] = static_cast<int64_t>(i);
    cal.lens_agreement = agreement(lens_held, final_held, held_index);
    std::vector<int32_t> ridge_held;
    cal.adapter_agreement = -1;
    for (AffineAdapter& fit : fits) {
      std::vector<float> prob;
      HELIOS_ASSIGN_OR_RETURN(auto top1, exit_head_top1(model, x_held.data(), cal.n_held_out, fit.w, fit.b, &prob));
      const double agreed = agreement(top1, final_held, held_index);
      if (fits.size() > 1) say(opt.log, fmt("calibrate: exit %.0f: ridge %g agrees %.3f", layer, fit.ridge, agreed));
      if (agreed > cal.adapter_agreement) {
        cal.adapter_agreement = agreed;
        cal.ridge = fit.ridge;
        ridge_held = std::move(top1);
        ridge_prob = std::move(prob);
        w = std::move(fit.w);
        b = std::move(fit.b);
      }
    }
    const double adapter_s = seconds_since(t0);
    std::vector<int32_t> kept_held = lens_held;
    kept_prob = lens_prob;
    // A forced kind wins every comparison it is in and loses every other.
    auto beats = [&](const char* kind, double candidate, double incumbent) {
      if (opt.head != "best") return opt.head == kind;
      return candidate > incumbent;
    };
    double best = cal.lens_agreement;
    // Keeps the kind's head when it beats the best so far (its held-out top-1 and probabilities).
    auto consider = [&](const char* kind, double agreed, std::vector<int32_t>& held, std::vector<float>& prob) {
      if (!beats(kind, agreed, best)) return false;
      cal.kept = kind;
      best = agreed;
      kept_held = std::move(held);
      kept_prob = std::move(prob);
      return true;
    };
    consider("ridge", cal.adapter_agreement, ridge_held, ridge_prob);
    DistillOptions dopt;
    dopt.epochs = opt.distill_epochs;
    dopt.learning_rate = opt.distill_learning_rate;
    dopt.rank = opt.distill_rank;
    dopt.log = opt.log;
    std::vector<float> wd = w, bd = b;  // the distilled adapter, and the residual MLP's input
    if (opt.distill) {
      HELIOS_ASSIGN_OR_RETURN(DistillReport rep, distill_adapter(host, x_fit.data(), teacher_fit, x_held.data(),
                                                                 teacher_held, dopt, &wd, &bd));
      cal.distill_seconds = rep.seconds;
      cal.distill_kl_start = rep.held_kl_start;
      cal.distill_kl_best = rep.held_kl_best;
      std::vector<float> distilled_prob;
      HELIOS_ASSIGN_OR_RETURN(auto distilled_held,
                              exit_head_top1(model, x_held.data(), cal.n_held_out, wd, bd, &distilled_prob));
      cal.distilled_agreement = agreement(distilled_held, final_held, held_index);
      if (consider("distilled", cal.distilled_agreement, distilled_held, distilled_prob)) w = wd, b = bd;
    }
    ResidualMlp mlp;  // trained on its adapter's output; kept only when the "mlp" head is
    if (mlp_hidden > 0) {
      // Its adapter: the distilled one, or from the last FFN, a ridge fit (the penalty the exit's
      // ridge adapter kept) onto the state entering the last block.
      std::vector<float> wm = wd, bm = bd;
      if (from_last_ffn) {
        std::vector<AffineAdapter> into_last;
        HELIOS_RETURN_IF_ERROR(fit_affine_adapters(x_fit.data(), y_last_input.data(), cal.n_fit, d, {cal.ridge},
                                                   &into_last));
        wm = std::move(into_last[0].w);
        bm = std::move(into_last[0].b);
      }
      std::vector<float> a_fit, a_held;
      affine_rows(x_fit.data(), cal.n_fit, d, wm, bm, &a_fit);
      affine_rows(x_held.data(), cal.n_held_out, d, wm, bm, &a_held);
      DistillOptions mopt = dopt;
      mopt.learning_rate = opt.mlp_learning_rate;
      HELIOS_ASSIGN_OR_RETURN(DistillReport rep,
                              distill_mlp(host, a_fit.data(), teacher_fit, a_held.data(), teacher_held, mopt,
                                          mlp_hidden, &mlp, from_last_ffn ? &last_ffn : nullptr));
      cal.mlp_seconds = rep.seconds;
      cal.mlp_kl_start = rep.held_kl_start;
      cal.mlp_kl_best = rep.held_kl_best;
      cal.mlp_agreement_start = rep.held_agreement_start;
      std::vector<float> mlp_prob;
      HELIOS_ASSIGN_OR_RETURN(auto mlp_held,
                              exit_head_top1(model, x_held.data(), cal.n_held_out, wm, bm, &mlp_prob, &mlp));
      cal.mlp_agreement = agreement(mlp_held, final_held, held_index);
      if (consider("mlp", cal.mlp_agreement, mlp_held, mlp_prob)) {
        w = std::move(wm), b = std::move(bm);
      } else {
        mlp = {};
      }
    }
    cal.adapter_kept = cal.kept != "identity";
    if (!cal.adapter_kept) {
      w.clear();
      b.clear();
    }

    // The exit's threshold: how confident its top-1 must be to be the final layer's often enough.
    std::vector<uint8_t> agrees_held(held_rows.size());
    for (size_t i = 0; i < held_rows.size(); ++i) agrees_held[i] = kept_held[i] == final_held[i];
    cal.threshold = fit_exit_threshold(kept_prob, agrees_held,
                                       opt.target_agreement, std::max<int64_t>(10, cal.n_held_out / 100),
                                       &cal.coverage);

    // Probe: does the kept head agree with the final layer? Labels on the fit tokens need the
    // kept head there too.
    std::vector<float> kept_fit_prob;
    HELIOS_ASSIGN_OR_RETURN(auto kept_fit,
                            exit_head_top1(model, x_fit.data(), cal.n_fit, w, b, &kept_fit_prob, &mlp));
    const double heads_s = seconds_since(t0) - adapter_s;
    std::vector<uint8_t> label_fit(fit_rows.size());
    for (size_t i = 0; i < fit_rows.size(); ++i) label_fit[i] = kept_fit[i] == final_fit[i];
    ExitHeadParams head;
    head.layer = layer;
    head.kind = cal.kept;
    // The agreement curve: fitted on every other held-out token and checked on the rest (the
    // fit tokens would flatter a head trained on them).
    std::vector<float> curve_fit_prob;
    std::vector<uint8_t> curve_fit_agrees;
    for (int64_t i = 0; i < cal.n_held_out; i += 2) {
      curve_fit_prob.push_back(kept_prob[i]);
      curve_fit_agrees.push_back(agrees_held[i]);
    }
    fit_agreement_curve(curve_fit_prob, curve_fit_agrees, opt.curve_points, &head.curve_prob, &head.curve_agreement);
    const int64_t n_check = cal.n_held_out / 2;
    for (float t = 0.5f; t < 0.96f; t += 0.05f) {
      CurveCheck check{t, 0, 0};
      int64_t leaving = 0, agreed = 0;
      for (int64_t i = 1; i < cal.n_held_out; i += 2) {
        if (agreement_confidence(head, kept_prob[i]) < t) continue;
        ++leaving;
        agreed += agrees_held[i];
      }
      check.leaving = n_check ? static_cast<double>(leaving) / static_cast<double>(n_check) : 0.0;
      check.agreed = leaving ? static_cast<double>(agreed) / static_cast<double>(leaving) : 1.0;
      cal.curve_checks.push_back(check);
    }
    divide_rows_by_rms(x_fit.data(), cal.n_fit, d, 1e-6);  // features h / rms(h), as probe_score reads them
    HELIOS_RETURN_IF_ERROR(fit_logistic_probe(x_fit.data(), label_fit.data(), cal.n_fit, d, opt.probe_l2,
                                              opt.probe_iterations, &head.probe_weight, &head.probe_bias));
    int64_t correct = 0, agree = 0;
    for (int64_t i = 0; i < cal.n_held_out; ++i) {
      const bool label = kept_held[i] == final_held[i];
      agree += label;
      correct += (probe_score(head, x_held.data() + i * d, d) >= 0.5f) == label;
    }
    cal.probe_accuracy = static_cast<double>(correct) / static_cast<double>(cal.n_held_out);
    cal.base_rate = static_cast<double>(agree) / static_cast<double>(cal.n_held_out);

    head.adapter_weight = std::move(w);
    head.adapter_bias = std::move(b);
    head.mlp = std::move(mlp);
    head.agreement = static_cast<float>(best);
    head.probe_accuracy = static_cast<float>(cal.probe_accuracy);
    head.threshold = static_cast<float>(cal.threshold);
    head.n_tokens = n;
    result.heads.heads.push_back(std::move(head));
    result.exits.push_back(cal);
    say(opt.log, fmt("calibrate: exit %.0f: logit lens %.3f, ridge %.3f (penalty %g)", layer, cal.lens_agreement,
                     cal.adapter_agreement, cal.ridge) +
                     fmt(", probe %.3f", cal.probe_accuracy) +
                     (opt.distill ? fmt(", distilled %.3f", cal.distilled_agreement) : std::string()) +
                     (mlp_hidden > 0 ? fmt(", mlp %.3f (from %.3f)", cal.mlp_agreement, cal.mlp_agreement_start) : std::string()) +
                     fmt(", threshold %.3f covering %.3f", cal.threshold, cal.coverage) + " (" + cal.kept + " kept" +
                     fmt("; %.1f s: ridge %.1f, distill %.1f", seconds_since(t0), adapter_s, cal.distill_seconds) +
                     fmt(", mlp %.1f, probe %.1f)", cal.mlp_seconds, seconds_since(t0) - adapter_s - heads_s));
  }
  return result;
}

HiddenStates lookahead_states(const HiddenStates& data) {
  const int32_t d = data.n_embd, n_layer = data.layers.back();
  const std::vector<float>& last = data.states.back();
  HiddenStates out;
  out.n_embd = d;
  out.layers = {n_layer, n_layer};
  out.states.assign(2, {});
  for (int64_t i = 0; i + 1 < data.n_tokens(); ++i) {
    if (data.sequence[i] != data.sequence[i + 1]) continue;
    out.states[0].insert(out.states[0].end(), last.begin() + i * d, last.begin() + (i + 1) * d);
    out.states[1].insert(out.states[1].end(), last.begin() + (i + 1) * d, last.begin() + (i + 2) * d);
    out.final_top1.push_back(data.final_top1[i + 1]);
    out.sequence.push_back(data.sequence[i]);
    if (!data.tokens.empty()) out.tokens.push_back(data.tokens[i + 1]);
  }
  return out;
}

StatusOr<CalibrationResult> fit_lookahead_head(Model& model, const HiddenStates& data, CalibrationOptions options) {
  const ModelConfig& c = model.config();
  const int32_t d = c.n_embd;
  if (data.layers.empty() || data.layers.back() != c.n_layer || data.tokens.size() != data.final_top1.size()) {
    return invalid_argument("a lookahead head needs the last layer's states and the tokens (collect_hidden_states)");
  }
  // The last FFN is no start for a head that reads the state after it.
  if (options.mlp_init == "last-ffn") options.mlp_init = "random", options.mlp_hidden = 0;
  if (options.head == "mlp" && options.mlp_hidden == 0) options.head = "best";
  say(options.log, "calibrate: lookahead head: from the last layer's state at t and the token at t + 1, the model's "
                   "distribution at t + 1 as its target");
  const auto t0 = Clock::now();
  HiddenStates pairs = lookahead_states(data);
  const int64_t n = pairs.n_tokens();
  const int32_t k = options.held_out_every;
  if (n < 2 * k || k < 2) return invalid_argument("too few calibration tokens for a lookahead head (" + std::to_string(n) + " pairs)");
  HELIOS_ASSIGN_OR_RETURN(std::vector<float> e, model.embed(pairs.tokens.data(), static_cast<int32_t>(n)));

  // The ridge map's input [h, s e]: s brings the embeddings to the states' scale, so that one
  // penalty suits both halves (U is stored times s).
  std::vector<float> h_rms, e_rms;
  std::vector<float> h_normed = pairs.states[0], e_normed = e;
  divide_rows_by_rms(h_normed.data(), n, d, c.rms_eps, &h_rms);
  divide_rows_by_rms(e_normed.data(), n, d, c.rms_eps, &e_rms);
  std::nth_element(h_rms.begin(), h_rms.begin() + n / 2, h_rms.end());
  std::nth_element(e_rms.begin(), e_rms.begin() + n / 2, e_rms.end());
  const float scale = e_rms[n / 2] > 0 ? h_rms[n / 2] / e_rms[n / 2] : 1.0f;
  // Fit rows as fit_exit_heads splits them (whole sequences held out).
  const int32_t n_sequences = pairs.sequence.empty() ? 0 : pairs.sequence.back() + 1;
  std::vector<float> x_fit, y_fit;
  for (int64_t i = 0; i < n; ++i) {
    const bool held = n_sequences >= k ? pairs.sequence[i] % k == k - 1 : i % k == k - 1;
    if (held) continue;
    const float* h = pairs.states[0].data() + i * d;
    const float* ei = e.data() + i * d;
    x_fit.insert(x_fit.end(), h, h + d);
    for (int32_t j = 0; j < d; ++j) x_fit.push_back(scale * ei[j]);
    y_fit.insert(y_fit.end(), pairs.states[1].begin() + i * d, pairs.states[1].begin() + (i + 1) * d);
  }
  const int64_t n_fit = static_cast<int64_t>(y_fit.size()) / d;
  divide_rows_by_rms(y_fit.data(), n_fit, d, c.rms_eps);
  std::vector<AffineAdapter> maps;
  HELIOS_RETURN_IF_ERROR(fit_affine_maps(x_fit.data(), 2 * d, y_fit.data(), d, n_fit, {1e-4f}, &maps));
  x_fit = {};
  // W [d, d] and U [d, d] out of the [d, 2d] map.
  const AffineAdapter& map = maps[0];
  std::vector<float> w(static_cast<size_t>(d) * d), u(static_cast<size_t>(d) * d);
  for (int32_t o = 0; o < d; ++o) {
    const float* row = map.w.data() + static_cast<size_t>(o) * 2 * d;
    std::copy_n(row, d, w.data() + static_cast<size_t>(o) * d);
    for (int32_t j = 0; j < d; ++j) u[static_cast<size_t>(o) * d + j] = row[d + j] * scale;
  }
  say(options.log, fmt("calibrate: lookahead head: ridge map of state and token (embeddings x %.1f) in %.1f s", scale,
                       seconds_since(t0)));

  // What an exit gets, on a = W h + U e + b as its "state".
  HiddenStates on_map = pairs;
  affine_rows(pairs.states[0].data(), n, d, w, map.b, &on_map.states[0]);
  std::vector<float> ue;
  affine_rows(e.data(), n, d, u, std::vector<float>(d, 0.0f), &ue);
  for (size_t i = 0; i < ue.size(); ++i) on_map.states[0][i] += ue[i];
  HELIOS_ASSIGN_OR_RETURN(CalibrationResult r, fit_exit_heads(model, on_map, options));
  ExitHeadParams& head = r.heads.heads.at(0);
  ExitCalibration& cal = r.exits.at(0);
  // Fold the exit's adapter (W2, b2) into the map: W2 (W h + U e + b) + b2.
  if (head.adapter_weight.empty()) {
    head.adapter_weight = std::move(w);
    head.adapter_bias = map.b;
    head.token_weight = std::move(u);
  } else {
    const std::vector<float>& w2 = head.adapter_weight;
    std::vector<float> w_out(static_cast<size_t>(d) * d), u_out(static_cast<size_t>(d) * d), b_out;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0f, w2.data(), d, w.data(), d, 0.0f,
                w_out.data(), d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0f, w2.data(), d, u.data(), d, 0.0f,
                u_out.data(), d);
    affine_rows(map.b.data(), 1, d, w2, head.adapter_bias, &b_out);
    head.adapter_weight = std::move(w_out);
    head.adapter_bias = std::move(b_out);
    head.token_weight = std::move(u_out);
  }
  head.probe_weight.clear();  // fitted on a, not on h: drafting reads top-1 probabilities only
  head.probe_bias = 0;
  if (cal.kept == "identity") cal.kept = "ridge";
  // The table's columns for this row: the model's own head at t, and the better ridge map.
  std::vector<int64_t> held;
  std::vector<int32_t> held_top1;
  std::vector<float> h_held;
  for (int64_t i = 0; i < n; ++i) {
    if (n_sequences >= k ? pairs.sequence[i] % k == k - 1 : i % k == k - 1) {
      held.push_back(static_cast<int64_t>(held_top1.size()));
      held_top1.push_back(pairs.final_top1[i]);
      h_held.insert(h_held.end(), pairs.states[0].begin() + i * d, pairs.states[0].begin() + (i + 1) * d);
    }
  }
  HELIOS_ASSIGN_OR_RETURN(auto own, exit_head_top1(model, h_held.data(), static_cast<int64_t>(held.size()), {}, {}));
  cal.adapter_agreement = std::max(cal.adapter_agreement, cal.lens_agreement);
  cal.lens_agreement = agreement(own, held_top1, held);
  cal.lookahead = true;
  cal.probe_accuracy = 0;
  return r;
}

std::string calibration_table(const CalibrationResult& result) {
  std::string out =
      "| layer | logit-lens agreement | ridge agreement | distilled agreement | mlp agreement | head kept "
      "| probe accuracy | base rate | threshold | coverage | agreement ≥ 0.9: agreed / leaving |\n"
      "|---:|---:|---:|---:|---:|:---|---:|---:|---:|---:|---:|\n";
  char line[320];
  for (const ExitCalibration& e : result.exits) {
    char distilled[32] = "-";
    if (e.distilled_agreement >= 0) std::snprintf(distilled, sizeof distilled, "%.1f%%", 100 * e.distilled_agreement);
    char mlp[32] = "-";
    if (e.mlp_agreement >= 0) std::snprintf(mlp, sizeof mlp, "%.1f%%", 100 * e.mlp_agreement);
    char curve[48] = "-";
    for (const CurveCheck& c : e.curve_checks) {
      if (std::fabs(c.threshold - 0.9f) < 1e-3f) {
        std::snprintf(curve, sizeof curve, "%.1f%% / %.1f%%", 100 * c.agreed, 100 * c.leaving);
      }
    }
    const std::string layer = std::to_string(e.layer) + (e.lookahead ? " (lookahead: t + 2)" : "");
    std::snprintf(line, sizeof line, "| %s | %.1f%% | %.1f%% | %s | %s | %s | %.1f%% | %.1f%% | %.3f | %.1f%% | %s |\n",
                  layer.c_str(), 100 * e.lens_agreement, 100 * e.adapter_agreement, distilled, mlp, e.kept.c_str(),
                  100 * e.probe_accuracy, 100 * e.base_rate, e.threshold, 100 * e.coverage, curve);
    out += line;
  }
  return out;
}

}  // namespace helios
