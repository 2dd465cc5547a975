// The vectorised exponential of the CPU kernels (attention and logit softmaxes).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <cfloat>
#include <cmath>

namespace helios::kernels {

// softmax_logit (kernels.h) of 8 at once: NaN as −inf (max_ps gives its second operand for a NaN
// first one), +inf as FLT_MAX.
inline __m256 softmax_logits_avx2(__m256 x) {
  return _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-INFINITY)), _mm256_set1_ps(FLT_MAX));
}

// e^x for x <= 0 (scores minus their maximum), 8 at a time: e^x = 2^n * 2^f with n = round(x log2 e),
// n set in the exponent bits and 2^f, f in [-0.5, 0.5], from its Taylor polynomial of degree 6
// (relative error below 1.2e-7, a float's rounding). Inputs at or below -87 give 0 (e^-87 is
// about the smallest normal float).
inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);
  __m256 p = _mm256_set1_ps(1.540353039e-04f);  // ln(2)^k / k!, k = 6 .. 0
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.333355815e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129108e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265070e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471806e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.000000000e+00f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 scaled = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_and_ps(scaled, _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GT_OQ));
}

}  // namespace helios::kernels
#endif
