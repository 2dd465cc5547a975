// Argmax and seeded sampling, written the way the GPU kernel computes them (same candidate
// order, same float exponentials, sums in double), so both pick the same id for the same uniform.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/sample_rng.h"

namespace helios::kernels {
namespace {

int32_t argmax_row(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) if (x[i] > x[best]) best = i;
  return best;
}

// Whole vocabulary, index order: the first id whose running sum exceeds u · Σp.
int32_t sample_full(const float* x, int32_t n, float temperature, float u) {
  float m = -INFINITY;
  for (int32_t i = 0; i < n; ++i) m = std::max(m, x[i] / temperature);
  double total = 0;
  for (int32_t i = 0; i < n; ++i) total += std::exp(x[i] / temperature - m);
  const double target = static_cast<double>(u) * total;
  double cum = 0;
  int32_t last = 0;
  for (int32_t i = 0; i < n; ++i) {
    const float e = std::exp(x[i] / temperature - m);
    if (e > 0.0f) last = i;
    cum += e;
    if (target < cum) return i;
  }
  return last;  // u · total rounded up past the sum
}

int32_t sample_candidates(const float* x, int32_t n, const SampleParams& p, float u) {
  const int32_t k = std::min({p.top_k > 0 ? p.top_k : n, n, kSampleMaxCandidates});
  std::vector<std::pair<float, int32_t>> c(n);
  for (int32_t i = 0; i < n; ++i) c[i] = {x[i] / p.temperature, i};
  auto before = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(c.begin(), c.begin() + k, c.end(), before);
  std::vector<float> e(k);
  double sum = 0;
  for (int32_t j = 0; j < k; ++j) {
    e[j] = std::exp(c[j].first - c[0].first);
    sum += e[j];
  }
  int32_t keep = k;
  if (p.top_p < 1.0f) {
    const double need = static_cast<double>(p.top_p) * sum;
    double mass = 0;
    for (int32_t j = 0; j < k; ++j) {
      mass += e[j];
      if (mass >= need) { keep = j + 1; break; }
    }
  }
  double total = 0;
  for (int32_t j = 0; j < keep; ++j) total += e[j];
  const double target = static_cast<double>(u) * total;
  double cum = 0;
  for (int32_t j = 0; j < keep; ++j) {
    cum += e[j];
    if (target < cum) return c[j].second;
  }
  return c[keep - 1].second;
}

}  // namespace

float ref_sample_uniform(uint64_t seed, uint64_t step) { return sample_uniform(seed, step); }

void ref_argmax(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* out) {
  for (int32_t r = 0; r < n_rows; ++r) out[r] = argmax_row(logits + static_cast<int64_t>(r) * n_vocab, n_vocab);
}

void ref_sample(const float* logits, int32_t n_rows, int32_t n_vocab, const SampleParams* params,
                int32_t* out) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* x = logits + static_cast<int64_t>(r) * n_vocab;
    const SampleParams& p = params[r];
    if (!(p.temperature > 0.0f)) {
      out[r] = argmax_row(x, n_vocab);
      continue;
    }
    const float u = sample_uniform(p.seed, p.step);
    const bool whole = (p.top_k <= 0 || p.top_k >= n_vocab) && p.top_p >= 1.0f;
    out[r] = whole ? sample_full(x, n_vocab, p.temperature, u) : sample_candidates(x, n_vocab, p, u);
  }
}

}  // namespace helios::kernels
