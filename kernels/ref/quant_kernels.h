// What the quantized matmul files share: the fixed order of float sums that makes the scalar
// reference and the vector code give the same bits, the AVX2 helpers, and the row driver.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HELIOS_QUANT_AVX2 1
#endif

#include "kernels/ref/quant_blocks.h"

namespace helios::kernels::quant {

// --- The order of float sums.
// A block's integer products are summed into 8 lanes (lane i: products 4i..4i+3 of each 32
// values; integer sums are exact, so their order does not matter); each lane accumulates
// scale·lane_sum with a fused multiply-add across blocks; the lanes are added at the end in a
// fixed tree order. This is AVX2's order (llama.cpp's x86 code), written out once in plain C++.
struct Lanes {
  float acc[8] = {};
  void fma_block(float scale, const int32_t* lane_sums) {
    for (int i = 0; i < 8; ++i) acc[i] = std::fma(scale, static_cast<float>(lane_sums[i]), acc[i]);
  }
  // ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))
  float sum() const {
    const float a0 = acc[0] + acc[4], a1 = acc[1] + acc[5], a2 = acc[2] + acc[6], a3 = acc[3] + acc[7];
    return (a0 + a2) + (a1 + a3);
  }
};

#if HELIOS_QUANT_AVX2
// The 8 lanes added in Lanes::sum's order.
inline float sum_lanes_avx2(__m256 acc) {
  __m128 x = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
// Unsigned 8-bit × signed 8-bit, each 4 consecutive products summed → 8 int32 lanes. No
// intermediate can saturate: every weight here is below 64 and every activation within ±128.
inline __m256i lane_sums_u8_avx2(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
// Signed × signed: the sign of a moves onto b, so |a| can be the unsigned side.
inline __m256i lane_sums_i8_avx2(__m256i a, __m256i b) {
  return lane_sums_u8_avx2(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}
// 16 bytes of packed nibbles → 32 bytes: low nibbles first, then high nibbles.
inline __m256i nibbles_avx2(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(packed), _mm_srli_epi16(packed, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0xF));
}
#endif

// --- The row driver.
// y[r, o] = dot(w[o], x[r]) for o in [out_begin, out_end) and every r < n_rows. Each weight row is
// taken against the activation rows four at a time (Dot::rows<4>, a register tile that unpacks
// the weights once), then one at a time. Dot::rows<R> computes each of its R results exactly as
// rows<1> would, so a row's result does not depend on how many rows the batch has.
template <typename W, typename A, typename Dot>
void matmul_rows(const Dot& dot, const void* w, const void* xq, int nb, int32_t n_rows,
                 int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  const auto* wb = static_cast<const W*>(w);
  const auto* xb = static_cast<const A*>(xq);
  for (int32_t o = out_begin; o < out_end; ++o) {
    const W* wo = wb + static_cast<int64_t>(o) * nb;
    int32_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
      const A* xs[4];
      for (int k = 0; k < 4; ++k) xs[k] = xb + static_cast<int64_t>(r + k) * nb;
      float v[4];
      dot.template rows<4>(wo, xs, nb, v);
      for (int k = 0; k < 4; ++k) y[static_cast<int64_t>(r + k) * n_out + o] = v[k];
    }
    for (; r < n_rows; ++r) {
      const A* xs[1] = {xb + static_cast<int64_t>(r) * nb};
      float v[1];
      dot.template rows<1>(wo, xs, nb, v);
      y[static_cast<int64_t>(r) * n_out + o] = v[0];
    }
  }
}

// A one-row reference dot product as a Dot for matmul_rows.
template <typename W, typename A, float (*F)(const W*, const A*, int)>
struct ScalarDot {
  template <int R>
  void rows(const W* w, const A* const* x, int nb, float* out) const {
    for (int r = 0; r < R; ++r) out[r] = F(w, x[r], nb);
  }
};

// --- The K-quant products (quant_matmul_k.cpp).
// Q8_K activations, as llama.cpp's quantize_row_q8_K: d = max/−127 of the value of largest
// magnitude, q = round-half-even(x·(−127/max)) (≤ 127), bsums per 16.
void quantize_q8_k(const float* x, BlockQ8_K* y, int nb);
// y as matmul_rows for Q4_K, Q5_K and Q6_K weights; `vector`: the AVX2 code where this build has
// it, else the scalar reference. False for other types.
bool matmul_k_quant(uint32_t weight_type, bool vector, const void* w, const void* xq, int nb,
                    int32_t n_rows, int32_t n_out, int32_t out_begin, int32_t out_end, float* y);

}  // namespace helios::kernels::quant
