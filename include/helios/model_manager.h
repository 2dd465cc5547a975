// The Helios model manager's decisions (the Helios paper, Algorithm 1), apart from any engine:
// which candidates a group evaluates, what it records about them (the Performance History Table),
// which one it serves and at what loaded depth, when a run of low-confidence tokens makes it
// extend that depth or switch model, and when it evaluates again. Pure and deterministic: the
// server's ModelGroup feeds it what the engines did and carries out what it decides.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "helios/status.h"

namespace helios {

// What a group optimises when it ranks candidates (groups[].slo).
enum class SloMode {
  kThroughput,  // generated tokens per second of decoding
  kLatency,     // mean TTFT + mean TPOT × 32 (a short answer's wait)
  kAccuracy,    // the perplexity of what the candidate generated, lower is better
  kEnergy,      // estimated joules per generated token (estimate_joules_per_token)
};
const char* slo_mode_name(SloMode mode);

// What the repository says about a model (model_repository[].telemetry); 0 = not known.
struct ModelTelemetry {
  double throughput_tok_s = 0;
  double perplexity = 0;
  int64_t memory_bytes = 0;
};

// A model's weight bytes: the part every prefix needs (embeddings, final norm, LM head) and each
// layer's, from its GGUF file's tensor table (model_footprint in src/manager/).
struct ModelFootprint {
  int64_t shared_bytes = 0, shared_params = 0;
  std::vector<int64_t> layer_bytes, layer_params;  // [n_layers]

  int32_t n_layers() const { return static_cast<int32_t>(layer_bytes.size()); }
  int64_t bytes_at_depth(int32_t depth) const;  // shared + layers 1..depth
  int64_t params_at_depth(int32_t depth) const;
  int64_t total_bytes() const { return bytes_at_depth(n_layers()); }
};
StatusOr<ModelFootprint> model_footprint(const std::string& gguf_path);

// "" when the two GGUF files carry the same tokenizer (model type and every token), else what
// differs, naming both files.
StatusOr<std::string> tokenizer_difference(const std::string& gguf_a, const std::string& gguf_b);

// One model of the repository as the manager sees it.
struct CandidateModel {
  std::string name;
  ModelFootprint footprint;
  std::vector<int32_t> exits;    // exit points, ascending, each below n_layers
  ModelTelemetry telemetry;
  int64_t kv_bytes_per_token = 0;  // K and V of every layer, for one token (all layers loaded)
};

// Energy of one generated token, estimated from what it moves and computes: every weight byte of
// the loaded prefix is read once per decode step (shared by the batch) and each weight is two
// FLOPs per token. Horowitz (ISSCC 2014, 45 nm): a 64-bit DRAM read ≈ 1.3–2.6 nJ, so 250 pJ per
// byte; a 32-bit float multiply-add ≈ 4.6 pJ, so 2.3 pJ per FLOP. J/token = (bytes / batch) ×
// 250e-12 + flops × 2.3e-12. A relative measure for ranking, not a power reading.
double estimate_joules_per_token(int64_t weight_bytes, int64_t n_weights, double batch_size);

// Step 1: the Top-K candidates of `repository` for the SLO whose full weights fit `memory_budget`
// with room for one `min_kv_tokens`-token sequence, ranked by their telemetry (unknown telemetry
// ranks last, in repository order). INVALID_ARGUMENT naming the budget when none fits.
StatusOr<std::vector<size_t>> select_candidates(const std::vector<CandidateModel>& repository, SloMode slo,
                                                int32_t top_k, int64_t memory_budget, int32_t min_kv_tokens);

// One finished request as the manager records it.
struct RequestRecord {
  int32_t completion_tokens = 0;
  double ttft_s = 0;       // submit → first token
  double decode_s = 0;     // first token → last token
  double sum_logprob = 0;  // of the generated tokens under the serving model (self-perplexity)
  // Per generated token, per exit point of the candidate (ascending, below its loaded depth): the
  // confidence there (observe mode); empty when not observed.
  std::vector<std::vector<float>> exit_confidence;
};

// A row of the Performance History Table: one model at one loaded depth.
struct PhtRow {
  std::string model;
  int32_t depth = 0;               // loaded layers
  int64_t weight_bytes = 0;        // resident at that depth
  int64_t n_weights = 0;           // parameters at that depth (the energy estimate's FLOPs)
  int64_t requests = 0, tokens = 0;
  double ttft_sum_s = 0, decode_s = 0, sum_logprob = 0;
  int64_t decode_tokens = 0;       // tokens after each request's first
  double batch_sum = 0;            // running sequences seen per token (energy shares the read)
  // The exit profile: observed tokens, and per exit point those that would have left there or
  // earlier (confidence >= the group's threshold at some exit <= it).
  std::vector<int32_t> exits;
  int64_t observed_tokens = 0;
  std::vector<int64_t> leave_by_exit;

  double throughput_tok_s() const { return decode_s > 0 ? decode_tokens / decode_s : 0; }
  double mean_ttft_s() const { return requests > 0 ? ttft_sum_s / requests : 0; }
  double mean_tpot_s() const { return decode_tokens > 0 ? decode_s / decode_tokens : 0; }
  double perplexity() const;       // exp(-mean logprob); 0 with no tokens
  double joules_per_token() const;
  // Share of observed tokens that leave at or before `exit` (0 when none observed).
  double leave_share(int32_t exit) const;
};

class PerformanceHistory {
 public:
  PhtRow& row(const std::string& model, int32_t depth);  // created empty on first use
  const PhtRow* find(const std::string& model, int32_t depth) const;
  const std::vector<PhtRow>& rows() const { return rows_; }
  // Adds a finished request; `threshold` decides which observed confidences would have left.
  void record(const std::string& model, int32_t depth, const RequestRecord& r, float threshold, double batch_size);

 private:
  std::vector<PhtRow> rows_;
};

// Higher is better for `slo`; rows without decoded tokens score lowest.
double slo_score(const PhtRow& row, SloMode slo);

// Step 3: the loaded depth for a model from its profile: the shallowest exit point that at least
// `coverage` of the observed tokens would have left by, else all `n_layers`.
int32_t choose_depth(const PhtRow& full_depth_row, int32_t n_layers, double coverage);

// Step 4: confidence breaches among the group's last `window` generated tokens.
class BreachCounter {
 public:
  BreachCounter(int32_t window, int32_t max_breaches) : window_(window), max_(max_breaches) {}
  // One generated token; true when the breaches in the window now exceed the maximum.
  bool add(bool breach);
  void reset();
  int32_t breaches() const { return breaches_; }
  int32_t window() const { return window_; }
  int32_t max_breaches() const { return max_; }
  int32_t tokens_seen() const { return static_cast<int32_t>(recent_.size()); }

 private:
  int32_t window_, max_;
  std::deque<uint8_t> recent_;
  int32_t breaches_ = 0;
};

// The group's parameters (groups[] in the config).
struct ManagerParams {
  SloMode slo = SloMode::kThroughput;
  int32_t evaluation_requests = 5;  // per candidate, step 2
  float threshold = 0.9f;           // a token is confident at an exit when its confidence >= this
  double prefix_coverage = 0.74;    // step 3: the share of tokens the loaded prefix must serve
  int32_t cbc_window = 100;
  int32_t cbc_max = 50;
  int32_t reassess_every = 150;     // RI: requests between evaluations
};

// What the group serves now, and where a request goes.
struct ServingTarget {
  size_t candidate = 0;
  int32_t depth = 0;     // loaded layers
  bool observe = false;  // evaluation: full depth with every exit's confidence recorded
  bool operator==(const ServingTarget& o) const {
    return candidate == o.candidate && depth == o.depth && observe == o.observe;
  }
};

enum class DecisionKind { kEvaluate, kChoose, kExtend, kSwitch, kReassess };
const char* decision_kind_name(DecisionKind kind);

struct Decision {
  DecisionKind kind = DecisionKind::kEvaluate;
  ServingTarget target;   // what new requests go to from now on
  std::string reason;     // the numbers behind it, for the log and status
};

// Algorithm 1 as a state machine. Requests are routed as they arrive (route), their tokens and
// ends are reported (on_token, on_finished); each returns the decision it led to, if any.
class ModelManager {
 public:
  // `candidates` are the selected ones (select_candidates), in rank order; not empty.
  ModelManager(std::vector<CandidateModel> candidates, ManagerParams params);

  // Where the next request goes (and counts it). During evaluation the first evaluation_requests
  // go to the first candidate at full depth, the next to the second, ...; requests that arrive
  // after the last evaluation request but before its results stay on the last candidate.
  std::pair<ServingTarget, std::optional<Decision>> route();
  // A token generated by a request that `target` served, with its confidence at the loaded depth.
  // Breaches count only for the current serving target outside evaluation.
  std::optional<Decision> on_token(const ServingTarget& target, float confidence, double batch_size);
  // A request that `target` served finished.
  std::optional<Decision> on_finished(const ServingTarget& target, const RequestRecord& record, double batch_size);

  const ServingTarget& current() const { return current_; }
  bool evaluating() const { return evaluating_; }
  const PerformanceHistory& history() const { return pht_; }
  const BreachCounter& breaches() const { return cbc_; }
  const std::vector<CandidateModel>& candidates() const { return candidates_; }
  const ManagerParams& params() const { return params_; }
  int64_t requests_routed() const { return routed_; }
  int64_t requests_since_evaluation() const { return since_evaluation_; }

 private:
  ServingTarget full(size_t candidate, bool observe) const;
  std::optional<Decision> finish_evaluation_if_done();
  Decision extend_or_switch();
  // The best candidate for the SLO by its full-depth evaluation rows; `excluding` is skipped.
  std::optional<size_t> best_candidate(std::optional<size_t> excluding) const;
  int32_t next_exit_above(size_t candidate, int32_t depth) const;
  std::string describe(const ServingTarget& t) const;

  std::vector<CandidateModel> candidates_;
  ManagerParams params_;
  PerformanceHistory pht_;
  BreachCounter cbc_;
  ServingTarget current_;
  bool evaluating_ = true;
  int64_t routed_ = 0;             // every request routed
  int64_t evaluation_routed_ = 0;  // requests routed in this evaluation phase
  int64_t evaluation_done_ = 0;    // of those, finished
  int64_t since_evaluation_ = 0;   // requests routed since the last choice
};

}  // namespace helios
