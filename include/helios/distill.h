// Trained exit heads: an exit's affine adapter fitted by distillation, so that the exit's
// next-token distribution lm_head(final_norm(W h_k + b)) comes close to the last layer's, with the
// backbone, the final norm and the LM head frozen.
//
// The loss is the KL divergence from the last layer's distribution p to the exit's q, kept sparse
// on the teacher's side: over the teacher's top-k tokens (the mass the rest holds is small and
// reported), with the exit's exact log-normaliser over the whole vocabulary:
//   L = sum_{i in topk} p_i (log p_i - z_i + logsumexp(z)),   dL/dz = (sum_topk p) softmax(z) - p.
// It runs on the host in f32 with BLAS, mini-batch Adam from the ridge solution, the teacher's
// targets computed once. What is trained is a low-rank-plus-diagonal change to that solution,
// W = W_ridge + diag(delta) + A B (rank 32 by default): with a few thousand calibration tokens a
// full d x d update memorises them (held-out KL stalls while the fit KL keeps falling). The epoch
// with the best held-out loss is the result.
//
// An affine map in front of the final norm saturates (more text stops helping), so an exit may
// also get a residual SwiGLU MLP after its distilled adapter, trained the same way with the adapter
// frozen (distill_mlp): EE-Tuning's MLP exit, started from the adapter's head (down = 0).
#pragma once

#include <cstdint>
#include <vector>

#include "helios/calibrate.h"

namespace helios {

// The model's final norm and LM head as host f32 (the LM head dequantized row by row).
struct HostHead {
  int32_t n_vocab = 0, n_embd = 0;
  float rms_eps = 0;
  std::vector<float> lm_head;  // [n_vocab, n_embd]
  std::vector<float> norm;     // [n_embd]
};
// FAILED_PRECONDITION on a backend whose weights are not host memory (calibrate on the CPU).
StatusOr<HostHead> host_head(const Model& model);

// out [rows, d] = x W^T + b for rows x [rows, d]; x itself with an empty w (the identity adapter).
void affine_rows(const float* x, int64_t rows, int32_t d, const std::vector<float>& w, const std::vector<float>& b,
                 std::vector<float>* out);

// The teacher's top-k tokens and probabilities per row, from the last layer's states.
struct TeacherTargets {
  int32_t k = 0;
  std::vector<int32_t> ids;  // [n, k], most likely first
  std::vector<float> probs;  // [n, k]
  int64_t n_rows() const { return k ? static_cast<int64_t>(ids.size()) / k : 0; }
};
TeacherTargets teacher_targets(const HostHead& head, const float* h_last, int64_t n_rows, int32_t k);

struct DistillOptions {
  int32_t epochs = 6;
  int32_t batch_rows = 64;
  float learning_rate = 2e-4f;  // Adam
  int32_t rank = 32;            // W = W_start + diag + rank-r product; 0 trains the whole W
  uint64_t seed = 1;            // the order of the mini-batches
  ProgressLog log;
};

struct DistillReport {
  double seconds = 0;
  int32_t steps = 0, best_step = 0;
  double held_kl_start = 0, held_kl_best = 0;        // mean sparse KL (nats) on the held-out rows
  double held_agreement_start = 0, held_agreement_best = 0;  // exit top-1 == teacher top-1
  double teacher_mass = 0;                           // mean share of p in the top-k
};

// Mean sparse KL and top-1 agreement of the head (w, b; empty w = identity) on rows x.
struct HeadFit {
  double kl = 0, agreement = 0;
};
// With `mlp`, the residual MLP follows the adapter.
HeadFit evaluate_head(const HostHead& head, const float* x, const TeacherTargets& t, const std::vector<float>& w,
                      const std::vector<float>& b, const ResidualMlp* mlp = nullptr);

// The mean sparse KL of `rows` rows x [rows, n_embd] against targets t.row(target_rows[i]), and its
// gradient with respect to w (written to gw, [n_embd, n_embd]) and b (gb, [n_embd]).
double adapter_loss_grad(const HostHead& head, const float* x, const TeacherTargets& t, const int64_t* target_rows,
                         int32_t rows, const std::vector<float>& w, const std::vector<float>& b, std::vector<float>* gw,
                         std::vector<float>* gb);

// The mean sparse KL of `rows` rows a [rows, n_embd] (the adapter's output) through the residual
// MLP and the head, and its gradient with respect to the MLP's weights (written to `grad`).
double mlp_loss_grad(const HostHead& head, const float* a, const TeacherTargets& t, const int64_t* target_rows,
                     int32_t rows, const ResidualMlp& mlp, ResidualMlp* grad);

// Trains w [n_embd, n_embd] (out, in) and b [n_embd] in place from their current values.
StatusOr<DistillReport> distill_adapter(const HostHead& head, const float* x_fit, const TeacherTargets& t_fit,
                                        const float* x_held, const TeacherTargets& t_held,
                                        const DistillOptions& options, std::vector<float>* w, std::vector<float>* b);

// Trains a residual MLP of `hidden` units after a frozen adapter, from rows a = W h + b: gate and up
// start random and down at zero, so the head starts as the adapter's (EE-Tuning's MLP exit, with
// the backbone and the adapter frozen). Its cost per step is the LM head's, as distill_adapter's.
// With `start`, it starts from that MLP instead (its width is `hidden`), e.g. the model's last FFN.
StatusOr<DistillReport> distill_mlp(const HostHead& head, const float* a_fit, const TeacherTargets& t_fit,
                                    const float* a_held, const TeacherTargets& t_held, const DistillOptions& options,
                                    int32_t hidden, ResidualMlp* mlp, const ResidualMlp* start = nullptr);

// The model's last FFN as a residual MLP on rows a = h / c, where h is the state entering the last
// block and c its typical RMS: down(silu(gate(n)) * up(n)) with n = a / rms(a), the FFN norm's weight
// folded into gate and up, down divided by c. Exact for rows whose RMS is c: the last block without
// its attention, up to the final norm's scale. Host f32 (FAILED_PRECONDITION off the cpu backend).
StatusOr<ResidualMlp> last_ffn_mlp(const Model& model, float c);

}  // namespace helios
