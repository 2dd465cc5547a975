// The model manager's decisions: Top-K selection, the Performance History Table, the loaded
// depth, confidence breaches, extend or switch, re-assessment.
#include "helios/model_manager.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "helios/gguf.h"

namespace helios {

const char* slo_mode_name(SloMode mode) {
  switch (mode) {
    case SloMode::kThroughput: return "throughput";
    case SloMode::kLatency: return "latency";
    case SloMode::kAccuracy: return "accuracy";
    case SloMode::kEnergy: return "energy";
  }
  return "?";
}

const char* decision_kind_name(DecisionKind kind) {
  switch (kind) {
    case DecisionKind::kEvaluate: return "evaluate";
    case DecisionKind::kChoose: return "choose";
    case DecisionKind::kExtend: return "extend";
    case DecisionKind::kSwitch: return "switch";
    case DecisionKind::kReassess: return "reassess";
  }
  return "?";
}

namespace {

std::string format(const char* fmt, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c, d);
  return buf;
}

std::string mib(int64_t bytes) { return format("%.0f MiB", static_cast<double>(bytes) / 1048576.0); }

// "blk.12.attn_q.weight" -> 12; -1 for tensors outside the layer stack.
int32_t layer_of(const std::string& tensor) {
  if (tensor.rfind("blk.", 0) != 0) return -1;
  const size_t dot = tensor.find('.', 4);
  if (dot == std::string::npos) return -1;
  try {
    return std::stoi(tensor.substr(4, dot - 4));
  } catch (...) {
    return -1;
  }
}

}  // namespace

int64_t ModelFootprint::bytes_at_depth(int32_t depth) const {
  depth = std::clamp(depth, 0, n_layers());
  return std::accumulate(layer_bytes.begin(), layer_bytes.begin() + depth, shared_bytes);
}

int64_t ModelFootprint::params_at_depth(int32_t depth) const {
  depth = std::clamp(depth, 0, n_layers());
  return std::accumulate(layer_params.begin(), layer_params.begin() + depth, shared_params);
}

StatusOr<ModelFootprint> model_footprint(const std::string& gguf_path) {
  HELIOS_ASSIGN_OR_RETURN(auto file, GgufFile::open(gguf_path));
  ModelFootprint f;
  for (const GgufTensorInfo& t : file->tensors()) {
    const int32_t layer = layer_of(t.name);
    if (layer < 0) {
      f.shared_bytes += static_cast<int64_t>(t.n_bytes);
      f.shared_params += t.n_elements();
      continue;
    }
    if (layer >= static_cast<int32_t>(f.layer_bytes.size())) {
      f.layer_bytes.resize(layer + 1, 0);
      f.layer_params.resize(layer + 1, 0);
    }
    f.layer_bytes[layer] += static_cast<int64_t>(t.n_bytes);
    f.layer_params[layer] += t.n_elements();
  }
  if (f.layer_bytes.empty()) return invalid_argument(gguf_path + ": no layer tensors (blk.N.*) in the file");
  return f;
}

StatusOr<std::string> tokenizer_difference(const std::string& gguf_a, const std::string& gguf_b) {
  HELIOS_ASSIGN_OR_RETURN(auto a, GgufFile::open(gguf_a));
  HELIOS_ASSIGN_OR_RETURN(auto b, GgufFile::open(gguf_b));
  auto kind = [](const GgufFile& f) {
    auto s = f.get_string("tokenizer.ggml.model");
    return s.ok() ? *s : std::string("(none)");
  };
  if (kind(*a) != kind(*b)) {
    return gguf_a + " has a " + kind(*a) + " tokenizer and " + gguf_b + " a " + kind(*b) + " one";
  }
  const std::vector<std::string>* ta = a->get_string_array("tokenizer.ggml.tokens");
  const std::vector<std::string>* tb = b->get_string_array("tokenizer.ggml.tokens");
  if (!ta || !tb) return std::string("a tokenizer without tokens (tokenizer.ggml.tokens) in ") + (ta ? gguf_b : gguf_a);
  if (ta->size() != tb->size()) {
    return gguf_a + " has " + std::to_string(ta->size()) + " tokens and " + gguf_b + " " + std::to_string(tb->size());
  }
  for (size_t i = 0; i < ta->size(); ++i) {
    if ((*ta)[i] != (*tb)[i]) {
      return "token " + std::to_string(i) + " is '" + (*ta)[i] + "' in " + gguf_a + " and '" + (*tb)[i] + "' in " + gguf_b;
    }
  }
  return std::string();
}

double estimate_joules_per_token(int64_t weight_bytes, int64_t n_weights, double batch_size) {
  constexpr double kJoulesPerByte = 250e-12;
  constexpr double kJoulesPerFlop = 2.3e-12;
  const double batch = std::max(1.0, batch_size);
  return static_cast<double>(weight_bytes) / batch * kJoulesPerByte + 2.0 * static_cast<double>(n_weights) * kJoulesPerFlop;
}

StatusOr<std::vector<size_t>> select_candidates(const std::vector<CandidateModel>& repository, SloMode slo,
                                                int32_t top_k, int64_t memory_budget, int32_t min_kv_tokens) {
  std::vector<size_t> fits;
  std::string too_big;
  for (size_t i = 0; i < repository.size(); ++i) {
    const CandidateModel& m = repository[i];
    const int64_t need = m.footprint.total_bytes() + m.kv_bytes_per_token * min_kv_tokens;
    if (need <= memory_budget) {
      fits.push_back(i);
    } else {
      too_big += (too_big.empty() ? "" : ", ") + m.name + " needs " + mib(need);
    }
  }
  if (fits.empty()) {
    return invalid_argument("no candidate fits the memory budget of " + mib(memory_budget) + " (" + too_big +
                            " with one " + std::to_string(min_kv_tokens) + "-token sequence); raise memory_budget");
  }
  // Telemetry the repository lacks ranks last; ties keep repository order.
  auto key = [&](size_t i) -> double {
    const CandidateModel& m = repository[i];
    const ModelTelemetry& t = m.telemetry;
    switch (slo) {
      case SloMode::kThroughput: return t.throughput_tok_s > 0 ? t.throughput_tok_s : -1;
      case SloMode::kLatency: return t.throughput_tok_s > 0 ? t.throughput_tok_s : -1;  // TPOT = 1 / tok/s
      case SloMode::kAccuracy: return t.perplexity > 0 ? -t.perplexity : -1e300;
      case SloMode::kEnergy: {
        const int64_t bytes = t.memory_bytes > 0 ? t.memory_bytes : m.footprint.total_bytes();
        return -static_cast<double>(bytes);  // joules per token grow with the bytes read
      }
    }
    return 0;
  };
  std::stable_sort(fits.begin(), fits.end(), [&](size_t a, size_t b) { return key(a) > key(b); });
  if (top_k > 0 && static_cast<int32_t>(fits.size()) > top_k) fits.resize(top_k);
  return fits;
}

double PhtRow::perplexity() const { return tokens > 0 ? std::exp(-sum_logprob / tokens) : 0; }

double PhtRow::joules_per_token() const {
  const double batch = tokens > 0 ? batch_sum / tokens : 1.0;
  return estimate_joules_per_token(weight_bytes, n_weights, batch);
}

double PhtRow::leave_share(int32_t exit) const {
  if (observed_tokens == 0) return 0;
  for (size_t i = 0; i < exits.size(); ++i) {
    if (exits[i] == exit) return static_cast<double>(leave_by_exit[i]) / observed_tokens;
  }
  return 0;
}

PhtRow& PerformanceHistory::row(const std::string& model, int32_t depth) {
  for (PhtRow& r : rows_) {
    if (r.model == model && r.depth == depth) return r;
  }
  PhtRow& r = rows_.emplace_back();
  r.model = model;
  r.depth = depth;
  return r;
}

const PhtRow* PerformanceHistory::find(const std::string& model, int32_t depth) const {
  for (const PhtRow& r : rows_) {
    if (r.model == model && r.depth == depth) return &r;
  }
  return nullptr;
}

void PerformanceHistory::record(const std::string& model, int32_t depth, const RequestRecord& rec, float threshold,
                                double batch_size) {
  PhtRow& r = row(model, depth);
  if (rec.completion_tokens == 0) return;  // refused or cancelled: nothing to learn from
  ++r.requests;
  r.tokens += rec.completion_tokens;
  r.ttft_sum_s += rec.ttft_s;
  r.decode_s += rec.decode_s;
  r.decode_tokens += std::max(0, rec.completion_tokens - 1);
  r.sum_logprob += rec.sum_logprob;
  r.batch_sum += batch_size * rec.completion_tokens;
  for (const std::vector<float>& conf : rec.exit_confidence) {
    if (r.leave_by_exit.size() != conf.size()) continue;  // exits set when the row was made
    ++r.observed_tokens;
    // A token leaves at its first confident exit, so it counts at that exit and every deeper one.
    for (size_t i = 0; i < conf.size(); ++i) {
      if (conf[i] >= threshold) {
        for (size_t j = i; j < conf.size(); ++j) ++r.leave_by_exit[j];
        break;
      }
    }
  }
}

double slo_score(const PhtRow& row, SloMode slo) {
  if (row.decode_tokens == 0 && row.tokens == 0) return -1e300;
  switch (slo) {
    case SloMode::kThroughput: return row.throughput_tok_s();
    case SloMode::kLatency: return -(row.mean_ttft_s() + 32 * row.mean_tpot_s());
    case SloMode::kAccuracy: return -row.perplexity();
    case SloMode::kEnergy: return -row.joules_per_token();
  }
  return 0;
}

int32_t choose_depth(const PhtRow& row, int32_t n_layers, double coverage) {
  for (int32_t exit : row.exits) {
    if (exit < n_layers && row.observed_tokens > 0 && row.leave_share(exit) >= coverage) return exit;
  }
  return n_layers;
}

bool BreachCounter::add(bool breach) {
  recent_.push_back(breach ? 1 : 0);
  breaches_ += breach ? 1 : 0;
  if (static_cast<int32_t>(recent_.size()) > window_) {
    breaches_ -= recent_.front();
    recent_.pop_front();
  }
  return breaches_ > max_;
}

void BreachCounter::reset() {
  recent_.clear();
  breaches_ = 0;
}

ModelManager::ModelManager(std::vector<CandidateModel> candidates, ManagerParams params)
    : candidates_(std::move(candidates)), params_(params), cbc_(params.cbc_window, params.cbc_max) {
  current_ = full(0, true);
}

ServingTarget ModelManager::full(size_t candidate, bool observe) const {
  return {candidate, candidates_[candidate].footprint.n_layers(), observe};
}

std::string ModelManager::describe(const ServingTarget& t) const {
  const CandidateModel& m = candidates_[t.candidate];
  return m.name + " at " + std::to_string(t.depth) + "/" + std::to_string(m.footprint.n_layers()) + " layers (" +
         mib(m.footprint.bytes_at_depth(t.depth)) + " of weights)";
}

std::pair<ServingTarget, std::optional<Decision>> ModelManager::route() {
  ++routed_;
  std::optional<Decision> decision;
  if (!evaluating_ && params_.reassess_every > 0 && since_evaluation_ >= params_.reassess_every) {
    // Step 5: the stream may have moved on; evaluate the candidates again from the first.
    evaluating_ = true;
    evaluation_routed_ = evaluation_done_ = 0;
    for (size_t c = 0; c < candidates_.size(); ++c) {  // each phase measures the stream afresh
      PhtRow& r = pht_.row(candidates_[c].name, candidates_[c].footprint.n_layers());
      const std::vector<int32_t> exits = r.exits;
      r = PhtRow{};
      r.model = candidates_[c].name;
      r.depth = candidates_[c].footprint.n_layers();
      r.exits = exits;
      r.leave_by_exit.assign(exits.size(), 0);
    }
    decision = Decision{DecisionKind::kReassess, full(0, true),
                        std::to_string(since_evaluation_) + " requests since the last evaluation (RI " +
                            std::to_string(params_.reassess_every) + "): evaluating " +
                            std::to_string(candidates_.size()) + " candidate(s) again"};
    since_evaluation_ = 0;
    cbc_.reset();
  }
  if (evaluating_) {
    const int64_t n = static_cast<int64_t>(params_.evaluation_requests);
    const int64_t total = n * static_cast<int64_t>(candidates_.size());
    if (evaluation_routed_ < total) {
      const size_t c = static_cast<size_t>(evaluation_routed_ / n);
      const ServingTarget t = full(c, true);
      if (!(t == current_) || evaluation_routed_ == 0) {
        if (!decision) {
          decision = Decision{DecisionKind::kEvaluate, t,
                              "evaluating candidate " + std::to_string(c + 1) + " of " +
                                  std::to_string(candidates_.size()) + ": " + describe(t) + " for " +
                                  std::to_string(n) + " request(s)"};
        }
        current_ = t;
      }
      ++evaluation_routed_;
    }
    ServingTarget& row_target = current_;
    PhtRow& r = pht_.row(candidates_[row_target.candidate].name, row_target.depth);
    if (r.exits.empty() && !candidates_[row_target.candidate].exits.empty()) {
      r.exits = candidates_[row_target.candidate].exits;
      r.leave_by_exit.assign(r.exits.size(), 0);
    }
    return {current_, decision};
  }
  ++since_evaluation_;
  return {current_, decision};
}

std::optional<Decision> ModelManager::on_token(const ServingTarget& target, float confidence, double) {
  if (evaluating_ || !(target == current_)) return std::nullopt;
  if (target.depth >= candidates_[target.candidate].footprint.n_layers()) return std::nullopt;  // nothing to breach
  if (!cbc_.add(confidence < params_.threshold)) return std::nullopt;
  Decision d = extend_or_switch();
  cbc_.reset();
  return d;
}

std::optional<Decision> ModelManager::on_finished(const ServingTarget& target, const RequestRecord& record,
                                                  double batch_size) {
  const CandidateModel& m = candidates_[target.candidate];
  PhtRow& r = pht_.row(m.name, target.depth);
  if (r.weight_bytes == 0) {
    r.weight_bytes = m.footprint.bytes_at_depth(target.depth);
    r.n_weights = m.footprint.params_at_depth(target.depth);
  }
  if (target.observe && r.exits.empty()) {
    r.exits = m.exits;
    r.leave_by_exit.assign(r.exits.size(), 0);
  }
  pht_.record(m.name, target.depth, record, params_.threshold, batch_size);
  if (evaluating_ && target.observe) {
    ++evaluation_done_;
    return finish_evaluation_if_done();
  }
  return std::nullopt;
}

std::optional<Decision> ModelManager::finish_evaluation_if_done() {
  const int64_t total = static_cast<int64_t>(params_.evaluation_requests) * static_cast<int64_t>(candidates_.size());
  if (evaluation_routed_ < total || evaluation_done_ < total) return std::nullopt;
  const size_t best = best_candidate(std::nullopt).value_or(0);
  const CandidateModel& m = candidates_[best];
  const PhtRow* row = pht_.find(m.name, m.footprint.n_layers());
  const int32_t depth = row ? choose_depth(*row, m.footprint.n_layers(), params_.prefix_coverage) : m.footprint.n_layers();
  std::string why = "best for " + std::string(slo_mode_name(params_.slo)) + " of " + std::to_string(candidates_.size()) +
                    " candidate(s):";
  for (const CandidateModel& c : candidates_) {
    if (const PhtRow* r = pht_.find(c.name, c.footprint.n_layers())) {
      why += " " + c.name + format(" %.1f tok/s, TTFT %.3f s, TPOT %.4f s, ppl %.2f;", r->throughput_tok_s(),
                                   r->mean_ttft_s(), r->mean_tpot_s(), r->perplexity());
    }
  }
  if (row && depth < m.footprint.n_layers()) {
    why += format(" %.0f%% of its observed tokens leave by layer %.0f (coverage %.0f%%)", 100 * row->leave_share(depth),
                  depth, 100 * params_.prefix_coverage);
  } else {
    why += format(" no exit point serves %.0f%% of its tokens: all layers", 100 * params_.prefix_coverage);
  }
  evaluating_ = false;
  since_evaluation_ = 0;
  cbc_.reset();
  current_ = {best, depth, false};
  return Decision{DecisionKind::kChoose, current_, "serving " + describe(current_) + "; " + why};
}

std::optional<size_t> ModelManager::best_candidate(std::optional<size_t> excluding) const {
  std::optional<size_t> best;
  double best_score = 0;
  for (size_t c = 0; c < candidates_.size(); ++c) {
    if (excluding && *excluding == c) continue;
    const PhtRow* r = pht_.find(candidates_[c].name, candidates_[c].footprint.n_layers());
    const double score = r ? slo_score(*r, params_.slo) : -1e300;
    if (!best || score > best_score) {
      best = c;
      best_score = score;
    }
  }
  return best;
}

int32_t ModelManager::next_exit_above(size_t candidate, int32_t depth) const {
  for (int32_t e : candidates_[candidate].exits) {
    if (e > depth) return e;
  }
  return candidates_[candidate].footprint.n_layers();
}

Decision ModelManager::extend_or_switch() {
  // The cost of an option is the weight memory it keeps resident (the paper's "total resource
  // usage"): every decode step reads it, and what it leaves free is KV for the batch.
  const ServingTarget extend{current_.candidate, next_exit_above(current_.candidate, current_.depth), false};
  const int64_t extend_bytes = candidates_[extend.candidate].footprint.bytes_at_depth(extend.depth);
  std::string why = std::to_string(cbc_.breaches()) + " of the last " + std::to_string(cbc_.tokens_seen()) +
                    " tokens below confidence " + format("%.2f", params_.threshold) + " (CBCmax " +
                    std::to_string(params_.cbc_max) + "); extend to " + describe(extend);
  const std::optional<size_t> other = best_candidate(current_.candidate);
  if (other) {
    const CandidateModel& m = candidates_[*other];
    const PhtRow* row = pht_.find(m.name, m.footprint.n_layers());
    const int32_t depth = row ? choose_depth(*row, m.footprint.n_layers(), params_.prefix_coverage) : m.footprint.n_layers();
    const ServingTarget sw{*other, depth, false};
    const int64_t switch_bytes = m.footprint.bytes_at_depth(depth);
    why += " vs switch to " + describe(sw);
    if (switch_bytes < extend_bytes) {
      current_ = sw;
      return Decision{DecisionKind::kSwitch, sw, why + ": switching is cheaper"};
    }
  }
  current_ = extend;
  return Decision{DecisionKind::kExtend, extend, why + (other ? ": extending is cheaper" : ": no other candidate")};
}

}  // namespace helios
