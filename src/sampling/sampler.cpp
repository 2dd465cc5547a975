// Samplers: repetition penalty → temperature → top-k → softmax → top-p → min-p → draw.
#include "helios/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

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
  return ok_status();
}

TokenId argmax(const float* logits, int32_t n_vocab) {
  return static_cast<TokenId>(std::max_element(logits, logits + n_vocab) - logits);
}

TokenId Sampler::sample(float* logits, int32_t n_vocab, const std::vector<TokenId>& history) {
  // Repetition penalty: shrink the logit of every recently seen token (each once).
  if (params_.repetition_penalty != 1.0f) {
    const size_t from = history.size() > static_cast<size_t>(params_.repetition_window)
                            ? history.size() - params_.repetition_window : 0;
    std::unordered_set<TokenId> seen(history.begin() + static_cast<std::ptrdiff_t>(from), history.end());
    for (TokenId t : seen) {
      if (t < 0 || t >= n_vocab) continue;
      logits[t] = logits[t] > 0 ? logits[t] / params_.repetition_penalty
                                : logits[t] * params_.repetition_penalty;
    }
  }
  if (params_.temperature == 0.0f) return argmax(logits, n_vocab);

  // Candidates sorted by logit, cut to top-k.
  candidates_.resize(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) candidates_[i] = {logits[i] / params_.temperature, i};
  const int32_t k = params_.top_k > 0 ? std::min(params_.top_k, n_vocab) : n_vocab;
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(), by_logit);
  candidates_.resize(k);

  // Softmax over the candidates.
  const float max_logit = candidates_[0].first;
  double sum = 0;
  for (auto& c : candidates_) {
    c.first = std::exp(c.first - max_logit);
    sum += c.first;
  }
  for (auto& c : candidates_) c.first = static_cast<float>(c.first / sum);

  // Top-p: the smallest prefix whose mass reaches top_p.
  size_t keep = candidates_.size();
  if (params_.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      mass += candidates_[i].first;
      if (mass >= params_.top_p) { keep = i + 1; break; }
    }
  }
  // Min-p: drop tokens less likely than min_p times the most likely one.
  if (params_.min_p > 0.0f) {
    const float floor = params_.min_p * candidates_[0].first;
    while (keep > 1 && candidates_[keep - 1].first < floor) --keep;
  }
  candidates_.resize(keep);

  double total = 0;
  for (const auto& c : candidates_) total += c.first;
  std::uniform_real_distribution<double> uniform(0.0, total);
  double r = uniform(rng_);
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r <= 0) return c.second;
  }
  return candidates_.back().second;
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
