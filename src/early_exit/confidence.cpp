// Confidence signals: softmax statistics of exit logits, the calibrated probe on h_k, and the
// saturation cosine between consecutive hidden states.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "helios/early_exit.h"

namespace helios {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A NaN logit must not win the argmax or poison the sum: it counts as impossible.
double sanitized(float logit) { return std::isnan(logit) ? kNegInf : static_cast<double>(logit); }

double sigmoid(double z) {
  // Two branches so that exp() never overflows.
  if (z >= 0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

}  // namespace

ConfidenceStats confidence_stats(const float* logits, int32_t n_vocab) {
  ConfidenceStats stats;
  if (n_vocab <= 0) return stats;

  // Top two by value; strict '>' keeps the lowest index on ties.
  int32_t top1 = 0;
  double max1 = sanitized(logits[0]);
  double max2 = kNegInf;
  for (int32_t i = 1; i < n_vocab; ++i) {
    const double v = sanitized(logits[i]);
    if (v > max1) {
      max2 = max1;
      max1 = v;
      top1 = i;
    } else if (v > max2) {
      max2 = v;
    }
  }
  stats.top1 = top1;

  // Every logit -inf: no token is preferred, so the distribution is uniform.
  if (max1 == kNegInf) {
    stats.top1_prob = static_cast<float>(1.0 / n_vocab);
    stats.margin = n_vocab == 1 ? stats.top1_prob : 0.0f;
    stats.entropy = static_cast<float>(std::log(static_cast<double>(n_vocab)));
    return stats;
  }

  // Softmax relative to the max: z_i = l_i - max <= 0, so exp() cannot overflow.
  // H = -sum p_i log p_i = log(S) - sum p_i z_i with S = sum exp(z_i).
  double sum = 0;
  double weighted_z = 0;  // sum exp(z_i) * z_i
  for (int32_t i = 0; i < n_vocab; ++i) {
    const double z = sanitized(logits[i]) - max1;
    const double e = std::exp(z);
    if (e == 0) continue;  // also skips -inf, where e * z would be NaN
    sum += e;
    weighted_z += e * z;
  }
  const double p1 = 1.0 / sum;
  const double p2 = n_vocab > 1 ? std::exp(max2 - max1) / sum : 0.0;
  const double entropy = std::log(sum) - weighted_z / sum;
  stats.top1_prob = static_cast<float>(p1);
  stats.margin = static_cast<float>(p1 - p2);
  stats.entropy = static_cast<float>(std::max(0.0, entropy));
  return stats;
}

float confidence_value(const ConfidenceStats& stats, ConfidenceMeasure measure, int32_t n_vocab) {
  switch (measure) {
    case ConfidenceMeasure::kTop1Prob: return stats.top1_prob;
    case ConfidenceMeasure::kMargin: return stats.margin;
    case ConfidenceMeasure::kEntropy: {
      if (n_vocab <= 1) return 1.0f;  // a single token is certain
      const double normalized = stats.entropy / std::log(static_cast<double>(n_vocab));
      return static_cast<float>(std::clamp(1.0 - normalized, 0.0, 1.0));
    }
    case ConfidenceMeasure::kAgreement:  // the exit's curve applies on top (agreement_confidence)
      return stats.top1_prob;
    case ConfidenceMeasure::kProbe:
    case ConfidenceMeasure::kSaturation:
      // Computed from h_k (probe_score, cosine_similarity), not from logits: a caller bug.
      return 0.0f;
  }
  return 0.0f;
}

float probe_score(const ExitHeadParams& head, const float* hidden, int32_t n_embd) {
  if (head.probe_weight.empty() || n_embd <= 0) return 0.0f;
  assert(static_cast<int64_t>(head.probe_weight.size()) == n_embd);
  double sum_sq = 0;
  double dot = 0;
  for (int32_t i = 0; i < n_embd; ++i) {
    sum_sq += static_cast<double>(hidden[i]) * hidden[i];
    dot += static_cast<double>(head.probe_weight[i]) * hidden[i];
  }
  // The probe was fitted on h / rms(h), so the scale of h (which grows with depth) drops out.
  const double rms = std::sqrt(sum_sq / n_embd + 1e-6);
  return static_cast<float>(sigmoid(dot / rms + head.probe_bias));
}

float cosine_similarity(const float* a, const float* b, int32_t n) {
  double dot = 0;
  double norm_a = 0;
  double norm_b = 0;
  for (int32_t i = 0; i < n; ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    norm_a += static_cast<double>(a[i]) * a[i];
    norm_b += static_cast<double>(b[i]) * b[i];
  }
  if (norm_a == 0 || norm_b == 0) return 0.0f;
  return static_cast<float>(std::clamp(dot / std::sqrt(norm_a * norm_b), -1.0, 1.0));
}

}  // namespace helios

namespace helios {

float agreement_confidence(const ExitHeadParams& head, float top1_prob) {
  const std::vector<float>& xs = head.curve_prob;
  const std::vector<float>& ys = head.curve_agreement;
  if (xs.empty() || xs.size() != ys.size()) return top1_prob;
  if (top1_prob <= xs.front()) return ys.front();
  if (top1_prob >= xs.back()) return ys.back();
  const size_t i = static_cast<size_t>(std::upper_bound(xs.begin(), xs.end(), top1_prob) - xs.begin());
  const float span = xs[i] - xs[i - 1];
  const float f = span > 0 ? (top1_prob - xs[i - 1]) / span : 1.0f;
  return ys[i - 1] + f * (ys[i] - ys[i - 1]);
}

void fit_agreement_curve(const std::vector<float>& top1_prob, const std::vector<uint8_t>& agrees, int32_t points,
                         std::vector<float>* curve_prob, std::vector<float>* curve_agreement) {
  curve_prob->clear();
  curve_agreement->clear();
  const size_t n = std::min(top1_prob.size(), agrees.size());
  if (n == 0 || points < 2) return;
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return top1_prob[a] > top1_prob[b]; });
  // Walking down from the most confident, the share agreeing among those seen so far; sampled at
  // quantiles, where no tie continues past the point.
  std::vector<std::pair<float, float>> descending;
  int64_t agreeing = 0;
  const size_t step = std::max<size_t>(1, n / static_cast<size_t>(points));
  for (size_t k = 0; k < n; ++k) {
    agreeing += agrees[order[k]];
    const bool tie_next = k + 1 < n && top1_prob[order[k + 1]] == top1_prob[order[k]];
    if (tie_next || ((k + 1) % step != 0 && k + 1 != n)) continue;
    descending.emplace_back(top1_prob[order[k]], static_cast<float>(agreeing) / static_cast<float>(k + 1));
  }
  // Non-decreasing in the probability: a point may claim no more than any point above it.
  float cap = 1.0f;
  for (auto& [p, share] : descending) cap = share = std::min(cap, share);
  for (auto it = descending.rbegin(); it != descending.rend(); ++it) {
    curve_prob->push_back(it->first);
    curve_agreement->push_back(it->second);
  }
}

}  // namespace helios
