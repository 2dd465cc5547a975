// The CPU backend's softmax statistics over logits: the maths of ref_exit_stats with the
// exponentials 8 at a time in float (exp_avx2, relative error about 1e-7) and the sums in double,
// so each row costs a pass for its maximum and one for the sums instead of a double exp per entry.
// Vocabularies of 50k-150k entries make these the costliest per-token work outside the matmuls.
#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "kernels/ref/exp_avx2.h"
#include "kernels/ref/quant_kernels.h"

namespace helios::kernels {
namespace {

// max of softmax_logit over x[begin, end)
float max_of(const float* x, int32_t begin, int32_t end) {
  float m = -INFINITY;
  int32_t i = begin;
#if defined(__AVX2__) && defined(__FMA__)
  if (end - i >= 8) {
    __m256 v = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= end; i += 8) v = _mm256_max_ps(v, softmax_logits_avx2(_mm256_loadu_ps(x + i)));
    m = quant::max_lanes_avx2(v);
  }
#endif
  for (; i < end; ++i) m = std::max(m, softmax_logit(x[i]));
  return m;
}

struct ExpSums {
  double sum = 0;       // Σ e^(x−m)
  double weighted = 0;  // Σ (x−m)·e^(x−m)
};

template <bool kWeighted>
ExpSums exp_sums(const float* x, int32_t n, float m) {
  ExpSums s;
  int32_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
  __m256d w_lo = _mm256_setzero_pd(), w_hi = _mm256_setzero_pd();
  const __m256 mv = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(softmax_logits_avx2(_mm256_loadu_ps(x + i)), mv);
    const __m256 e = exp_avx2(d);
    sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    if constexpr (kWeighted) {
      // A masked logit (−inf) adds nothing, not −inf·0.
      const __m256 de = _mm256_and_ps(_mm256_mul_ps(d, e), _mm256_cmp_ps(e, _mm256_setzero_ps(), _CMP_GT_OQ));
      w_lo = _mm256_add_pd(w_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(de)));
      w_hi = _mm256_add_pd(w_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(de, 1)));
    }
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(sum_lo, sum_hi));
  s.sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  _mm256_store_pd(lanes, _mm256_add_pd(w_lo, w_hi));
  s.weighted = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; i < n; ++i) {
    const double d = static_cast<double>(softmax_logit(x[i])) - m;
    const double e = std::exp(d);
    s.sum += e;
    if (kWeighted && e > 0) s.weighted += d * e;
  }
  return s;
}

}  // namespace

void cpu_exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1, float* top1_prob,
                    float* margin, float* entropy) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* x = logits + static_cast<int64_t>(r) * n_vocab;
    const float m = max_of(x, 0, n_vocab);
    // The lowest id on ties; where m stands for other values (−inf for NaN, FLT_MAX for +inf),
    // ref_argmax's.
    const int32_t best = m > -INFINITY && m < FLT_MAX ? static_cast<int32_t>(std::find(x, x + n_vocab, m) - x)
                                                      : ref_argmax(x, n_vocab);
    const float second = std::max(max_of(x, 0, best), max_of(x, best + 1, n_vocab));
    top1[r] = best;
    if (m == -INFINITY) {
      uniform_stats(n_vocab, top1_prob[r], margin[r], entropy[r]);
      continue;
    }
    const ExpSums s = exp_sums<true>(x, n_vocab, m);
    top1_prob[r] = static_cast<float>(1.0 / s.sum);
    margin[r] = n_vocab > 1 ? static_cast<float>((1.0 - std::exp(static_cast<double>(second) - m)) / s.sum) : 1.0f;
    entropy[r] = static_cast<float>(std::log(s.sum) - s.weighted / s.sum);
  }
}

LogSoftmax cpu_log_softmax(const float* logits, int32_t n) {
  LogSoftmax ls;
  ls.max = max_of(logits, 0, n);
  ls.log_sum = std::log(ls.max == -INFINITY ? static_cast<double>(n) : exp_sums<false>(logits, n, ls.max).sum);
  return ls;
}

}  // namespace helios::kernels
