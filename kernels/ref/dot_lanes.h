// The dot product both CPU attention kernels use: 8 lanes of fused multiply-adds summed in a fixed
// tree, so that the AVX2 code and the plain loop give the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace helios::kernels {

#if defined(__AVX2__) && defined(__FMA__)
// The 8 lanes of v summed in the tree the plain loop uses.
inline float sum_lanes(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
#endif

// a·b over n values.
inline float dot_lanes(const float* a, const float* b, int32_t n) {
  int32_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float sum = sum_lanes(acc);
#else
  float lanes[8] = {};
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] = std::fma(a[i + l], b[i + l], lanes[l]);
  const float a0 = lanes[0] + lanes[4], a1 = lanes[1] + lanes[5], a2 = lanes[2] + lanes[6],
              a3 = lanes[3] + lanes[7];
  float sum = (a0 + a2) + (a1 + a3);
#endif
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

}  // namespace helios::kernels
