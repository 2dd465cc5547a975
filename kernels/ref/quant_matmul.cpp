// Matrix products with quantized weights in blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): integer
// dot products per block, scaled by the weight's and the activation's block scales; the dispatch
// for every quantized type, and the activations' 8-bit rounding. K-quants: quant_matmul_k.cpp.
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

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
int quantize_block_scalar(const float* x, int8_t* q, float* d_out) {
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

#if HELIOS_QUANT_AVX2
// The same block 8 floats at a time: the maximum is exact in any order, and the products and
// their rounding are the scalar code's, value by value.
int quantize_block_avx2(const float* x, int8_t* q, float* d_out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + 8 * i), abs_mask));
  const float amax = quant::max_lanes_avx2(m);
  __m256i v[4];
  quant::round_scaled_avx2(x, amax != 0.0f ? 127.0f / amax : 0.0f, v);
  quant::store_int8x32_avx2(v, q);
  *d_out = amax / 127.0f;
  return quant::sum_epi32_avx2(_mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3])));
}
#endif

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
using quant::nibbles_avx2;
using quant::sum_lanes_avx2;

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Unsigned bytes a times signed bytes b, summed 4 by 4 into 8 int32 lanes (lane i: bytes
// 4i..4i+3): one VNNI instruction where the CPU has it, else maddubs then madd. The same integers
// either way: no 16-bit pair sum saturates here (weights at most 128 in size, activations at most
// 127), so llama.cpp's bits stay.
inline __m256i dot4_u8s8(__m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}
// acc + dot4_u8s8(a, b): one instruction with VNNI, which accumulates as it multiplies.
inline __m256i dot4_u8s8_add(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, dot4_u8s8(a, b));
#endif
}

// 0x10 in byte j where bit j of a Q5 block's qh is set.
inline __m256i high_bits_avx2(const uint8_t* qh) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(q5_high_bits(qh))),
                                             _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// How the vector code reads each weight type's block: its 32 values as bytes (Q8_0: signed,
// then the sign moves onto the activations), as nibbles, or as nibbles and fifth bits, less
// Offset (Q4_0, Q5_0). The types with a minimum take it against the Q8_1 activations' sums.
enum class Bits { kEight, kFour, kFive };
template <typename Block, typename Act, Bits B, int Offset>
struct Type32 {
  using W = Block;
  using A = Act;
  static constexpr bool kSigned = B == Bits::kEight;
  static constexpr int kOffset = Offset;
  static __m256i values(const W& b) {
    if constexpr (B == Bits::kEight) return load32(b.qs);
    else if constexpr (B == Bits::kFour) return nibbles_avx2(b.qs);
    else return _mm256_or_si256(nibbles_avx2(b.qs), high_bits_avx2(b.qh));
  }
  // The values as the unpacked tiles keep them. VNNI multiplies unsigned by signed bytes into
  // int32 without saturating, so Q8_0's signed bytes are stored biased by 128 and the bias comes
  // off as an offset does: Σ(q+128)·x − 128·Σx = Σq·x, the same integers as the sign moves.
  // Without VNNI the 16-bit pair sums of 255·127 would saturate, so the signs move.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  static constexpr bool kUnpackedSigned = false;
  static constexpr int kUnpackedOffset = B == Bits::kEight ? 128 : Offset;
  static __m256i unpacked_values(const W& b) {
    if constexpr (B == Bits::kEight) return _mm256_xor_si256(load32(b.qs), _mm256_set1_epi8(static_cast<char>(0x80)));
    else return values(b);
  }
#else
  static constexpr bool kUnpackedSigned = kSigned;
  static constexpr int kUnpackedOffset = Offset;
  static __m256i unpacked_values(const W& b) { return values(b); }
#endif
};
using Q8_0Avx2 = Type32<BlockQ8_0, BlockQ8_0, Bits::kEight, 0>;
using Q4_0Avx2 = Type32<BlockQ4_0, BlockQ8_0, Bits::kFour, 8>;
using Q4_1Avx2 = Type32<BlockQ4_1, BlockQ8_1, Bits::kFour, 0>;
using Q5_0Avx2 = Type32<BlockQ5_0, BlockQ8_0, Bits::kFive, 16>;
using Q5_1Avx2 = Type32<BlockQ5_1, BlockQ8_1, Bits::kFive, 0>;

// Rows of 32-value blocks as the tiles read them, unpacked: the values as bytes, 32-byte aligned
// (no load splits a cache line), the scales and the minimums (or the activations' block sums) as
// floats, rows padded to whole groups of 8 blocks. A view is passed by value, so that the tile
// keeps its pointers in registers.
struct Unpacked {
  struct alignas(32) Bytes { int8_t v[32]; };
  const Bytes* qs;
  const float *ds, *ms;
  const float* ms_by_block;  // weights: the minimums of the (up to 4) rows block by block, [b][4]
  int stride;

  static constexpr int kGroup = 8;  // the tile forms this many blocks' scales at a time
  __m256i q(int32_t r, int b) const { return _mm256_load_si256(reinterpret_cast<const __m256i*>(qs[r * stride + b].v)); }
  float d(int32_t r, int b) const { return ds[r * stride + b]; }
  float m(int32_t r, int b) const { return ms[r * stride + b]; }
  // wd·xd for the 8 blocks from b.
  void scales(int32_t r, int b, const Unpacked& x, int32_t xr, float* out) const {
    _mm256_store_ps(out, _mm256_mul_ps(_mm256_loadu_ps(&ds[r * stride + b]), _mm256_loadu_ps(&x.ds[xr * x.stride + b])));
  }
};

// The storage behind an Unpacked view, kept by each thread from call to call.
struct UnpackedRows {
  int stride = 0;
  std::vector<Unpacked::Bytes> qs;
  std::vector<float> ds, ms, ms_by_block;

  template <typename B, typename Values>
  void unpack(const B* blocks, int32_t rows, int nb, Values values) {
    stride = (nb + 7) & ~7;
    const size_t n = static_cast<size_t>(rows) * stride;
    if (qs.size() < n) {
      qs.resize(n);
      ds.resize(n);
      ms.resize(n);
    }
    for (int32_t r = 0; r < rows; ++r) {
      const B* row = blocks + static_cast<int64_t>(r) * nb;
      const size_t at = static_cast<size_t>(r) * stride;
      for (int b = 0; b < nb; ++b) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(qs[at + b].v), values(row[b]));
        ds[at + b] = fp16_to_fp32(row[b].d);
        if constexpr (requires { row[b].m; }) ms[at + b] = fp16_to_fp32(row[b].m);
        if constexpr (requires { row[b].s; }) ms[at + b] = fp16_to_fp32(row[b].s);
      }
      for (int b = nb; b < stride; ++b) ds[at + b] = ms[at + b] = 0;
    }
    if constexpr (requires { blocks[0].m; }) {
      if (rows <= 4) {
        ms_by_block.assign(static_cast<size_t>(stride) * 4, 0.0f);
        for (int32_t r = 0; r < rows; ++r)
          for (int b = 0; b < nb; ++b) ms_by_block[4 * b + r] = ms[static_cast<size_t>(r) * stride + b];
      }
    }
  }
  Unpacked from(int32_t row) const {
    const size_t at = static_cast<size_t>(row) * stride;
    return {qs.data() + at, ds.data() + at, ms.data() + at, ms_by_block.data(), stride};
  }
};

// Weight rows read from their blocks as they are, with Unpacked's interface, one block's scale at
// a time: for a lone activation row, where each block is read once and the weights stream from
// memory (unpacking them first would only add a copy, and a group's scales would wait on its
// last block).
template <typename T>
struct BlockRows {
  const typename T::W* w;
  int nb;

  static constexpr int kGroup = 1;
  __m256i q(int32_t r, int b) const { return T::values(w[r * nb + b]); }
  float m(int32_t r, int b) const { return fp16_to_fp32(w[r * nb + b].m); }
  void scales(int32_t r, int b, const Unpacked& x, int32_t xr, float* out) const {
    out[0] = fp16_to_fp32(w[r * nb + b].d) * x.d(xr, b);
  }
};

// K weight rows against R activation rows, block by block. The integer lanes are the scalar
// reference's: an offset comes off as offset·Σx per lane of 4 products (exact, and cheaper than
// moving signs). Every result
// takes its float sums in the reference's order: per block one fused multiply-add per lane with
// the scale wd·xd, the minimum's sum apart, the lanes added last. The scales are read as
// broadcasts from memory: the accumulators want the registers.
template <typename T, int K, int R, typename WRows>
void tile32(const WRows w, const Unpacked x, int nb, float* out) {
  constexpr bool kMin = std::is_same_v<typename T::A, BlockQ8_1>;
  constexpr int G = WRows::kGroup;
  __m256 acc[R][K];
  __m128 sum_min[R][K];  // in lane 0: as a float, the compiler would pack them into an integer register
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) {
      acc[r][k] = _mm256_setzero_ps();
      sum_min[r][k] = _mm_setzero_ps();
    }
  }
  for (int b0 = 0; b0 < nb; b0 += G) {
    alignas(32) float scale[R][K][G];
    for (int k = 0; k < K; ++k)
      for (int r = 0; r < R; ++r) w.scales(k, b0, x, r, scale[r][k]);
    const int n = nb - b0 < G ? nb - b0 : G;
    for (int i = 0; i < n; ++i) {
      const int b = b0 + i;
      for (int r = 0; r < R; ++r) {
        const __m256i qx = x.q(r, b);
        // offset·(x_4i + ... + x_4i+3) in int32 lane i
        const __m256i off = T::kOffset ? dot4_u8s8(_mm256_set1_epi8(T::kOffset), qx) : _mm256_setzero_si256();
        for (int k = 0; k < K; ++k) {
          const __m256i qw = w.q(k, b);
          __m256i sums;
          if constexpr (T::kSigned) {
            sums = dot4_u8s8(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
          } else {
            sums = dot4_u8s8(qw, qx);
            if constexpr (T::kOffset != 0) sums = _mm256_sub_epi32(sums, off);
          }
          if constexpr (kMin) sum_min[r][k] = _mm_fmadd_ss(_mm_set_ss(w.m(k, b)), _mm_set_ss(x.m(r, b)), sum_min[r][k]);
          const __m256 lanes = _mm256_cvtepi32_ps(sums);
          acc[r][k] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scale[r][k][i]), lanes, acc[r][k]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) {
      out[r * K + k] = kMin ? sum_lanes_avx2(acc[r][k]) + _mm_cvtss_f32(sum_min[r][k]) : sum_lanes_avx2(acc[r][k]);
    }
  }
}

// tile32 over unpacked rows, written out for the compiler: each row's pointers held apart, each
// block's activation rows loaded once and each weight row once for all of them, the minimum's
// sums 4 weight rows to a vector, and a whole group's scales wd·xd formed before its 8 blocks.
// The same arithmetic, in the same order, as tile32.
template <typename T, int K, int R>
void tile_unpacked(const Unpacked w, const Unpacked x, int nb, float* out) {
  const __m256i* wq[K];
  const float* wd[K];
  const __m256i* xq[R];
  const float* xd[R];
  const float* xm[R];
  for (int k = 0; k < K; ++k) {
    wq[k] = reinterpret_cast<const __m256i*>(w.qs + static_cast<size_t>(k) * w.stride);
    wd[k] = w.ds + static_cast<size_t>(k) * w.stride;
  }
  for (int r = 0; r < R; ++r) {
    xq[r] = reinterpret_cast<const __m256i*>(x.qs + static_cast<size_t>(r) * x.stride);
    xd[r] = x.ds + static_cast<size_t>(r) * x.stride;
    xm[r] = x.ms + static_cast<size_t>(r) * x.stride;
  }
  constexpr bool kMin = std::is_same_v<typename T::A, BlockQ8_1>;
  __m128 mins[R];  // lane k: Σ_b m_w[k][b]·s_x[r][b], the reference's chain in block order
  for (int r = 0; r < R; ++r) mins[r] = _mm_setzero_ps();
  __m256 acc[R][K];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) acc[r][k] = _mm256_setzero_ps();
  // One block's products into the accumulators, with its scales wd·xd in scale(r, k).
  const auto block = [&](int b, auto scale) __attribute__((always_inline)) {
    if constexpr (kMin) {
      const __m128 m = _mm_load_ps(w.ms_by_block + 4 * b);
      for (int r = 0; r < R; ++r) mins[r] = _mm_fmadd_ps(m, _mm_set1_ps(xm[r][b]), mins[r]);
    }
    // −offset·(x_4i + ... + x_4i+3) in int32 lane i, where the products start
    __m256i qx[R], minus_off[R];
    for (int r = 0; r < R; ++r) {
      qx[r] = _mm256_load_si256(xq[r] + b);
      minus_off[r] = T::kUnpackedOffset ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                                           dot4_u8s8(_mm256_set1_epi8(static_cast<char>(T::kUnpackedOffset)), qx[r]))
                                        : _mm256_setzero_si256();
    }
    for (int k = 0; k < K; ++k) {
      const __m256i qw = _mm256_load_si256(wq[k] + b);
      for (int r = 0; r < R; ++r) {
        __m256i sums;
        if constexpr (T::kUnpackedSigned) sums = dot4_u8s8(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx[r], qw));
        else sums = dot4_u8s8_add(minus_off[r], qw, qx[r]);
        const __m256 lanes = _mm256_cvtepi32_ps(sums);
        acc[r][k] = _mm256_fmadd_ps(_mm256_set1_ps(scale(r, k)), lanes, acc[r][k]);
      }
    }
  };
  // Whole groups of 8 blocks, their scales formed first, then the blocks left one by one.
  const int whole = nb & ~(Unpacked::kGroup - 1);
  for (int b0 = 0; b0 < whole; b0 += Unpacked::kGroup) {
    alignas(32) float scale[R][K][Unpacked::kGroup];
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < K; ++k)
        _mm256_store_ps(scale[r][k], _mm256_mul_ps(_mm256_loadu_ps(wd[k] + b0), _mm256_loadu_ps(xd[r] + b0)));
#pragma GCC unroll 8
    for (int i = 0; i < Unpacked::kGroup; ++i) block(b0 + i, [&](int r, int k) { return scale[r][k][i]; });
  }
  for (int b = whole; b < nb; ++b) block(b, [&](int r, int k) { return wd[k][b] * xd[r][b]; });
  if constexpr (kMin) {
    alignas(16) float m[R][4];
    for (int r = 0; r < R; ++r) _mm_store_ps(m[r], mins[r]);
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < K; ++k) out[r * K + k] = sum_lanes_avx2(acc[r][k]) + m[r][k];
  } else {
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < K; ++k) out[r * K + k] = sum_lanes_avx2(acc[r][k]);
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define HELIOS_QUANT_AVX512 1
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own warnings call
// uninitialized (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// --- AVX-512: two weight rows in one 512-bit register, the same arithmetic in the same order.
// A block's 8 int32 lanes of row k and of row k+1 sit in the even and the odd dwords of one
// register: the weights interleaved 4 bytes at a time, each 4-byte group of the activations
// twice. One multiply, one conversion and one fused multiply-add then serve two rows, and a
// block's two scales are one 64-bit broadcast from memory. Each dword accumulates exactly the
// chain its ymm lane would, so the results are the ymm tiles' bits (and the scalar reference's).
struct alignas(64) Bytes64 { int8_t v[64]; };

// Weight rows in pairs: pair p's block b holds rows 2p and 2p+1 interleaved by dwords, its
// scales side by side; an odd last row is paired with a copy of itself.
struct PairedRows {
  int stride = 0;
  std::vector<Bytes64> qs;         // [p][b]
  std::vector<float> ds;           // [p][b][2]
  std::vector<float> ms_by_block;  // the minimums of the (up to 8) rows block by block, [b][8]

  template <typename B, typename Values>
  void unpack(const B* blocks, int32_t rows, int nb, Values values) {
    stride = (nb + 7) & ~7;
    const int32_t pairs = (rows + 1) / 2;
    const size_t n = static_cast<size_t>(pairs) * stride;
    if (qs.size() < n) {
      qs.resize(n);
      ds.resize(2 * n);
    }
    for (int32_t p = 0; p < pairs; ++p) {
      const B* r0 = blocks + static_cast<int64_t>(2 * p) * nb;
      const B* r1 = 2 * p + 1 < rows ? r0 + nb : r0;
      const size_t at = static_cast<size_t>(p) * stride;
      for (int b = 0; b < nb; ++b) {
        const __m256i a = values(r0[b]), c = values(r1[b]);
        // dwords a0 c0 a1 c1 ... a7 c7: unpack works per 128-bit half, so order the halves first
        const __m512i lo = _mm512_zextsi256_si512(_mm256_unpacklo_epi32(a, c));
        const __m512i both = _mm512_inserti64x4(lo, _mm256_unpackhi_epi32(a, c), 1);
        _mm512_store_si512(qs[at + b].v, _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), both));
        ds[2 * (at + b)] = fp16_to_fp32(r0[b].d);
        ds[2 * (at + b) + 1] = fp16_to_fp32(r1[b].d);
      }
      for (int b = nb; b < stride; ++b) ds[2 * (at + b)] = ds[2 * (at + b) + 1] = 0;
    }
    if constexpr (requires { blocks[0].m; }) {
      ms_by_block.assign(static_cast<size_t>(stride) * 8, 0.0f);
      for (int32_t r = 0; r < rows && r < 8; ++r)
        for (int b = 0; b < nb; ++b) ms_by_block[8 * b + r] = fp16_to_fp32(blocks[static_cast<int64_t>(r) * nb + b].m);
    }
  }
};

// Activation rows for the paired tiles: each block's 4-byte groups twice, −offset·(their sum)
// twice likewise (the int32 lanes where the products start), the scale d and the sum s.
template <typename T>
struct DoubledRows {
  int stride = 0;
  std::vector<Bytes64> qs, minus_off;  // [r][b]
  std::vector<float> ds, ss;           // [r][b], rows padded to whole groups of 8 blocks

  void unpack(const typename T::A* blocks, int32_t rows, int nb) {
    stride = (nb + 7) & ~7;
    const size_t n = static_cast<size_t>(rows) * stride;
    if (qs.size() < n) {
      qs.resize(n);
      minus_off.resize(n);
      ds.resize(n);
      ss.resize(n);
    }
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int32_t r = 0; r < rows; ++r) {
      const typename T::A* row = blocks + static_cast<int64_t>(r) * nb;
      const size_t at = static_cast<size_t>(r) * stride;
      for (int b = 0; b < nb; ++b) {
        const __m512i q = _mm512_permutexvar_epi32(twice, _mm512_zextsi256_si512(load32(row[b].qs)));
        _mm512_store_si512(qs[at + b].v, q);
        const __m512i off = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(T::kUnpackedOffset)), q);
        _mm512_store_si512(minus_off[at + b].v, _mm512_sub_epi32(_mm512_setzero_si512(), off));
        ds[at + b] = fp16_to_fp32(row[b].d);
        if constexpr (requires { row[b].s; }) ss[at + b] = fp16_to_fp32(row[b].s);
      }
      for (int b = nb; b < stride; ++b) ds[at + b] = ss[at + b] = 0;
    }
  }
};

// 2P weight rows (P pairs, the first KT of them kept) × R activation rows: tile_unpacked's
// arithmetic and order, two rows to a register.
template <typename T, int KT, int R>
void tile_paired(const PairedRows& w, const DoubledRows<T>& x, int32_t xr0, int nb, float* out) {
  static_assert(!T::kUnpackedSigned, "the paired tiles take unsigned weight bytes");
  constexpr int P = (KT + 1) / 2;
  constexpr bool kMin = std::is_same_v<typename T::A, BlockQ8_1>;
  const Bytes64* wq[P];
  const float* wd[P];
  const Bytes64 *xq[R], *xo[R];
  const float *xd[R], *xs[R];
  for (int p = 0; p < P; ++p) {
    wq[p] = w.qs.data() + static_cast<size_t>(p) * w.stride;
    wd[p] = w.ds.data() + 2 * static_cast<size_t>(p) * w.stride;
  }
  for (int r = 0; r < R; ++r) {
    const size_t at = static_cast<size_t>(xr0 + r) * x.stride;
    xq[r] = x.qs.data() + at;
    xo[r] = x.minus_off.data() + at;
    xd[r] = x.ds.data() + at;
    xs[r] = x.ss.data() + at;
  }
  static_assert(KT <= 8, "the minimums' sums keep 8 weight rows to a vector");
  __m256 mins[R];  // lane k: Σ_b m_w[k][b]·s_x[r][b], the reference's chain in block order
  for (int r = 0; r < R; ++r) mins[r] = _mm256_setzero_ps();
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  // One block's products; scale(r, p) points at the block's two scales wd·xd.
  const auto block = [&](int b, auto scale) __attribute__((always_inline)) {
    if constexpr (kMin) {
      const __m256 m = _mm256_loadu_ps(w.ms_by_block.data() + 8 * b);
      for (int r = 0; r < R; ++r) mins[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[r][b]), mins[r]);
    }
    __m512i qx[R], off[R];
    for (int r = 0; r < R; ++r) {
      qx[r] = _mm512_load_si512(xq[r][b].v);
      off[r] = T::kUnpackedOffset ? _mm512_load_si512(xo[r][b].v) : _mm512_setzero_si512();
    }
    for (int p = 0; p < P; ++p) {
      const __m512i qw = _mm512_load_si512(wq[p][b].v);
      for (int r = 0; r < R; ++r) {
        double two;  // the pair's two float scales, broadcast as one 64-bit value
        std::memcpy(&two, scale(r, p), 8);
        const __m512 lanes = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(off[r], qw, qx[r]));
        acc[r][p] = _mm512_fmadd_ps(_mm512_castpd_ps(_mm512_set1_pd(two)), lanes, acc[r][p]);
      }
    }
  };
  // A group of 8 blocks' scales at a time (the rows are padded to whole groups with zero scales).
  const int whole = nb & ~7;
  const auto group = [&](int b0, int n_blocks) __attribute__((always_inline)) {
    alignas(64) float scale[R][P][16];  // [2i + j]: row 2p + j, block b0 + i
    for (int r = 0; r < R; ++r) {
      const __m512 xd2 = _mm512_permutexvar_ps(twice, _mm512_zextps256_ps512(_mm256_loadu_ps(xd[r] + b0)));
      for (int p = 0; p < P; ++p) _mm512_store_ps(scale[r][p], _mm512_mul_ps(_mm512_loadu_ps(wd[p] + 2 * b0), xd2));
    }
    // the scales stay in memory, where each pair of them is one broadcast load, rather than in
    // registers the compiler would have to shuffle them out of
    asm volatile("" ::: "memory");
    if (n_blocks == 8) {
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) block(b0 + i, [&](int r, int p) { return &scale[r][p][2 * i]; });
    } else {
      for (int i = 0; i < n_blocks; ++i) block(b0 + i, [&](int r, int p) { return &scale[r][p][2 * i]; });
    }
  };
  for (int b0 = 0; b0 < whole; b0 += 8) group(b0, 8);
  if (whole < nb) group(whole, nb - whole);
  alignas(32) float m[R][8];
  if constexpr (kMin)
    for (int r = 0; r < R; ++r) _mm256_store_ps(m[r], mins[r]);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      const __m512 split = _mm512_permutexvar_ps(even, acc[r][p]);  // row 2p's lanes, then 2p+1's
      for (int j = 0; j < 2 && 2 * p + j < KT; ++j) {
        const float dot = quant::sum_lanes_avx2(j == 0 ? _mm512_castps512_ps256(split) : _mm512_extractf32x8_ps(split, 1));
        out[r * KT + 2 * p + j] = kMin ? dot + m[r][2 * p + j] : dot;
      }
    }
  }
}

// Tiles of 8 weight rows × 4 activation rows, paired, over chunks of activation rows that stay in
// L2: the tile's loads (activations, offsets, weights, scales) are what bound it, and 4 pairs × 4
// rows of accumulators fill most of the 32 registers.
template <typename T>
void matmul_paired(const typename T::W* wb, const typename T::A* xb, int nb, int32_t n_rows, int32_t n_out,
                   int32_t out_begin, int32_t out_end, float* y) {
  constexpr int K = 8, R = 4;
  thread_local DoubledRows<T> xs;
  thread_local PairedRows ws;
  const int32_t chunk = quant::row_chunk(static_cast<int64_t>(nb) * (2 * sizeof(Bytes64) + 8), R);
  for (int32_t r0 = 0; r0 < n_rows; r0 += chunk) {
    const int32_t r1 = n_rows - r0 < chunk ? n_rows : r0 + chunk;
    xs.unpack(xb + static_cast<int64_t>(r0) * nb, r1 - r0, nb);
    quant::walk_tiles<K, R>(
        out_begin, out_end, r0, r1, [&](int32_t o, int k) { ws.unpack(wb + static_cast<int64_t>(o) * nb, k, nb, T::unpacked_values); },
        [&]<int KT, int RT>(int32_t o, int32_t r) {
          float v[RT * KT];
          tile_paired<T, KT, RT>(ws, xs, r - r0, nb, v);
          quant::store_tile<KT, RT>(v, o, r, n_out, y);
        });
  }
}
#pragma GCC diagnostic pop
#endif

// Tiles of 4 weight rows × 2 activation rows over unpacked rows: the activations unpacked once
// per chunk, each group of weight rows once per chunk. A small batch (decode) takes the weights
// as they stream in instead, one row at a time (interleaved rows defeat the prefetchers, and
// unpacking them first would not overlap the reads with the products).
template <typename T>
void matmul_avx2(const void* w, const void* xq, int nb, int32_t n_rows, int32_t n_out, int32_t out_begin,
                 int32_t out_end, float* y) {
  constexpr int K = 4, R = 2;
  constexpr int32_t kStreamRows = R;
  thread_local UnpackedRows xs, ws;
  const auto* wb = static_cast<const typename T::W*>(w);
  const auto* xb = static_cast<const typename T::A*>(xq);
  const auto x_values = [](const typename T::A& b) { return load32(b.qs); };
  if (n_rows <= kStreamRows) {
    xs.unpack(xb, n_rows, nb, x_values);
    quant::walk_tiles<1, R>(out_begin, out_end, 0, n_rows, [](int32_t, int) {}, [&]<int KT, int RT>(int32_t o, int32_t r) {
      float v[RT];
      tile32<T, 1, RT>(BlockRows<T>{wb + static_cast<int64_t>(o) * nb, nb}, xs.from(r), nb, v);
      quant::store_tile<1, RT>(v, o, r, n_out, y);
    });
    return;
  }
#if HELIOS_QUANT_AVX512
  if (n_rows >= quant::kPairedMinRows) return matmul_paired<T>(wb, xb, nb, n_rows, n_out, out_begin, out_end, y);
#endif
  const int32_t chunk = quant::row_chunk(static_cast<int64_t>(nb) * (sizeof(Unpacked::Bytes) + 8), R);
  for (int32_t r0 = 0; r0 < n_rows; r0 += chunk) {
    const int32_t r1 = n_rows - r0 < chunk ? n_rows : r0 + chunk;
    xs.unpack(xb + static_cast<int64_t>(r0) * nb, r1 - r0, nb, x_values);
    quant::walk_tiles<K, R>(
        out_begin, out_end, r0, r1, [&](int32_t o, int k) { ws.unpack(wb + static_cast<int64_t>(o) * nb, k, nb, T::unpacked_values); },
        [&]<int KT, int RT>(int32_t o, int32_t r) {
          float v[RT * KT];
          tile_unpacked<T, KT, RT>(ws.from(0), xs.from(r - r0), nb, v);
          quant::store_tile<KT, RT>(v, o, r, n_out, y);
        });
  }
}
#endif

template <typename W, typename A, float (*F)(const W*, const A*, int)>
void matmul_scalar(const void* w, const void* xq, int nb, int32_t n_rows, int32_t n_out, int32_t out_begin,
                   int32_t out_end, float* y) {
  quant::matmul_tiles<W, A, 1, 1>(quant::ScalarDot<W, A, F>{}, w, xq, nb, n_rows, n_out, out_begin, out_end, y);
}

void matmul(uint32_t type, bool vector, const void* w, const void* xq, int32_t n_rows, int32_t n_in,
            int32_t n_out, int32_t out_begin, int32_t out_end, float* y) {
  const int nb = n_in / block_values(type);
  if (quant::matmul_k_quant(type, vector, w, xq, nb, n_rows, n_out, out_begin, out_end, y)) return;
  void (*run)(const void*, const void*, int, int32_t, int32_t, int32_t, int32_t, float*) = nullptr;
#if HELIOS_QUANT_AVX2
  if (vector) {
    switch (type) {
      case kWeightQ4_0: run = matmul_avx2<Q4_0Avx2>; break;
      case kWeightQ4_1: run = matmul_avx2<Q4_1Avx2>; break;
      case kWeightQ5_0: run = matmul_avx2<Q5_0Avx2>; break;
      case kWeightQ5_1: run = matmul_avx2<Q5_1Avx2>; break;
      default: run = matmul_avx2<Q8_0Avx2>; break;
    }
  }
#endif
  if (!run) {
    switch (type) {
      case kWeightQ4_0: run = matmul_scalar<BlockQ4_0, BlockQ8_0, dot_q4_0>; break;
      case kWeightQ4_1: run = matmul_scalar<BlockQ4_1, BlockQ8_1, dot_q4_1>; break;
      case kWeightQ5_0: run = matmul_scalar<BlockQ5_0, BlockQ8_0, dot_q5_0>; break;
      case kWeightQ5_1: run = matmul_scalar<BlockQ5_1, BlockQ8_1, dot_q5_1>; break;
      default: run = matmul_scalar<BlockQ8_0, BlockQ8_0, dot_q8_0>; break;
    }
  }
  run(w, xq, nb, n_rows, n_out, out_begin, out_end, y);
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

namespace {

void quantize_activations(uint32_t weight_type, bool vector, const float* x, int32_t n_rows, int32_t n_in, void* xq) {
  const int nb = n_in / block_values(weight_type);
  auto quantize_block = quantize_block_scalar;
#if HELIOS_QUANT_AVX2
  if (vector) quantize_block = quantize_block_avx2;
#endif
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * n_in;
    if (is_k_quant(weight_type)) {
      quant::quantize_q8_k(xr, static_cast<BlockQ8_K*>(xq) + static_cast<int64_t>(r) * nb, nb, vector);
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

}  // namespace

void ref_quantize_activations(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in, void* xq) {
  quantize_activations(weight_type, true, x, n_rows, n_in, xq);
}

void ref_quantize_activations_scalar(uint32_t weight_type, const float* x, int32_t n_rows, int32_t n_in,
                                     void* xq) {
  quantize_activations(weight_type, false, x, n_rows, n_in, xq);
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
