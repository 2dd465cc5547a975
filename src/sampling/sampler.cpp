// Samplers: logit bias → repetition penalty → presence/frequency penalties → temperature → top-k → softmax → top-p → min-p → draw.
#include "helios/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace helios {

Status SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0) {
    return invalid_argument("temperature must be a finite number ≥ 0 (got " + std::to_string(temperature) + ")");
  }
  if (top_k < 0) return invalid_argument("top_k must be ≥ 0 (got " + std::to_string(top_k) + "); 0 turns it off");
  if (!(top_p > 0 && top_p <= 1)) {
    return invalid_argument("top_p must be in (0, 1] (got " + std::to_string(top_p) + "); 1 turns it off");
  }
  if (!(min_p >= 0 && min_p <= 1)) {
    return invalid_argument("min_p must be in [0, 1] (got " + std::to_string(min_p) + "); 0 turns it off");
  }
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    return invalid_argument("repetition_penalty must be > 0 (got " + std::to_string(repetition_penalty) + "); 1 turns it off");
  }
  if (repetition_window < 0) return invalid_argument("repetition_window must be ≥ 0");
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) {
    return invalid_argument("presence_penalty must be in [-2, 2] (got " + std::to_string(presence_penalty) + "); 0 turns it off");
  }
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) {
    return invalid_argument("frequency_penalty must be in [-2, 2] (got " + std::to_string(frequency_penalty) +
                            "); 0 turns it off");
  }
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0) return invalid_argument("logit_bias: token " + std::to_string(token) + " is negative");
    if (!(bias >= -100 && bias <= 100)) {
      return invalid_argument("logit_bias: the bias of token " + std::to_string(token) + " must be in [-100, 100] (got " +
                              std::to_string(bias) + ")");
    }
  }
  return ok_status();
}

TokenId argmax(const float* logits, int32_t n_vocab) { return kernels::ref_argmax(logits, n_vocab); }

void Sampler::accept(TokenId token) {
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) ++generated_[token];
}

std::vector<TokenId> Sampler::repeated_tokens(const std::vector<TokenId>& history, int32_t n_vocab) const {
  const size_t from = history.size() > static_cast<size_t>(params_.repetition_window)
                          ? history.size() - params_.repetition_window : 0;
  std::vector<TokenId> seen;
  for (size_t i = from; i < history.size(); ++i) {
    if (history[i] >= 0 && history[i] < n_vocab) seen.push_back(history[i]);
  }
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  return seen;
}

std::optional<SampleDraw> Sampler::plan_draw(const std::vector<TokenId>& history, int32_t n_vocab) {
  // One adjustment per token: bias, then repetition, then presence/frequency, as sample() applies them.
  std::map<TokenId, kernels::LogitAdjust> by_token;
  auto at = [&](TokenId t) -> kernels::LogitAdjust& {
    kernels::LogitAdjust& a = by_token[t];
    a.token = t;
    return a;
  };
  for (const auto& [t, bias] : params_.logit_bias) {
    if (t >= n_vocab) continue;
    if (by_token.count(t)) return std::nullopt;
    at(t).bias = bias;
  }
  if (params_.repetition_penalty != 1.0f) {
    for (TokenId t : repeated_tokens(history, n_vocab)) at(t).repeat = 1;
  }
  for (const auto& [t, count] : generated_) {
    if (t >= 0 && t < n_vocab) at(t).subtract = params_.frequency_penalty * count + params_.presence_penalty;
  }
  SampleDraw draw;
  for (const auto& [t, a] : by_token) draw.adjust.push_back(a);
  kernels::SampleRow& row = draw.row;
  row.temperature = params_.temperature;
  row.top_k = params_.top_k;
  row.top_p = params_.top_p;
  row.min_p = params_.min_p;
  row.repetition_penalty = params_.repetition_penalty;
  if (params_.temperature != 0.0f) row.uniform = draw_uniform();  // greedy draws nothing
  return draw;
}

TokenId Sampler::sample(float* logits, int32_t n_vocab, const std::vector<TokenId>& history) {
  for (const auto& [t, bias] : params_.logit_bias) {
    if (t < n_vocab) logits[t] += bias;
  }
  // Repetition penalty: shrink the logit of every recently seen token (each once).
  if (params_.repetition_penalty != 1.0f) {
    for (TokenId t : repeated_tokens(history, n_vocab)) {
      logits[t] = logits[t] > 0 ? logits[t] / params_.repetition_penalty
                                : logits[t] * params_.repetition_penalty;
    }
  }
  for (const auto& [t, count] : generated_) {
    if (t >= 0 && t < n_vocab) logits[t] -= params_.frequency_penalty * count + params_.presence_penalty;
  }
  if (params_.temperature == 0.0f) return argmax(logits, n_vocab);
  // The row tempered, in place, as kernels::softmax_logit takes it: NaN is never drawn while a
  // number is left, and the order below stays a strict weak order.
  for (int32_t i = 0; i < n_vocab; ++i) logits[i] = kernels::tempered_logit(logits[i], params_.temperature);

  // Candidates by logit, highest first (ties: the lower id), cut to top-k. Only as long a prefix
  // as top-k, top-p, min-p and the draw look at is put in order: with a vocabulary of 150k, a
  // full sort per token would cost more than the forward pass.
  candidates_.resize(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) candidates_[i] = {logits[i], i};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  const auto first = candidates_.begin();
  int32_t n = n_vocab, sorted = 0;
  auto sort_prefix = [&](int32_t m) {  // candidates_[0, m) in order, a prefix of the full order
    m = std::min(m, n);
    if (m <= sorted) return;
    if (m < n) std::nth_element(first + sorted, first + m, first + n, by_logit);
    std::sort(first + sorted, first + m, by_logit);
    sorted = m;
  };
  auto ensure_sorted = [&](int32_t i) {  // candidates_[i] in its place
    if (i >= sorted) sort_prefix(std::max({i + 1, 2 * sorted, 256}));
  };
  if (params_.top_k > 0) {
    sort_prefix(params_.top_k);  // the top k of the whole vocabulary, in order
    n = sorted;
  }
  ensure_sorted(0);

  // Softmax over the candidates, summed in a fixed order (token ids, or the top k's order) so
  // that kernels::ref_sample_rows, which sorts everything, sums the same values the same way.
  const float max_logit = candidates_[0].first;
  double sum = 0;
  if (n == n_vocab) {
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(logits[i] - max_logit);
  } else {
    for (int32_t i = 0; i < n; ++i) sum += std::exp(candidates_[i].first - max_logit);
  }
  auto prob_of = [&](float z) { return static_cast<float>(std::exp(z - max_logit) / sum); };
  auto prob = [&](int32_t i) { return prob_of(candidates_[i].first); };

  // Top-p: the smallest prefix whose mass reaches top_p.
  int32_t keep = n;
  if (params_.top_p < 1.0f) {
    double mass = 0;
    for (int32_t i = 0; i < n; ++i) {
      ensure_sorted(i);
      mass += prob(i);
      if (mass >= params_.top_p) { keep = i + 1; break; }
    }
  }
  // Min-p: drop tokens less likely than min_p times the most likely one (a suffix of the order).
  if (params_.min_p > 0.0f) {
    const float floor = params_.min_p * prob(0);
    int32_t above = 1;
    while (above < keep && (ensure_sorted(above), prob(above) >= floor)) ++above;
    keep = above;
  }

  // The draw walks the order from the most likely token to the first whose running mass reaches
  // u times the kept mass (uniform_real_distribution<double>(0, total), made explicit).
  double total = 0;  // over the kept candidates: the sorted prefix, or all of them by id
  if (keep == n_vocab) {
    for (int32_t i = 0; i < n_vocab; ++i) total += prob_of(logits[i]);
  } else {
    for (int32_t i = 0; i < keep; ++i) total += prob(i);
  }
  const double target = draw_uniform() * total;
  double mass = 0;
  for (int32_t i = 0; i < keep; ++i) {
    ensure_sorted(i);
    mass += prob(i);
    if (mass >= target) return candidates_[i].second;
  }
  ensure_sorted(keep - 1);
  return candidates_[keep - 1].second;
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kEos: return "eos";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAborted: return "aborted";
  }
  return "unknown";
}

std::string StopMatcher::push(const std::string& delta) {
  if (stopped_) return "";
  held_ += delta;
  // A complete stop string: emit what precedes the earliest one, then stop.
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    if (s.empty()) continue;
    first = std::min(first, held_.find(s));
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - (s.empty() ? 0 : 1), held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? "" : out;
}

}  // namespace helios
