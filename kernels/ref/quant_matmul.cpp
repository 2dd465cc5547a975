// Matrix products with quantized weights in blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): integer
// dot products per block, scaled by the weight's and the activation's block scales; the dispatch
// for every quantized type, and the activations' 8-bit rounding. K-quants: quant_matmul_k.cpp.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/kernels.h"
#include "kernels/ref/fp16.h"
#include "kernels/ref/quant_kernels.h"

namespace helios::kernels {
namespace {

using quant::Lanes;

bool uses_q8_1(uint32_t weight_type) { return weight_type == kWeightQ4_1 || weight_type == kWeightQ5_1; }
bool is_k_quant(uint32_t weight_type) {
  return weight_type == kWeightQ4_K || weight_type == kWeightQ5_K || weight_type == kWeightQ6_K;
}
int block_values(uint32_t weight_type) { return is_k_quant(weight_type) ? kQKK : kQK; }

// One block's scale and rounded values, as llama.cpp's x86 path computes them: d = amax/127
// stored as fp16, q = round-half-even(x · 127/amax).
int quantize_block(const float* x, int8_t* q, float* d_out) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (int j = 0; j < kQK; ++j) {
    q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
    sum += q[j];
  }
  *d_out = d;
  return sum;
}

// --- Scalar reference: each block's 32 products in 8 lanes (Lanes), the minimum of Q4_1/Q5_1
// times the activation block's sum s = d·Σq accumulated apart with a fused multiply-add.

// The 32 weight values of a 4-bit block as integers: low nibbles are elements 0..15, high 16..31.
inline void unpack_nibbles(const uint8_t* qs, int offset, int8_t* out) {
  for (int j = 0; j < kQK / 2; ++j) {
    out[j] = static_cast<int8_t>((qs[j] & 0xF) - offset);
    out[j + 16] = static_cast<int8_t>((qs[j] >> 4) - offset);
  }
}
// A 5-bit block: the nibbles plus bit j of qh as bit 4 of element j.
inline void unpack_q5(const uint8_t* qs, const uint8_t* qh, int offset, int8_t* out) {
  const uint32_t high = q5_high_bits(qh);
  for (int j = 0; j < kQK / 2; ++j) {
    out[j] = static_cast<int8_t>(((qs[j] & 0xF) | ((high >> j) & 1) << 4) - offset);
    out[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | ((high >> (j + 16)) & 1) << 4) - offset);
  }
}

inline void lane_sums(const int8_t* a, const int8_t* b, int32_t* out) {
  for (int i = 0; i < 8; ++i) {
    out[i] = a[4 * i] * b[4 * i] + a[4 * i + 1] * b[4 * i + 1] + a[4 * i + 2] * b[4 * i + 2] +
             a[4 * i + 3] * b[4 * i + 3];
  }
}

// Weight blocks W against activation blocks A; Unpack turns a weight block into 32 integers,
// Min (or nullptr) gives the weight block's minimum.
template <typename W, typename A, void (*Unpack)(const W&, int8_t*), bool kMin>
float dot_blocks(const W* w, const A* x, int nb) {
  Lanes acc;
  float sum_min = 0;
  int8_t qw[kQK];
  int32_t lanes[8];
  for (int b = 0; b < nb; ++b) {
    if constexpr (kMin) sum_min = std::fma(fp16_to_fp32(w[b].m), fp16_to_fp32(x[b].s), sum_min);
    Unpack(w[b], qw);
    lane_sums(qw, x[b].qs, lanes);
    acc.fma_block(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d), lanes);
  }
  return kMin ? acc.sum() + sum_min : acc.sum();
}

void unpack_q8_0(const BlockQ8_0& b, int8_t* out) { std::memcpy(out, b.qs, kQK); }
void unpack_q4_0(const BlockQ4_0& b, int8_t* out) { unpack_nibbles(b.qs, 8, out); }
void unpack_q4_1(const BlockQ4_1& b, int8_t* out) { unpack_nibbles(b.qs, 0, out); }
void unpack_q5_0(const BlockQ5_0& b, int8_t* out) { unpack_q5(b.qs, b.qh, 16, out); }
void unpack_q5_1(const BlockQ5_1& b, int8_t* out) { unpack_q5(b.qs, b.qh, 0, out); }

constexpr auto dot_q8_0 = dot_blocks<BlockQ8_0, BlockQ8_0, unpack_q8_0, false>;
constexpr auto dot_q4_0 = dot_blocks<BlockQ4_0, BlockQ8_0, unpack_q4_0, false>;
constexpr auto dot_q4_1 = dot_blocks<BlockQ4_1, BlockQ8_1, unpack_q4_1, true>;
constexpr auto dot_q5_0 = dot_blocks<BlockQ5_0, BlockQ8_0, unpack_q5_0, false>;
constexpr auto dot_q5_1 = dot_blocks<BlockQ5_1, BlockQ8_1, unpack_q5_1, true>;

// --- AVX2: the same arithmetic on 32 bytes at a time.
#if HELIOS_QUANT_AVX2
using quant::lane_sums_i8_avx2;
using quant::lane_sums_u8_avx2;
using quant::nibbles_avx2;
using quant::sum_lanes_avx2;

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 0x10 in byte j where bit j of a Q5 block's qh is set.
inline __m256i high_bits_avx2(const uint8_t* qh) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(q5_high_bits(qh))),
                                             _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

float dot_q8_0_avx2(const BlockQ8_0* w, const BlockQ8_0* x, int nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m256 scale = _mm256_set1_ps(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d));
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lane_sums_i8_avx2(load32(w[b].qs), load32(x[b].qs))), acc);
  }
  return sum_lanes_avx2(acc);
}

float dot_q4_0_avx2(const BlockQ4_0* w, const BlockQ8_0* x, int nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m256 scale = _mm256_set1_ps(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d));
    const __m256i qw = _mm256_sub_epi8(nibbles_avx2(w[b].qs), _mm256_set1_epi8(8));
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lane_sums_i8_avx2(qw, load32(x[b].qs))), acc);
  }
  return sum_lanes_avx2(acc);
}

float dot_q4_1_avx2(const BlockQ4_1* w, const BlockQ8_1* x, int nb) {
  float sum_min = 0;
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    sum_min = std::fma(fp16_to_fp32(w[b].m), fp16_to_fp32(x[b].s), sum_min);
    const __m256 scale = _mm256_set1_ps(fp16_to_fp32(w[b].d) * fp16_to_fp32(x[b].d));
    // 0..15: unsigned × signed needs no sign trick
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lane_sums_u8_avx2(nibbles_avx2(w[b].qs), load32(x[b].qs))), acc);
  }
  return sum_lanes_avx2(acc) + sum_min;
}

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
  for (int b = 0; b < nb; ++b) {
    __m256i qx[R];
    float xd[R], xs[R];
    for (int r = 0; r < R; ++r) {
      qx[r] = load32(x[r][b].qs);
      xd[r] = fp16_to_fp32(x[r][b].d);
      xs[r] = fp16_to_fp32(x[r][b].s);
    }
    for (int k = 0; k < 4; ++k) {
      const BlockQ4_1& wb = w[k][b];
      const float wd = fp16_to_fp32(wb.d), wm = fp16_to_fp32(wb.m);
      const __m256i qw = nibbles_avx2(wb.qs);
      for (int r = 0; r < R; ++r) {
        sum_min[r][k] = std::fma(wm, xs[r], sum_min[r][k]);
        const __m256 scale = _mm256_set1_ps(wd * xd[r]);
        acc[r][k] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lane_sums_u8_avx2(qw, qx[r])), acc[r][k]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < 4; ++k) out[r][k] = sum_lanes_avx2(acc[r][k]) + sum_min[r][k];
  }
}

void matmul_q4_1_tiles(const uint8_t* wb, int64_t w_row, const uint8_t* xb, int64_t x_row, int nb,
                       int32_t n_rows, int32_t n_out, int32_t o, float* y) {
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

// Q5_0 (signed, q − 16) and Q5_1 (unsigned, with a minimum): one weight block unpacked once for
// R activation rows, each row's sums in dot_q5_0 / dot_q5_1's order.
template <bool kMin>
struct DotQ5Avx2 {
  using W = std::conditional_t<kMin, BlockQ5_1, BlockQ5_0>;
  using A = std::conditional_t<kMin, BlockQ8_1, BlockQ8_0>;
  template <int R>
  void rows(const W* w, const A* const* x, int nb, float* out) const {
    __m256 acc[R];
    float sum_min[R];
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_setzero_ps();
      sum_min[r] = 0;
    }
    for (int b = 0; b < nb; ++b) {
      __m256i qw = _mm256_or_si256(nibbles_avx2(w[b].qs), high_bits_avx2(w[b].qh));
      if constexpr (!kMin) qw = _mm256_sub_epi8(qw, _mm256_set1_epi8(16));
      const float wd = fp16_to_fp32(w[b].d);
      for (int r = 0; r < R; ++r) {
        const A& xb = x[r][b];
        __m256i lanes;
        if constexpr (kMin) {
          sum_min[r] = std::fma(fp16_to_fp32(w[b].m), fp16_to_fp32(xb.s), sum_min[r]);
          lanes = lane_sums_u8_avx2(qw, load32(xb.qs));
        } else {
          lanes = lane_sums_i8_avx2(qw, load32(xb.qs));
        }
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd * fp16_to_fp32(xb.d)), _mm256_cvtepi32_ps(lanes), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[r] = kMin ? sum_lanes_avx2(acc[r]) + sum_min[r] : sum_lanes_avx2(acc[r]);
  }
};
#endif

int64_t weight_row_bytes(uint32_t type, int32_t n_in) {
  const int64_t nb = n_in / block_values(type);
  switch (type) {
    case kWeightQ4_0: return nb * sizeof(BlockQ4_0);
    case kWeightQ4_1: return nb * sizeof(BlockQ4_1);
    case kWeightQ5_0: return nb * sizeof(BlockQ5_0);
    case kWeightQ5_1: return nb * sizeof(BlockQ5_1);
    case kWeightQ4_K: return nb * sizeof(BlockQ4_K);
    case kWeightQ5_K: return nb * sizeof(BlockQ5_K);
    case kWeightQ6_K: return nb * sizeof(BlockQ6_K);
    default: return nb * sizeof(BlockQ8_0);
  }
}

// One (weight row, activation row) product of a 32-block type.
float dot_row(uint32_t type, bool vector, const uint8_t* w, const uint8_t* x, int nb) {
#if HELIOS_QUANT_AVX2
  if (vector) {
    switch (type) {
      case kWeightQ4_0: return dot_q4_0_avx2(reinterpret_cast<const BlockQ4_0*>(w), reinterpret_cast<const BlockQ8_0*>(x), nb);
      case kWeightQ4_1: return dot_q4_1_avx2(reinterpret_cast<const BlockQ4_1*>(w), reinterpret_cast<const BlockQ8_1*>(x), nb);
      default: return dot_q8_0_avx2(reinterpret_cast<const BlockQ8_0*>(w), reinterpret_cast<const BlockQ8_0*>(x), nb);
    }
  }
#else
  (void)vector;
#endif
  switch (type) {
    case kWeightQ4_0: return dot_q4_0(reinterpret_cast<const BlockQ4_0*>(w), reinterpret_cast<const BlockQ8_0*>(x), nb);
    case kWeightQ4_1: return dot_q4_1(reinterpret_cast<const BlockQ4_1*>(w), reinterpret_cast<const BlockQ8_1*>(x), nb);
    default: return dot_q8_0(reinterpret_cast<const BlockQ8_0*>(w), reinterpret_cast<const BlockQ8_0*>(x), nb);
  }
}

void matmul(uint32_t type, bool vector, const void* w, const void* xq, int32_t n_rows, int32_t n_in,
            int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  const int nb = n_in / block_values(type);
  if (quant::matmul_k_quant(type, vector, w, xq, nb, n_rows, n_out, out_begin, out_end, y)) return;
  if (type == kWeightQ5_0 || type == kWeightQ5_1) {
#if HELIOS_QUANT_AVX2
    if (vector) {
      if (type == kWeightQ5_0) {
        quant::matmul_rows<BlockQ5_0, BlockQ8_0>(DotQ5Avx2<false>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y);
      } else {
        quant::matmul_rows<BlockQ5_1, BlockQ8_1>(DotQ5Avx2<true>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y);
      }
      return;
    }
#endif
    if (type == kWeightQ5_0) {
      quant::matmul_rows<BlockQ5_0, BlockQ8_0>(quant::ScalarDot<BlockQ5_0, BlockQ8_0, dot_q5_0>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y);
    } else {
      quant::matmul_rows<BlockQ5_1, BlockQ8_1>(quant::ScalarDot<BlockQ5_1, BlockQ8_1, dot_q5_1>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y);
    }
    return;
  }
  const int64_t w_row = weight_row_bytes(type, n_in);
  const int64_t x_row = ref_activation_row_bytes(type, n_in);
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(xq);
  int32_t o = out_begin;
#if HELIOS_QUANT_AVX2
  // Q4_1 in groups of four weight rows (the common case for Q4_1 models).
  if (vector && type == kWeightQ4_1) {
    for (; o + 4 <= out_end; o += 4) matmul_q4_1_tiles(wb, w_row, xb, x_row, nb, n_rows, n_out, o, y);
  }
#endif
  // Each weight row is read once and used for every activation row while it is in cache.
  for (; o < out_end; ++o) {
    for (int32_t r = 0; r < n_rows; ++r) {
      y[static_cast<int64_t>(r) * n_out + o] = dot_row(type, vector, wb + o * w_row, xb + r * x_row, nb);
    }
  }
}

}  // namespace

bool ref_quantized_weight_type(uint32_t weight_type) {
  switch (weight_type) {
    case kWeightQ8_0: case kWeightQ4_0: case kWeightQ4_1: case kWeightQ5_0: case kWeightQ5_1:
    case kWeightQ4_K: case kWeightQ5_K: case kWeightQ6_K: return true;
    default: return false;
  }
}

int32_t ref_quantized_block_values(uint32_t weight_type) { return block_values(weight_type); }

int64_t ref_activation_row_bytes(uint32_t weight_type, int32_t n_in) {
  if (is_k_quant(weight_type)) return n_in / kQKK * static_cast<int64_t>(sizeof(BlockQ8_K));
  return n_in / kQK * static_cast<int64_t>(uses_q8_1(weight_type) ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0));
}

void ref_quantize_activations(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in,
                              void* xq) {
  const int nb = n_in / block_values(weight_type);
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * n_in;
    if (is_k_quant(weight_type)) {
      quant::quantize_q8_k(xr, static_cast<BlockQ8_K*>(xq) + static_cast<int64_t>(r) * nb, nb);
    } else if (uses_q8_1(weight_type)) {
      auto* out = static_cast<BlockQ8_1*>(xq) + static_cast<int64_t>(r) * nb;
      for (int b = 0; b < nb; ++b) {
        float d;
        const int sum = quantize_block(xr + b * kQK, out[b].qs, &d);
        out[b].d = fp32_to_fp16(d);
        out[b].s = fp32_to_fp16(d * static_cast<float>(sum));
      }
    } else {
      auto* out = static_cast<BlockQ8_0*>(xq) + static_cast<int64_t>(r) * nb;
      for (int b = 0; b < nb; ++b) {
        float d;
        quantize_block(xr + b * kQK, out[b].qs, &d);
        out[b].d = fp32_to_fp16(d);
      }
    }
  }
}

void ref_matmul_quantized(uint32_t weight_type, const void* w, const void* xq, int32_t n_rows,
                          int32_t n_in, int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  matmul(weight_type, true, w, xq, n_rows, n_in, n_out, out_begin, out_end, y);
}

void ref_matmul_quantized_scalar(uint32_t weight_type, const void* w, const void* xq, int32_t n_rows,
                                 int32_t n_in, int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  matmul(weight_type, false, w, xq, n_rows, n_in, n_out, out_begin, out_end, y);
}

bool ref_matmul_quantized_is_vector() {
#if HELIOS_QUANT_AVX2
  return true;
#else
  return false;
#endif
}

}  // namespace helios::kernels
