// Matrix products with quantized weights: integer dot products per 32-value block, scaled by
// the weight's and the activation's block scales.
#include <cmath>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"

namespace helios::kernels {
namespace {

constexpr int kBlock = 32;

struct BlockQ8_0 { uint16_t d; int8_t qs[kBlock]; };              // x = d·q
struct BlockQ8_1 { uint16_t d; uint16_t s; int8_t qs[kBlock]; };  // s = d·Σq
struct BlockQ4_0 { uint16_t d; uint8_t qs[kBlock / 2]; };         // x = d·(q − 8)
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[kBlock / 2]; };  // x = d·q + m
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);

bool uses_q8_1(uint32_t weight_type) { return weight_type == kWeightQ4_1; }

// One block's scale and rounded values, as llama.cpp's x86 path computes them: d = amax/127
// stored as fp16, q = round-half-even(x · 127/amax).
int quantize_block(const float* x, int8_t* q, float* d_out) {
  float amax = 0;
  for (int j = 0; j < kBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (int j = 0; j < kBlock; ++j) {
    q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
    sum += q[j];
  }
  *d_out = d;
  return sum;
}

// --- Block dot products.
// Each block's 32 integer products are summed into 8 lanes of 4 consecutive products; each lane
// accumulates scale·lane_sum with a fused multiply-add across blocks; the lanes are added at the
// end in a fixed tree order. This is the natural AVX2 order, and it is written out once in plain
// C++ so the reference and the vector code give bit-identical results.

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

// The 32 weight values of a 4-bit block as integers: low nibbles are elements 0..15, high 16..31.
inline void unpack_nibbles(const uint8_t* qs, int offset, int8_t* out) {
  for (int j = 0; j < kBlock / 2; ++j) {
    out[j] = static_cast<int8_t>((qs[j] & 0xF) - offset);
    out[j + 16] = static_cast<int8_t>((qs[j] >> 4) - offset);
  }
}

inline void lane_sums(const int8_t* a, const int8_t* b, int32_t* out) {
  for (int i = 0; i < 8; ++i) {
    out[i] = a[4 * i] * b[4 * i] + a[4 * i + 1] * b[4 * i + 1] + a[4 * i + 2] * b[4 * i + 2] +
             a[4 * i + 3] * b[4 * i + 3];
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// Signed 8-bit products summed in groups of 4 → 8 float lanes.
inline __m256 lane_sums_avx2(__m256i a, __m256i b) {
  const __m256i abs_a = _mm256_sign_epi8(a, a);
  const __m256i b_signed = _mm256_sign_epi8(b, a);
  const __m256i pairs = _mm256_maddubs_epi16(abs_a, b_signed);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
inline __m256i nibbles_avx2(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(packed), _mm_srli_epi16(packed, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0xF));
}
inline float sum_lanes_avx2(__m256 acc) {
  __m128 x = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
#endif

float dot_q8_0(const BlockQ8_0* w, const BlockQ8_0* x, int nb) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m256 scale = _mm256_set1_ps(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d));
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    acc = _mm256_fmadd_ps(scale, lane_sums_avx2(qw, qx), acc);
  }
  return sum_lanes_avx2(acc);
#else
  Lanes acc;
  int32_t lanes[8];
  for (int b = 0; b < nb; ++b) {
    lane_sums(w[b].qs, x[b].qs, lanes);
    acc.fma_block(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d), lanes);
  }
  return acc.sum();
#endif
}

float dot_q4_0(const BlockQ4_0* w, const BlockQ8_0* x, int nb) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m256 scale = _mm256_set1_ps(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d));
    const __m256i qw = _mm256_sub_epi8(nibbles_avx2(w[b].qs), _mm256_set1_epi8(8));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    acc = _mm256_fmadd_ps(scale, lane_sums_avx2(qw, qx), acc);
  }
  return sum_lanes_avx2(acc);
#else
  Lanes acc;
  int8_t qw[kBlock];
  int32_t lanes[8];
  for (int b = 0; b < nb; ++b) {
    unpack_nibbles(w[b].qs, 8, qw);
    lane_sums(qw, x[b].qs, lanes);
    acc.fma_block(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d), lanes);
  }
  return acc.sum();
#endif
}

// Q4_1 adds each block's minimum times the activation block's sum (s = d·Σq) separately.
float dot_q4_1(const BlockQ4_1* w, const BlockQ8_1* x, int nb) {
  float sum_min = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    sum_min += fp16_to_fp32(w[b].m) * fp16_to_fp32(x[b].s);
    const __m256 scale = _mm256_set1_ps(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d));
    const __m256i qw = nibbles_avx2(w[b].qs);  // 0..15: unsigned × signed needs no sign trick
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256i pairs = _mm256_maddubs_epi16(qw, qx);
    const __m256 lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    acc = _mm256_fmadd_ps(scale, lanes, acc);
  }
  return sum_lanes_avx2(acc) + sum_min;
#else
  Lanes acc;
  int8_t qw[kBlock];
  int32_t lanes[8];
  for (int b = 0; b < nb; ++b) {
    sum_min += fp16_to_fp32(w[b].m) * fp16_to_fp32(x[b].s);
    unpack_nibbles(w[b].qs, 0, qw);
    lane_sums(qw, x[b].qs, lanes);
    acc.fma_block(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d), lanes);
  }
  return acc.sum() + sum_min;
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
// Four Q4_1 weight rows against R (1 or 2) activation rows, a register tile: each weight block is
// unpacked once for the R rows and each activation block loaded once for the four weight rows.
// Every output is computed with the same arithmetic, in the same order, as dot_q4_1, so the
// results are bit-identical to it (and so independent of the batch).
template <int R>
void dot4_q4_1(const BlockQ4_1* const w[4], const BlockQ8_1* const x[R], int nb, float out[R][4]) {
  __m256 acc[R][4];
  float sum_min[R][4];
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < 4; ++k) {
      acc[r][k] = _mm256_setzero_ps();
      sum_min[r][k] = 0;
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int b = 0; b < nb; ++b) {
    __m256i qx[R];
    float xd[R], xs[R];
    for (int r = 0; r < R; ++r) {
      qx[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r][b].qs));
      xd[r] = fp16_to_fp32(x[r][b].d);
      xs[r] = fp16_to_fp32(x[r][b].s);
    }
    for (int k = 0; k < 4; ++k) {
      const BlockQ4_1& wb = w[k][b];
      const float wd = fp16_to_fp32(wb.d), wm = fp16_to_fp32(wb.m);
      const __m256i qw = nibbles_avx2(wb.qs);
      for (int r = 0; r < R; ++r) {
        sum_min[r][k] += wm * xs[r];
        const __m256 scale = _mm256_set1_ps(wd * xd[r]);
        const __m256i pairs = _mm256_maddubs_epi16(qw, qx[r]);
        acc[r][k] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), acc[r][k]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < 4; ++k) out[r][k] = sum_lanes_avx2(acc[r][k]) + sum_min[r][k];
  }
}
#endif

int64_t weight_row_bytes(uint32_t type, int32_t n_in) {
  const int64_t nb = n_in / kBlock;
  switch (type) {
    case kWeightQ4_0: return nb * sizeof(BlockQ4_0);
    case kWeightQ4_1: return nb * sizeof(BlockQ4_1);
    default: return nb * sizeof(BlockQ8_0);
  }
}

}  // namespace

int64_t ref_activation_row_bytes(uint32_t weight_type, int32_t n_in) {
  return n_in / kBlock * static_cast<int64_t>(uses_q8_1(weight_type) ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0));
}

void ref_quantize_activations(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in,
                              void* xq) {
  const int nb = n_in / kBlock;
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * n_in;
    if (uses_q8_1(weight_type)) {
      auto* out = static_cast<BlockQ8_1*>(xq) + static_cast<int64_t>(r) * nb;
      for (int b = 0; b < nb; ++b) {
        float d;
        const int sum = quantize_block(xr + b * kBlock, out[b].qs, &d);
        out[b].d = fp32_to_fp16(d);
        out[b].s = fp32_to_fp16(d * static_cast<float>(sum));
      }
    } else {
      auto* out = static_cast<BlockQ8_0*>(xq) + static_cast<int64_t>(r) * nb;
      for (int b = 0; b < nb; ++b) {
        float d;
        quantize_block(xr + b * kBlock, out[b].qs, &d);
        out[b].d = fp32_to_fp16(d);
      }
    }
  }
}

void ref_matmul_quantized(uint32_t weight_type, const void* w, const void* xq, int32_t n_rows,
                          int32_t n_in, int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  const int nb = n_in / kBlock;
  const int64_t w_row = weight_row_bytes(weight_type, n_in);
  const int64_t x_row = ref_activation_row_bytes(weight_type, n_in);
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(xq);
  int32_t o = out_begin;
#if defined(__AVX2__) && defined(__FMA__)
  // Q4_1 in groups of four weight rows (the common case for Q4_1 models).
  if (weight_type == kWeightQ4_1) {
    for (; o + 4 <= out_end; o += 4) {
      const BlockQ4_1* rows[4];
      for (int k = 0; k < 4; ++k) rows[k] = reinterpret_cast<const BlockQ4_1*>(wb + (o + k) * w_row);
      int32_t r = 0;
      for (; r + 2 <= n_rows; r += 2) {
        const BlockQ8_1* xs[2] = {reinterpret_cast<const BlockQ8_1*>(xb + r * x_row),
                                  reinterpret_cast<const BlockQ8_1*>(xb + (r + 1) * x_row)};
        float v[2][4];
        dot4_q4_1<2>(rows, xs, nb, v);
        for (int i = 0; i < 2; ++i)
          for (int k = 0; k < 4; ++k) y[static_cast<int64_t>(r + i) * n_out + o + k] = v[i][k];
      }
      for (; r < n_rows; ++r) {
        const BlockQ8_1* xs[1] = {reinterpret_cast<const BlockQ8_1*>(xb + r * x_row)};
        float v[1][4];
        dot4_q4_1<1>(rows, xs, nb, v);
        for (int k = 0; k < 4; ++k) y[static_cast<int64_t>(r) * n_out + o + k] = v[0][k];
      }
    }
  }
#endif
  // Each weight row is read once and used for every activation row while it is in cache.
  for (; o < out_end; ++o) {
    const uint8_t* wo = wb + o * w_row;
    for (int32_t r = 0; r < n_rows; ++r) {
      const uint8_t* xr = xb + r * x_row;
      float v;
      switch (weight_type) {
        case kWeightQ4_0: v = dot_q4_0(reinterpret_cast<const BlockQ4_0*>(wo), reinterpret_cast<const BlockQ8_0*>(xr), nb); break;
        case kWeightQ4_1: v = dot_q4_1(reinterpret_cast<const BlockQ4_1*>(wo), reinterpret_cast<const BlockQ8_1*>(xr), nb); break;
        default: v = dot_q8_0(reinterpret_cast<const BlockQ8_0*>(wo), reinterpret_cast<const BlockQ8_0*>(xr), nb); break;
      }
      y[static_cast<int64_t>(r) * n_out + o] = v;
    }
  }
}

}  // namespace helios::kernels
