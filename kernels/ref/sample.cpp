// Sampling rows of logits with the host sampler's steps as data: the CPU twin of the CUDA kernel
// (a full stable sort and sequential walks where the device sorts by radix, reduces and scans in
// blocks, so its sums round differently).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

float adjusted(const LogitAdjust& a, float x, float repetition_penalty) {
  float y = x + a.bias;
  if (a.repeat) y = y > 0 ? y / repetition_penalty : y * repetition_penalty;
  return y - a.subtract;
}

int32_t sample_row(const float* x, int32_t n_vocab, const SampleRow& row, const LogitAdjust* adjust,
                   std::vector<std::pair<float, int32_t>>& z) {
  std::vector<float> y(x, x + n_vocab);
  for (int32_t a = row.adjust_begin; a < row.adjust_end; ++a) {
    const int32_t t = adjust[a].token;
    if (t >= 0 && t < n_vocab) y[t] = adjusted(adjust[a], x[t], row.repetition_penalty);
  }
  if (row.temperature == 0.0f) return ref_argmax(y.data(), n_vocab);

  // y tempered (NaN is never drawn while a number is left).
  for (float& v : y) v = tempered_logit(v, row.temperature);
  z.resize(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) z[i] = {y[i], i};
  // Stable: equal values keep ascending ids, as the device's radix sort does.
  std::stable_sort(z.begin(), z.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  const int32_t n = row.top_k > 0 ? std::min(row.top_k, n_vocab) : n_vocab;

  // Sums over the whole vocabulary go by id and over a cut prefix by order: the host sampler's
  // order, so that on the CPU the two agree to the bit.
  const float max_z = z[0].first;
  double sum = 0;
  if (n == n_vocab) {
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(y[i] - max_z);
  } else {
    for (int32_t i = 0; i < n; ++i) sum += std::exp(z[i].first - max_z);
  }
  auto prob_of = [&](float v) { return static_cast<float>(std::exp(v - max_z) / sum); };
  auto prob = [&](int32_t i) { return prob_of(z[i].first); };

  int32_t keep = n;
  if (row.top_p < 1.0f) {
    double mass = 0;
    for (int32_t i = 0; i < n; ++i) {
      mass += prob(i);
      if (mass >= row.top_p) { keep = i + 1; break; }
    }
  }
  if (row.min_p > 0.0f) {
    const float floor = row.min_p * prob(0);
    int32_t above = 1;
    while (above < keep && prob(above) >= floor) ++above;
    keep = above;
  }
  double total = 0;
  if (keep == n_vocab) {
    for (int32_t i = 0; i < n_vocab; ++i) total += prob_of(y[i]);
  } else {
    for (int32_t i = 0; i < keep; ++i) total += prob(i);
  }
  const double target = row.uniform * total;
  double mass = 0;
  for (int32_t i = 0; i < keep; ++i) {
    mass += prob(i);
    if (mass >= target) return z[i].second;
  }
  return z[keep - 1].second;
}

}  // namespace

void ref_sample_rows(const float* logits, int32_t n_vocab, const SampleRow* rows, int32_t n_rows,
                     const LogitAdjust* adjust, int32_t* token, float* logprob) {
  std::vector<std::pair<float, int32_t>> z;
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* x = logits + static_cast<int64_t>(rows[r].logits_row) * n_vocab;
    token[r] = sample_row(x, n_vocab, rows[r], adjust, z);
    logprob[r] = static_cast<float>(cpu_log_softmax(x, n_vocab).at(x[token[r]]));
  }
}

}  // namespace helios::kernels
