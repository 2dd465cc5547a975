// Matrix products with K-quant weights (Q4_K, Q5_K, Q6_K) against Q8_K activations, with the
// arithmetic of llama.cpp's x86 code: per super-block, the integer products of each sub-block
// times its 6- or 8-bit scale summed in 8 int32 lanes, then one fused multiply-add per lane with
// d = d_x·d_w; Q4_K/Q5_K's minimums through the activations' 16-value sums (bsums), so that
// min·Σx costs one multiply per sub-block. The scalar reference follows the same order.
#include <cstring>
#include <type_traits>

#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/quant_kernels.h"

namespace helios::kernels::quant {
namespace {

// Sub-block j's activation sum (32 values) from the 16-value sums.
inline int32_t sum32(const BlockQ8_K& x, int j) { return x.bsums[2 * j] + x.bsums[2 * j + 1]; }

// Σ_j m_j·Σx_j in 4 int32 lanes, lane k = sub-blocks 2k and 2k+1 (the pairs _mm_madd_epi16 forms).
inline void min_lanes(const uint8_t* mins, const BlockQ8_K& x, int32_t out[4]) {
  for (int k = 0; k < 4; ++k) out[k] = mins[2 * k] * sum32(x, 2 * k) + mins[2 * k + 1] * sum32(x, 2 * k + 1);
}

inline void scales_mins(const uint8_t* packed, uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 8; ++j) k_quant_scale_min(j, packed, &sc[j], &mn[j]);
}

// --- Scalar reference.

// One super-block of Q4_K or Q5_K (qh null for Q4_K) into the running sums: the 4 min lanes are kept as floats and added last,
// ((m0+m2) + (m1+m3)), for Q4_K; Q5_K sums them as integers and keeps one float, as llama.cpp does.
template <bool kFiveBits>
void accumulate_q45_k(const uint8_t* qs, const uint8_t* qh, const uint8_t* packed_scales, float wd,
                float wdmin, const BlockQ8_K& x, Lanes& acc, float* acc_m, float& summs) {
  uint8_t sc[8], mn[8];
  scales_mins(packed_scales, sc, mn);
  int32_t lanes[8] = {};
  for (int j = 0; j < 8; ++j) {
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    const int8_t* a = x.qs + 32 * j;
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0xF;
      if (kFiveBits) v |= ((qh[l] >> j) & 1) << 4;
      lanes[l / 4] += sc[j] * v * a[l];
    }
  }
  acc.fma_block(x.d * wd, lanes);
  const float dmin = -x.d * wdmin;
  int32_t m[4];
  min_lanes(mn, x, m);
  if (kFiveBits) {
    summs = std::fma(dmin, static_cast<float>(m[0] + m[1] + m[2] + m[3]), summs);
  } else {
    for (int k = 0; k < 4; ++k) acc_m[k] = std::fma(dmin, static_cast<float>(m[k]), acc_m[k]);
  }
}

float dot_q4_k(const BlockQ4_K* w, const BlockQ8_K* x, int nb) {
  Lanes acc;
  float acc_m[4] = {}, unused = 0;
  for (int b = 0; b < nb; ++b) {
    accumulate_q45_k<false>(w[b].qs, nullptr, w[b].scales, fp16_to_fp32(w[b].d), fp16_to_fp32(w[b].dmin), x[b], acc, acc_m, unused);
  }
  return acc.sum() + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
}

float dot_q5_k(const BlockQ5_K* w, const BlockQ8_K* x, int nb) {
  Lanes acc;
  float unused[4] = {}, summs = 0;
  for (int b = 0; b < nb; ++b) {
    accumulate_q45_k<true>(w[b].qs, w[b].qh, w[b].scales, fp16_to_fp32(w[b].d), fp16_to_fp32(w[b].dmin), x[b], acc, unused, summs);
  }
  return acc.sum() + summs;
}

float dot_q6_k(const BlockQ6_K* w, const BlockQ8_K* x, int nb) {
  Lanes acc;
  for (int b = 0; b < nb; ++b) {
    int32_t lanes[8] = {};
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = w[b].ql + 64 * half;
      const uint8_t* qh = w[b].qh + 32 * half;
      const int n0 = 128 * half;
      for (int l = 0; l < 32; ++l) {
        const int q[4] = {(ql[l] & 0xF) | ((qh[l] & 3) << 4), (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                          (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4), (ql[l + 32] >> 4) | ((qh[l] >> 6) << 4)};
        for (int g = 0; g < 4; ++g) {
          const int n = n0 + 32 * g + l;
          lanes[l / 4] += w[b].scales[n / 16] * q[g] * x[b].qs[n];
        }
      }
    }
    // The offset −32 through the group sums: lane i takes groups 2i and 2i+1.
    for (int i = 0; i < 8; ++i) {
      lanes[i] -= 32 * (x[b].bsums[2 * i] * w[b].scales[2 * i] + x[b].bsums[2 * i + 1] * w[b].scales[2 * i + 1]);
    }
    acc.fma_block(x[b].d * fp16_to_fp32(w[b].d), lanes);
  }
  return acc.sum();
}

// --- AVX2: one weight row against R activation rows, sub-block by sub-block, so that each
// sub-block's weights are unpacked once for the R rows; every result takes the scalar
// reference's sums in its order (the integer sums are exact).
#if HELIOS_QUANT_AVX2
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The 4 float min lanes added as Q4_K's scalar reference adds them.
inline float sum4_avx2(__m128 x) {
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// A Q4_K/Q5_K super-block's 8 scales (low 128 bits) and 8 mins (high) as 16-bit integers:
// k_quant_scale_min for all j at once, on 32-bit words.
inline __m256i scales_mins_avx2(const uint8_t* packed) {
  uint32_t u[3];
  std::memcpy(u, packed, 12);
  constexpr uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
  const uint32_t sc_lo = u[0] & low6, sc_hi = (u[2] & low4) | ((u[0] >> 6) & low2) << 4;
  const uint32_t mn_lo = u[1] & low6, mn_hi = ((u[2] >> 4) & low4) | ((u[1] >> 6) & low2) << 4;
  return _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi),
                                             static_cast<int>(mn_lo), static_cast<int>(mn_hi)));
}

// Sub-block j (32 weights q, 16-bit scales) against the R activation rows' super-block b, into
// their 8 int32 lanes. The empty asm keeps each row's running sum in its register: left free, the
// compiler reassociates the sums of a whole super-block into partial products that spill.
template <int R>
inline void sub_block_avx2(__m256i q, __m256i scale, const BlockQ8_K* const* x, int b, int j, __m256i* sumi) {
  for (int r = 0; r < R; ++r) {
    const __m256i p = _mm256_maddubs_epi16(q, load256(x[r][b].qs + 32 * j));
    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(scale, p));
    asm("" : "+x"(sumi[r]));
  }
}

template <bool kFiveBits>
struct DotQ45KAvx2 {
  using W = std::conditional_t<kFiveBits, BlockQ5_K, BlockQ4_K>;
  template <int K, int R>
  void tile(const W* const* wr, const BlockQ8_K* const* x, int nb, float* out) const {
    static_assert(K == 1, "one weight row, whose unpacked sub-block serves the R rows");
    const W* w = wr[0];
    __m256 acc[R];
    __m128 acc_m[R];
    float summs[R];
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_setzero_ps();
      acc_m[r] = _mm_setzero_ps();
      summs[r] = 0;
    }
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    for (int b = 0; b < nb; ++b) {
      const W& wb = w[b];
      const __m256i sm = scales_mins_avx2(wb.scales);
      const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);  // in both halves
      const __m128i mins = _mm256_extracti128_si256(sm, 1);
      __m256i sumi[R];
      for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i bits = load256(wb.qs + 32 * (j / 2));
        __m256i q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(bits, 4) : bits, m4);
        if constexpr (kFiveBits) {
          q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(load256(wb.qh), j), one), 4));
        }
        const __m256i scale = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>((2 * j + 1) << 8 | 2 * j)));
        sub_block_avx2<R>(q, scale, x, b, j, sumi);
      }
      const float wd = fp16_to_fp32(wb.d), wdmin = fp16_to_fp32(wb.dmin);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_K& xb = x[r][b];
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * wd), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        // The 4 min lanes as min_lanes: sub-blocks 2i and 2i+1 in lane i, from the activations'
        // 32-value sums (16-bit lane j: sub-block j).
        const __m128i sums = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums)),
                                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums + 8)));
        const __m128i m = _mm_madd_epi16(mins, sums);
        const float dmin = -xb.d * wdmin;
        if constexpr (kFiveBits) {
          const __m128i s2 = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
          const int32_t isum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
          summs[r] = std::fma(dmin, static_cast<float>(isum), summs[r]);
        } else {
          acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(m), acc_m[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) out[r] = sum_lanes_avx2(acc[r]) + (kFiveBits ? summs[r] : sum4_avx2(acc_m[r]));
  }
};

struct DotQ6KAvx2 {
  template <int K, int R>
  void tile(const BlockQ6_K* const* wr, const BlockQ8_K* const* x, int nb, float* out) const {
    static_assert(K == 1, "one weight row, whose unpacked sub-block serves the R rows");
    const BlockQ6_K* w = wr[0];
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    for (int b = 0; b < nb; ++b) {
      const BlockQ6_K& wb = w[b];
      const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.scales));
      __m256i sumi[R];
      for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
      // Group g of 32 values, in half g / 4: 4 bits from ql (low or high nibbles of one of two
      // 32-byte rows) and 2 from qh; its two scales of 16, the first in the low 128 bits.
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const int half = g / 4, i = g % 4;
        const __m256i lo = load256(wb.ql + 64 * half + 32 * (i % 2));
        const __m256i top = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(load256(wb.qh + 32 * half), 2 * i), m3), 4);
        const __m256i q = _mm256_or_si256(_mm256_and_si256(i < 2 ? lo : _mm256_srli_epi16(lo, 4), m4), top);
        const __m128i pick = _mm_unpacklo_epi64(_mm_set1_epi8(static_cast<char>(2 * g)), _mm_set1_epi8(static_cast<char>(2 * g + 1)));
        sub_block_avx2<R>(q, _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick)), x, b, g, sumi);
      }
      const __m256i scales16 = _mm256_cvtepi8_epi16(scales);
      const float wd = fp16_to_fp32(wb.d);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_K& xb = x[r][b];
        // The offset −32: 32·(sc·bsum) per pair of groups, as the scalar reference subtracts it.
        const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(load256(xb.bsums), scales16), 5);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * wd), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[r], offset)), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[r] = sum_lanes_avx2(acc[r]);
  }
};
#endif

}  // namespace

#if HELIOS_QUANT_AVX2
// The same super-block 8 floats at a time: the largest magnitude first, then the first value
// that has it (the scalar loop keeps the first on a tie), and the scalar code's products and
// rounding value by value.
void quantize_q8_k_avx2(const float* x, BlockQ8_K* y) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int j = 0; j < kQKK; j += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
  const float amax = max_lanes_avx2(m);
  if (amax == 0) {
    std::memset(y, 0, sizeof(BlockQ8_K));
    return;
  }
  const __m256 target = _mm256_set1_ps(amax);
  float max = 0;
  for (int j = 0; j < kQKK; j += 8) {
    const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), target, _CMP_EQ_OQ));
    if (hits) {
      max = x[j + __builtin_ctz(static_cast<unsigned>(hits))];
      break;
    }
  }
  const float iscale = -127.0f / max;
  const __m256i top = _mm256_set1_epi32(127);
  for (int j = 0; j < kQKK; j += 32) {
    __m256i v[4];
    round_scaled_avx2(x + j, iscale, v);
    for (auto& q : v) q = _mm256_min_epi32(q, top);
    store_int8x32_avx2(v, y->qs + j);
    y->bsums[j / 16] = static_cast<int16_t>(sum_epi32_avx2(_mm256_add_epi32(v[0], v[1])));
    y->bsums[j / 16 + 1] = static_cast<int16_t>(sum_epi32_avx2(_mm256_add_epi32(v[2], v[3])));
  }
  y->d = 1.0f / iscale;
}
#endif

void quantize_q8_k(const float* x, BlockQ8_K* y, int nb, bool vector) {
#if HELIOS_QUANT_AVX2
  if (vector) {
    for (int b = 0; b < nb; ++b) quantize_q8_k_avx2(x + static_cast<int64_t>(b) * kQKK, y + b);
    return;
  }
#endif
  (void)vector;
  for (int b = 0; b < nb; ++b, x += kQKK) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQKK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQKK; ++j) {
      const int v = static_cast<int>(std::nearbyint(iscale * x[j]));
      y[b].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < kQKK / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[b].qs[16 * g + j];
      y[b].bsums[g] = static_cast<int16_t>(sum);
    }
    y[b].d = 1.0f / iscale;
  }
}

bool matmul_k_quant(uint32_t weight_type, bool vector, const void* w, const void* xq, int nb,
                    int32_t n_rows, int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
#if HELIOS_QUANT_AVX2
  if (vector) {
    switch (weight_type) {
      case kWeightQ4_K: matmul_tiles<BlockQ4_K, BlockQ8_K, 1, 8>(DotQ45KAvx2<false>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y); return true;
      case kWeightQ5_K: matmul_tiles<BlockQ5_K, BlockQ8_K, 1, 8>(DotQ45KAvx2<true>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y); return true;
      case kWeightQ6_K: matmul_tiles<BlockQ6_K, BlockQ8_K, 1, 8>(DotQ6KAvx2{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y); return true;
      default: return false;
    }
  }
#else
  (void)vector;
#endif
  switch (weight_type) {
    case kWeightQ4_K: matmul_tiles<BlockQ4_K, BlockQ8_K, 1, 1>(ScalarDot<BlockQ4_K, BlockQ8_K, dot_q4_k>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y); return true;
    case kWeightQ5_K: matmul_tiles<BlockQ5_K, BlockQ8_K, 1, 1>(ScalarDot<BlockQ5_K, BlockQ8_K, dot_q5_k>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y); return true;
    case kWeightQ6_K: matmul_tiles<BlockQ6_K, BlockQ8_K, 1, 1>(ScalarDot<BlockQ6_K, BlockQ8_K, dot_q6_k>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y); return true;
    default: return false;
  }
}

}  // namespace helios::kernels::quant
