// What the quantized matmul files share: the fixed order of float sums that makes the scalar
// reference and the vector code give the same bits, the AVX2 helpers, and the row driver.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

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
// The largest of 8 floats.
inline float max_lanes_avx2(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
// The sum of 8 int32 lanes.
inline int32_t sum_epi32_avx2(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(x);
}
// 32 floats times `scale`, rounded half to even (as nearbyint in the default rounding mode), as
// int32 in q[0..3] (8 each, in order).
inline void round_scaled_avx2(const float* x, float scale, __m256i q[4]) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int i = 0; i < 4; ++i)
    q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), s),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// 32 int32 values (each within int8) stored as 32 bytes, in order.
inline void store_int8x32_avx2(const __m256i q[4], int8_t* out) {
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  // the packs work per 128-bit half: put the 4-byte groups back in order
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
// 16 bytes of packed nibbles → 32 bytes: low nibbles first, then high nibbles.
inline __m256i nibbles_avx2(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(packed), _mm_srli_epi16(packed, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0xF));
}
// acc + madd(a, b): pairs of int16 products summed into int32 lanes, then added; one VNNI
// instruction where the CPU has it. The same integers either way (dpwssd does not saturate).
inline __m256i madd_add_avx2(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}
// 8 bytes at p in every 64-bit lane, loaded straight into the register (vpbroadcastq m64).
inline __m256i broadcast8_avx2(const void* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm256_set1_epi64x(v);
}
#endif
// Activation rows per tile in the kernels that keep a 256-bit sum per row: AVX-512VL's 32 vector
// registers hold 8 rows' sums beside the unpacked weights; AVX2's 16 hold 4 (8 spill to the
// stack on every sub-block).
#if defined(__AVX512VL__)
inline constexpr int kSumRowsPerTile = 8;
#else
inline constexpr int kSumRowsPerTile = 4;
#endif

// Activation rows from which the AVX-512 kernels pair weight rows in 512-bit registers. Below it
// a step streams its weights from memory faster one group at a time (measured on an AVX-512
// EPYC, weights larger than the caches: at 4-8 rows the paired tiles ran 1.2-2x slower, at 16
// rows 1.0-1.3x faster, at 32 1.3-1.5x).
inline constexpr int32_t kPairedMinRows = 16;

// --- The tile drivers.
// y[r, o] = dot(w[o], x[r]) for o in [out_begin, out_end) and every r < n_rows, in register tiles
// of K weight rows × R activation rows, so that a weight block is unpacked once for R activation
// rows and an activation block read once for K weight rows. A tile computes each of its results
// exactly as a tile of 1 × 1 would, so a result depends neither on its tile, nor on the batch,
// nor on the thread split.

// A tile's results v[i·K + k] into y[r + i, o + k].
template <int K, int R>
inline void store_tile(const float* v, int32_t o, int32_t r, int32_t n_out, float* y) {
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < K; ++k) y[static_cast<int64_t>(r + i) * n_out + o + k] = v[i * K + k];
}

// The activation rows go in chunks (of whole tiles) that stay in L2 while every weight row
// passes over them.
inline int32_t row_chunk(int64_t row_bytes, int R) {
  const int64_t fit = 512 * 1024 / row_bytes;
  return static_cast<int32_t>(fit < R ? R : fit - fit % R);
}

// f.template operator()<n>(i) over [i, end): in steps of N while they fit, then of N/2, ..., 1.
template <int N, typename F>
inline void steps(int32_t i, int32_t end, F&& f) {
  for (; i + N <= end; i += N) f.template operator()<N>(i);
  if constexpr (N > 1) steps<N / 2>(i, end, f);
}

// f.template operator()<end - i>(i) when end - i is M or less (and more than 0).
template <int M, typename F>
inline void tail_step(int32_t i, int32_t end, F&& f) {
  if (end - i == M) {
    f.template operator()<M>(i);
  } else if constexpr (M > 1) {
    tail_step<M - 1>(i, end, f);
  }
}

// As steps<N>, but what is left after the steps of N goes in one step of its own size (1 to
// N - 1): over activation rows, the weights then pass over them once, not once per power of two
// (3 rows were a tile of 2 and one of 1, costing about what 4 rows do).
template <int N, typename F>
inline void steps_exact(int32_t i, int32_t end, F&& f) {
  for (; i + N <= end; i += N) f.template operator()<N>(i);
  if constexpr (N > 1) tail_step<N - 1>(i, end, f);
}

// The tiles over weight rows [out_begin, out_end) × activation rows [r0, r1): group(o, k) before
// the k weight rows from o, then tile.template operator()<K', R'>(o, r) for each tile of them,
// the edges in tiles of halving sizes.
template <int K, int R, typename Group, typename Tile>
void walk_tiles(int32_t out_begin, int32_t out_end, int32_t r0, int32_t r1, Group&& group, Tile&& tile) {
  steps<K>(out_begin, out_end, [&]<int KT>(int32_t o) {
    group(o, KT);
    steps<R>(r0, r1, [&]<int RT>(int32_t r) { tile.template operator()<KT, RT>(o, r); });
  });
}

// Over the blocks as they are: Dot::tile<K, R>(weight rows, activation rows, nb, out[R·K]).
template <typename W, typename A, int K, int R, typename Dot>
void matmul_tiles(const Dot& dot, const void* w, const void* xq, int nb, int32_t n_rows,
                  int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  const auto* wb = static_cast<const W*>(w);
  const auto* xb = static_cast<const A*>(xq);
  const int32_t chunk = row_chunk(static_cast<int64_t>(nb) * sizeof(A), R);
  for (int32_t r0 = 0; r0 < n_rows; r0 += chunk) {
    const int32_t r1 = n_rows - r0 < chunk ? n_rows : r0 + chunk;
    walk_tiles<K, R>(out_begin, out_end, r0, r1, [](int32_t, int) {}, [&]<int KT, int RT>(int32_t o, int32_t r) {
      const W* ws[KT];
      const A* xs[RT];
      for (int k = 0; k < KT; ++k) ws[k] = wb + static_cast<int64_t>(o + k) * nb;
      for (int i = 0; i < RT; ++i) xs[i] = xb + static_cast<int64_t>(r + i) * nb;
      float v[RT * KT];
      dot.template tile<KT, RT>(ws, xs, nb, v);
      store_tile<KT, RT>(v, o, r, n_out, y);
    });
  }
}

// A one-row reference dot product as a Dot for matmul_tiles.
template <typename W, typename A, float (*F)(const W*, const A*, int)>
struct ScalarDot {
  template <int K, int R>
  void tile(const W* const* w, const A* const* x, int nb, float* out) const {
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < K; ++k) out[r * K + k] = F(w[k], x[r], nb);
  }
};

// --- The K-quant products (quant_matmul_k.cpp).
// Q8_K activations, as llama.cpp's quantize_row_q8_K: d = max/−127 of the value of largest
// magnitude, q = round-half-even(x·(−127/max)) (≤ 127), bsums per 16.
void quantize_q8_k(const float* x, BlockQ8_K* y, int nb, bool vector);
// y as matmul_tiles for Q4_K, Q5_K and Q6_K weights; `vector`: the AVX2 code where this build has
// it, else the scalar reference. False for other types.
bool matmul_k_quant(uint32_t weight_type, bool vector, const void* w, const void* xq, int nb,
                    int32_t n_rows, int32_t n_out, int32_t out_begin, int32_t out_end, float* y);

}  // namespace helios::kernels::quant
