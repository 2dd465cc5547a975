// Early exit: where tokens may leave the layer stack, how confident they must be to leave, and
// the exit heads that turn an intermediate hidden state into logits.
//
// An exit at layer k (1-based: after k blocks) computes lm_head(final_norm(a_k(h_k))), where a_k
// is the identity (the logit lens) or an affine adapter fitted by `helios calibrate`. Deciding
// whether a token leaves uses a confidence measure: a softmax statistic of those logits (costs
// one LM-head pass per check), or a cheap signal of h_k alone (the calibrated probe, or the
// saturation cos(h_k, h_{k-1})), after which the LM head runs only for the tokens that leave.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "helios/model_config.h"
#include "helios/status.h"

namespace helios {

enum class ExitPolicy {
  kFull,             // no exit: every token runs every loaded layer
  kPerToken,         // each token leaves at its first confident exit
  kBatchSync,        // the batch runs on until every sequence is confident, then all leave
  kFixedDepth,       // every token leaves at layer `depth` (the loaded depth); confidence is reported
  kSelfSpeculative,  // draft with the exit at `depth`, verify with the full model: output as kFull
};

enum class ConfidenceMeasure {
  kTop1Prob,    // softmax probability of the top token
  kMargin,      // top-1 minus top-2 probability
  kEntropy,     // 1 - H(p) / log(n_vocab): 1 for a one-hot distribution, 0 for a uniform one
  kProbe,       // the calibrated logistic probe on h_k (cheap)
  kSaturation,  // cos(h_k, h_{k-1}) (cheap)
  kAgreement,   // top-1 probability through the exit's agreement curve: the share of calibration
                // tokens at or above it whose top-1 was the last layer's (from `helios calibrate`)
};

// Every policy and measure, in the order help texts and errors list them.
inline constexpr ExitPolicy kExitPolicies[] = {ExitPolicy::kFull, ExitPolicy::kPerToken, ExitPolicy::kBatchSync,
                                               ExitPolicy::kFixedDepth, ExitPolicy::kSelfSpeculative};
inline constexpr ConfidenceMeasure kConfidenceMeasures[] = {
    ConfidenceMeasure::kTop1Prob, ConfidenceMeasure::kMargin, ConfidenceMeasure::kEntropy,
    ConfidenceMeasure::kProbe, ConfidenceMeasure::kSaturation, ConfidenceMeasure::kAgreement};
inline constexpr int32_t kMaxDraftTokens = 16;  // self-speculative tokens drafted per verification

// What each policy does, in one table: the forward pass, the engine, the config and the server
// ask these instead of testing policies by name.
struct ExitPolicyTraits {
  ExitPolicy policy;
  const char* name;             // "full", "per-token", ...: config, API and CLI spelling
  bool leaves_when_confident;   // a row leaves at an exit once its confidence reaches the threshold
  bool leaves_together;         // ... but only when every such row of the batch is confident
  bool leaves_at_depth;         // every row leaves at `depth`, confident or not
  bool uses_depth;              // reads ExitRule::depth (the exit, or the draft exit)
  bool needs_exit_points;       // cannot run on a model without exit points
  bool fills_deeper_kv;         // deeper layers get a leaving token's K/V from its exit state
  bool drafts;                  // self-speculative rounds: draft at `depth`, verify with the full model
};
const ExitPolicyTraits& exit_policy_traits(ExitPolicy policy);

const char* exit_policy_name(ExitPolicy policy);  // "full", "per-token", "batch-sync", ...
std::string exit_policy_names();                  // "full, per-token, ...": what errors offer
std::string confidence_measure_names();
// INVALID_ARGUMENT listing the valid names.
StatusOr<ExitPolicy> parse_exit_policy(const std::string& name);
const char* confidence_measure_name(ConfidenceMeasure measure);  // "top1", "margin", "entropy", "probe", "saturation"
StatusOr<ConfidenceMeasure> parse_confidence_measure(const std::string& name);
// Probe and saturation: decided from h_k without an LM-head pass.
bool is_cheap_measure(ConfidenceMeasure measure);

// Confident enough at `threshold`? (0: always; 1 or more: never, even at probability 1)
inline bool meets_threshold(float confidence, float threshold) { return threshold < 1.0f && confidence >= threshold; }

// How one sequence's tokens leave the stack.
struct ExitRule {
  ExitPolicy policy = ExitPolicy::kFull;
  ConfidenceMeasure measure = ConfidenceMeasure::kTop1Prob;
  float threshold = 0.9f;    // leave when confidence >= threshold; >= 1 never leaves early
  int32_t depth = 0;         // fixed-depth: the exit layer; self-speculative: the draft exit layer
  int32_t draft_tokens = 4;  // self-speculative: tokens drafted per verification
  // self-speculative: drafts are chosen among the first draft_vocab token ids (the LM head's
  // first rows, a cheaper draft head: byte-level BPE numbers tokens roughly by frequency); 0 =
  // the whole vocabulary. A multiple of 64; the output stays full's either way.
  int32_t draft_vocab = 0;
  // Use the thresholds `helios calibrate` fitted per exit (top-1 measure) where it fitted one.
  bool calibrated_thresholds = false;
  // Per exit layer, overriding `threshold` there (Model::resolve_exit_rule fills the calibrated ones).
  std::vector<std::pair<int32_t, float>> exit_thresholds;

  float threshold_at(int32_t layer) const {
    for (const auto& [l, t] : exit_thresholds) {
      if (l == layer) return t;
    }
    return threshold;
  }
  // Confident enough to leave at `layer`? (threshold 0: always; threshold >= 1: never)
  bool confident(int32_t layer, float confidence) const { return meets_threshold(confidence, threshold_at(layer)); }
};

// --- The exit decision at one exit point (pure: the forward pass computes the confidences)
enum class ExitCheck {
  kNone,        // the row does not leave here
  kConfidence,  // the row leaves if confident: its confidence must be computed
  kForced,      // the row leaves here whatever its confidence (fixed-depth at its depth)
};
// How a row under `rule` is checked after `layer` blocks (an exit point).
ExitCheck exit_check_at(const ExitRule& rule, int32_t layer);
// One logit row at an exit point: its rule, and its confidence where exit_check_at() asks for one.
struct ExitRow {
  const ExitRule* rule = nullptr;
  float confidence = 0;
};
// Which rows leave after `layer` blocks, given every active logit row of the batch: per-token
// rows alone when confident, batch-sync rows together when all of them are (a batch-sync row that
// cannot leave here holds the others back), fixed-depth rows at their depth.
std::vector<uint8_t> decide_exits(int32_t layer, const std::vector<ExitRow>& rows);

// Where exits are: an explicit list of layers, or every `every`-th layer from `min_layer`.
struct ExitPointsSpec {
  std::vector<int32_t> layers;
  int32_t every = 0;
  int32_t min_layer = 1;
};
// Sorted, unique exit layers in [1, n_layers - 1] (layer n_layers is the model's own head).
// INVALID_ARGUMENT naming a layer out of range.
StatusOr<std::vector<int32_t>> resolve_exit_points(const ExitPointsSpec& spec, int32_t n_layers);

// What an exit head said about a row in observe mode (ForwardBatch::observe_exits). Here rather
// than in model.h so the output path (output.h) can carry it without the model.
struct ExitObservation {
  int32_t top1 = -1;  // -1: the row had left before this exit
  float top1_prob = 0;
};

// Softmax statistics of one row of logits.
struct ConfidenceStats {
  int32_t top1 = 0;
  float top1_prob = 0;
  float margin = 0;   // top-1 minus top-2 probability
  float entropy = 0;  // nats
};
ConfidenceStats confidence_stats(const float* logits, int32_t n_vocab);
// The value compared with the threshold, for the softmax measures (top1, margin, entropy).
float confidence_value(const ConfidenceStats& stats, ConfidenceMeasure measure, int32_t n_vocab);

// The fitted parameters of one exit, in host memory.
// A residual SwiGLU block an exit head may add after its adapter: the capacity an affine map lacks
// to stand in for the layers it skips. Weights row-major (out, in).
struct ResidualMlp {
  int32_t hidden = 0;                // 0: no MLP
  std::vector<float> gate, up;       // [hidden, n_embd]
  std::vector<float> down;           // [n_embd, hidden]
  bool empty() const { return hidden == 0; }
};

struct ExitHeadParams {
  int32_t layer = 0;                  // reads the hidden state after this many blocks
  std::vector<float> adapter_weight;  // [n_embd, n_embd] row-major (out, in); empty: identity
  std::vector<float> adapter_bias;    // [n_embd]; empty with the identity
  // A lookahead head's map of the next token's embedding (the token its row's logits chose),
  // added to the adapter's output: a = W h + U e(token) + b. [n_embd, n_embd] (out, in); empty: none.
  std::vector<float> token_weight;
  // After the adapter, optionally, a trained residual MLP (kind "mlp"): a += down(silu(gate(n)) * up(n))
  // with n = a / rms(a). Hidden width 0: none.
  ResidualMlp mlp;
  std::vector<float> probe_weight;    // [n_embd], on h_k / rms(h_k); empty: no probe
  float probe_bias = 0;
  // The smallest top-1 probability above which this exit's top-1 was the final layer's on at least
  // the calibration's target share of held-out tokens; 1 when no threshold reaches it, 0 when
  // not calibrated.
  float threshold = 0;
  // The agreement curve (the kAgreement measure): top-1 probabilities, ascending, and for each the
  // share of calibration tokens with a top-1 probability at least that high whose top-1 was the
  // last layer's, made non-decreasing (so a threshold t on it lets through tokens of which at least
  // t agreed). Empty when not calibrated.
  std::vector<float> curve_prob, curve_agreement;
  std::string kind = "identity";  // how the head was fitted: identity, ridge, distilled, mlp
  // Calibration summary, for display.
  float agreement = 0;       // exit top-1 == final top-1, over the calibration tokens
  float probe_accuracy = 0;  // on the held-out calibration tokens
  int64_t n_tokens = 0;      // calibration tokens seen
};

// The exit heads of one model: the sidecar GGUF `helios calibrate` writes.
struct ExitHeadSet {
  std::string model_name;  // general.name of the model they were fitted on
  int32_t n_layer = 0;
  int32_t n_embd = 0;
  std::vector<ExitHeadParams> heads;  // by layer, ascending
  // A lookahead head (`helios calibrate --lookahead`): from the last layer's state at position t
  // and the token chosen there (the input at t + 1, through its token_weight) it guesses the token
  // after that one — a draft the next full pass verifies (self-speculative at the model's depth).
  // Its layer is n_layer; none when `has_lookahead` is false.
  bool has_lookahead = false;
  ExitHeadParams lookahead;

  const ExitHeadParams* find(int32_t layer) const;  // nullptr when there is none
};

Status save_exit_heads(const ExitHeadSet& set, const std::string& path);
// Checks the sidecar against the model (n_layer, n_embd); errors name the file and what differs.
StatusOr<ExitHeadSet> load_exit_heads(const std::string& path, const ModelConfig& config);

// sigmoid(w · h / rms(h) + b); 0 when the head has no probe.
float probe_score(const ExitHeadParams& head, const float* hidden, int32_t n_embd);
// top1_prob through the head's agreement curve (linear between its points, flat beyond them);
// top1_prob itself when the head has no curve.
float agreement_confidence(const ExitHeadParams& head, float top1_prob);
// The agreement curve of (top-1 probability, agreed) pairs: at most `points` points at quantiles
// of the probabilities, each the share of pairs at or above it that agreed, then made
// non-decreasing from the top down (min over higher points), so it never overstates.
void fit_agreement_curve(const std::vector<float>& top1_prob, const std::vector<uint8_t>& agrees, int32_t points,
                         std::vector<float>* curve_prob, std::vector<float>* curve_agreement);
float cosine_similarity(const float* a, const float* b, int32_t n);

// --- Fitting (calibration)
// W, b minimising sum_i |W x_i + b - y_i|^2 + ridge * u |W|^2 (b unpenalised), u = trace(Xc^T Xc) / d
// (n times the inputs' mean variance, so that a ridge means the same at any token count and any
// scale of the states). x, y: [n, d]. w: [d, d] row-major (out, in); b: [d].
Status fit_affine_adapter(const float* x, const float* y, int64_t n, int32_t d, float ridge,
                          std::vector<float>* w, std::vector<float>* b);
// The same for several penalties at the cost of one pass over the data (a solve per penalty); a
// penalty too small for the inputs' collinearity is left out, INVALID_ARGUMENT when all are.
struct AffineAdapter {
  float ridge = 0;
  std::vector<float> w, b;
};
Status fit_affine_adapters(const float* x, const float* y, int64_t n, int32_t d, const std::vector<float>& ridges,
                           std::vector<AffineAdapter>* out);
// The same from x [n, d_in] to y [n, d_out]: each w is [d_out, d_in] (out, in), b [d_out].
Status fit_affine_maps(const float* x, int32_t d_in, const float* y, int32_t d_out, int64_t n,
                       const std::vector<float>& ridges, std::vector<AffineAdapter>* out);
// Logistic regression: minimises mean log-loss + l2/2 |w|^2 (b unpenalised) on features
// x: [n, d] and labels 0/1; w: [d]. At most `iterations` Newton steps.
Status fit_logistic_probe(const float* x, const uint8_t* labels, int64_t n, int32_t d, float l2,
                          int32_t iterations, std::vector<float>* w, float* b);

}  // namespace helios
